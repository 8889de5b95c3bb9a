"""Launching engines (separate from the request protocol): argv, process group, readiness."""
