"""The workload layer's one error type."""

from __future__ import annotations


class WorkloadError(ValueError):
    """A workload that makes no sense, or a malformed trace file; the message is one line."""
