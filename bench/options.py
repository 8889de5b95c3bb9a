"""Parsing the analysis options several commands share (--percentiles, --slo).

Kept apart from the commands so that ``bench summary`` and ``bench report`` do not import the
load generator just to parse them.
"""

from __future__ import annotations

from bench_llm.analysis.slo import SLO
from bench_llm.core.errors import BenchError


def parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        ps = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise BenchError(f"--percentiles {text!r}: expected numbers like 50,90,99") from None
    if not ps or any(not 0 <= p <= 100 for p in ps):
        raise BenchError("--percentiles: each value must be between 0 and 100")
    return ps


def parse_slo(text: str | None) -> SLO:
    return SLO.parse(text)
