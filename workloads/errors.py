"""The workload layer's one error type."""

from __future__ import annotations

from bench_llm.core.errors import SettingError


class WorkloadError(SettingError):
    """A workload that makes no sense, or a malformed trace file; the message is one line and
    names settings as ``$name`` (``core.errors.SettingError``), not as CLI flags."""
