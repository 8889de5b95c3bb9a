"""A load bench's client could not offer truthfully, and the capacity it leaves as a lower bound
(docs/sweeps.md, Untrustworthy loads: client-limited).

The truth rule: a load the client could not measure truthfully never decides anything. A
client saturated (send lag, event-loop lag, CPU or silence: analysis/client_health.py) in
``CLIENT_LIMITED_SHARE`` or more of a run's time windows offered, for most of the run, a load
other than the one named, and stamped its reads late: such a run is **client-limited**. It
neither passes nor fails; the sweep measures it once more with twice the client processes,
and a load still client-limited bounds the capacity search like an undecided one. The capacity
is then a lower bound, "≥ X, client-limited", with the lever that would measure further: more
client processes (``--workers``), or the client on cores of its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bench_llm.analysis.summary_types import ClientHealth
from bench_llm.results.sweep_rows import ClientLimit, PointRow

#: A run whose client was saturated in at least this share of its time windows is client-limited...
CLIENT_LIMITED_SHARE = 0.5
#: ...when it has at least this many windows (a run of a few seconds, one or two windows, is
#: judged by the lag rules alone, analysis/capacity_saturation.untrustworthy: one starved
#: second of a busy host is not a client that cannot offer the load)
CLIENT_LIMITED_MIN_WINDOWS = 5


def client_limited(health: ClientHealth) -> str | None:
    """Why a run is client-limited (None: it is not)."""
    windows = len(health.windows)
    if (
        not health.saturated
        or windows < CLIENT_LIMITED_MIN_WINDOWS
        or health.saturated_windows < CLIENT_LIMITED_SHARE * windows
    ):
        return None
    return f"client-limited: bench's client was saturated in {health.saturated_windows} of {windows} windows"


def untrusted_confirmation(runs: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a load's confirmation could not be measured truthfully (None: it could, or the load
    has none): every ``confirm`` run of it untrustworthy. Such a load does not pass on its
    shorter probe alone: the capacity is never placed at a load its confirmation could not
    measure (docs/sweeps.md, Untrustworthy loads)."""
    confirms = [r for r in runs if r.get("role") == "confirm"]
    if not confirms or not all(r.get("untrustworthy") for r in confirms):
        return None
    return f"its confirmation could not be measured truthfully ({confirms[-1]['untrustworthy']})"


def client_limit_text(limit: ClientLimit, capacity_rps: float | None) -> str:
    """What the sweep prints of a client limit: the capacity as a lower bound, and the lever."""
    cap = f"≥ {capacity_rps:g} req/s" if capacity_rps is not None else "unknown"
    return (
        f"capacity {cap}, client-limited: bench's client could not offer {limit.rate:g} req/s truthfully "
        f"({limit.reason}, with {limit.workers} client process{'es' if limit.workers != 1 else ''}); "
        f"measure further with more client processes (--workers {2 * limit.workers}) or the client on cores "
        "of its own"
    )


def client_limit(
    points: Sequence[PointRow], capacity: float | None, upper: float | None, default_workers: int = 1
) -> ClientLimit | None:
    """The client limit of a capacity search (None: none): its lowest load above ``capacity``
    (``points``: one workload's, ``client_limited`` read from each run's figures) whose every
    run was client-limited, when no load at or below it failed decidedly (``upper``: the
    lowest failed rate)."""
    by_rate: dict[float, list[PointRow]] = {}
    for p in points:
        if p.load.kind == "rate" and p.role != "baseline":
            by_rate.setdefault(float(p.load.value), []).append(p)
    limited = sorted(
        rate
        for rate, runs in by_rate.items()
        if (capacity is None or rate > capacity + 1e-9) and runs and all(p.metrics.get("client_limited") for p in runs)
    )
    if not limited or (upper is not None and upper <= limited[0] + 1e-9):
        return None
    rate = limited[0]
    runs = by_rate[rate]
    workers = max(int(_num(p.metrics.get("client_workers"), default_workers)) for p in runs)
    return ClientLimit(rate, workers, str(runs[-1].metrics["client_limited"]))


def _num(v: Any, default: float) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else default
