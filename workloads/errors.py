"""The workload layer's one error type."""

from __future__ import annotations

from bench_llm.core.errors import SettingError


class WorkloadError(SettingError):
    """A workload that makes no sense, or a malformed trace file; the message is one line and
    names settings as ``$name`` (``core.errors.SettingError``), not as CLI flags. ``code`` says
    which kind, for callers that branch on it (never on the message's wording)."""

    def __init__(self, template: str, code: str = "invalid") -> None:
        super().__init__(template)
        self.code = code


class TraceWithoutTimestamps(WorkloadError):
    """A trace replayed at its own times that has no timestamps: a rate or a concurrency is needed."""

    def __init__(self, template: str) -> None:
        super().__init__(template, code="no_timestamps")
