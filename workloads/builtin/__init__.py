"""Fitted built-in workload tables (JSON package data; see workloads/fit.py)."""
