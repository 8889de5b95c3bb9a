"""Metrics from the Parquet results alone (never imports loadgen or adapters)."""
