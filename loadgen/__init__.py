"""Drives schedules through adapters over HTTP, timestamping every streamed chunk."""
