"""A cell's capacity searches from what it measured: its loads pooled and judged as the sweep
judges them (``prior_loads``), a search seeded with them (``seeded_capacity_search``), the gap
below a re-judged rate list (``gap_search``) and the loads a re-judged cell still lacks
(``missing_loads``)."""

from __future__ import annotations

import math
from typing import NamedTuple

import pandas as pd

from bench_llm.analysis.capacity import CapacitySearch, Probe
from bench_llm.analysis.recommend_pooling import pooled_loads, rate_probes
from bench_llm.bench.sweep.spec import SweepSpec
from bench_llm.results.sweep_rows import PointRow, point_rows


class PriorLoads(NamedTuple):
    """A cell's measured loads of one workload, pooled and judged as the sweep judges them."""

    probes: tuple[Probe, ...]  # the rate loads, as capacity-search probes
    base_verdict: str | None  # the one-at-a-time baseline's verdict (None: none measured)
    base_attainment: float
    base_e2e_s: float


def prior_loads(spec: SweepSpec, rows: list[PointRow]) -> PriorLoads:
    pooled = pooled_loads(pd.DataFrame(point_rows(rows)), spec.attainment_pct, spec.confidence) if rows else pd.DataFrame()
    if pooled.empty:
        return PriorLoads((), None, math.nan, math.nan)
    base = pooled[pooled["_base"]]
    b = base.iloc[0] if len(base) else None

    def num(key: str) -> float:
        v = b.get(key) if b is not None else None
        return float(v) if v is not None else math.nan

    verdict = b.get("verdict") if b is not None else None
    return PriorLoads(tuple(rate_probes(pooled)), verdict, num("attainment"), num("e2e_p50_ms") / 1000.0)


def seeded_capacity_search(spec: SweepSpec, start: float, base_e2e_s: float, known: list[Probe] | None = None) -> CapacitySearch:
    """A cell's capacity search from ``start``; ``known``: probes measured before (a resumed,
    re-judged cell), from which the search goes on as if it had made them itself."""
    loads = spec.loads
    known = list(known or ())
    return CapacitySearch(
        start=start,
        precision=loads.capacity_precision,
        max_probes=len(known) + loads.capacity_max_probes,
        max_rate=loads.capacity_max_rate,
        # a quarter of the one-at-a-time rate is nearly unloaded: a configuration that
        # passed one at a time but fails there is reported below it rather than probed
        # at ever slower (and ever longer) rates
        min_rate=max(
            loads.capacity_min_rate,
            0.25 / base_e2e_s if math.isfinite(base_e2e_s) and base_e2e_s > 0 else 0.0,
        ),
        probes=known,
    )


#: A re-judged rate list halves below its lowest listed rate down to this fraction of it (a
#: list has no one-at-a-time baseline to say how low "unloaded" is); below that it stays unknown.
GAP_FLOOR = 1 / 8


def gap_search(spec: SweepSpec, probes: list[Probe]) -> CapacitySearch | None:
    """A rate list re-judged so that no listed rate passes: halve below the lowest until one
    passes, at most down to GAP_FLOOR of it (the bracket is the answer; a list sets no
    precision). None: no gap."""
    if not spec.slo or not probes or any(p.passed for p in probes):
        return None
    loads = spec.loads
    lowest = min(p.rate for p in probes)
    return CapacitySearch(
        start=lowest,
        precision=math.inf,
        max_probes=len(probes) + loads.capacity_max_probes,
        max_rate=loads.capacity_max_rate,
        min_rate=max(loads.capacity_min_rate, GAP_FLOOR * lowest),
        probes=list(probes),
    )


def missing_loads(spec: SweepSpec, priors: dict[str, list[PointRow]]) -> list[str]:
    """The next load each workload's re-judged search would probe (empty: the measured loads
    decide every verdict, nothing to measure)."""
    out = []
    for w in spec.cell_workloads:
        judged = prior_loads(spec, priors.get(w.tag) or [])
        search: CapacitySearch | None
        if spec.loads.capacity:
            if judged.base_verdict == "fail":
                continue
            e2e = judged.base_e2e_s
            start = spec.loads.capacity_start or (2.0 / e2e if math.isfinite(e2e) and e2e > 0 else 1.0)
            search = seeded_capacity_search(spec, start, e2e, list(judged.probes))
        else:
            search = gap_search(spec, list(judged.probes))
        rate = search.next_rate() if search is not None else None
        if rate is not None:
            out.append(f"{w.tag} at {rate:g} req/s" if len(spec.cell_workloads) > 1 else f"{rate:g} req/s")
    return out

