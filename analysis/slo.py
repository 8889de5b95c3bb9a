"""Service-level objectives: parsing and checking."""

from __future__ import annotations

from dataclasses import dataclass

from bench_llm.core.errors import BenchError
from bench_llm.core.pairs import split_pairs

#: SLO name -> per-request metric column (milliseconds).
SLO_METRICS = {
    "ttft_ms": "ttft_ms",
    "ttfo_ms": "ttfo_ms",
    "tpot_ms": "tpot_ms",
    "e2e_ms": "e2e_ms",
    "itl_max_ms": "max_itl_ms",
}

#: Job SLO name -> per-job metric column (milliseconds; analysis/jobs.py): a job meets the SLO
#: when it succeeded and met every job bound, judged with the same rule as requests.
JOB_SLO_METRICS = {
    "job_ms": "job_ms",
    "job_ttft_ms": "job_ttft_ms",
}


class SLOError(BenchError, ValueError):
    """An SLO specification that cannot be read."""


@dataclass(frozen=True, slots=True)
class SLO:
    """Upper bounds in milliseconds; a request meets the SLO when it meets every bound."""

    limits: tuple[tuple[str, float], ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> "SLO":
        """Parse ``ttft_ms=500,tpot_ms=50``. Raises SLOError with a one-line message."""
        if not text:
            return cls()
        limits: dict[str, float] = {}
        for part, key, value in split_pairs(text):
            if value is None:
                raise SLOError(f"SLO {part!r}: expected name=value, e.g. ttft_ms=500")
            if key not in SLO_METRICS and key not in JOB_SLO_METRICS:
                raise SLOError(f"SLO {key!r}: unknown; use one of {', '.join([*SLO_METRICS, *JOB_SLO_METRICS])}")
            try:
                v = float(value)
            except ValueError:
                raise SLOError(f"SLO {key}: {value.strip()!r} is not a number") from None
            if not v > 0 or v != v or v == float("inf"):
                raise SLOError(f"SLO {key}: must be a positive, finite number of milliseconds")
            limits[key] = v
        return cls(tuple(limits.items()))

    @classmethod
    def from_dict(cls, d: dict[str, float]) -> "SLO":
        return cls.parse(",".join(f"{k}={v}" for k, v in d.items()))

    def __bool__(self) -> bool:
        return bool(self.limits)

    @property
    def request_limits(self) -> tuple[tuple[str, float], ...]:
        """The bounds on each request (the job bounds left out)."""
        return tuple((k, v) for k, v in self.limits if k in SLO_METRICS)

    @property
    def job_limits(self) -> tuple[tuple[str, float], ...]:
        """The bounds on each job (analysis/jobs.py)."""
        return tuple((k, v) for k, v in self.limits if k in JOB_SLO_METRICS)

    def as_dict(self) -> dict[str, float]:
        return dict(self.limits)

    def __str__(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in self.limits) or "none"
