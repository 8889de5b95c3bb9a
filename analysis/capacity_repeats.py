"""The capacity interval from independent repeats: what moves a capacity between identical
questions (docs/sweeps.md, Capacity and its interval).

One capacity search answers with one workload seed. Another seed's search meets other
arrivals and other bursts of long requests, and, near the knee, other undecided loads and
other confirmations, so it stops elsewhere. The per-load attainment intervals cannot see that
(they cover sampling inside one load, not how a whole search moves). So the sweep repeats the
search with fresh workload seeds (``capacity_repeats``: 2 in virtual time, where it costs CPU
only) and the interval is a **prediction interval** for another seed's capacity, from the
main search's capacity and the repeats' (Student's t, n − 1 degrees of freedom):

    mean ± t(1 − (1 − level)/2, n − 1) · s · √(1 + 1/n),   s² = sample variance + w²/12

``w`` is the search's resolution (its precision × the mean capacity): a capacity is known
only to its bracket, and n equal answers on one bisection grid must not make a zero-wide
interval. Each repeat is the whole search (the one-at-a-time baseline reused): bracketing,
bisection, re-measurements of undecided loads and the confirmation, with its own seeds, so
its answer moves as another user's run of the same question would.

The repeats' loads are stored beside the cell's points (``repeat_points_files``), so
``bench recommend`` recomputes the repeats' capacities, and the interval, from Parquet.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from statistics import NormalDist

import pandas as pd

from bench_llm.analysis.capacity import Probe, capacity_from_probes
from bench_llm.analysis.recommend_pooling import pooled_loads, rate_probes
from bench_llm.analysis.recommend_types import CellCapacity
from bench_llm.results.reader import read_parquet_file
from bench_llm.results.sweep_layout import CELL_PREFIX

#: Two-sided level of the capacity interval: another seed's capacity falls inside it with
#: this probability (measured: docs/sweeps.md).
INTERVAL_LEVEL = 0.90
#: A repeat search's points, beside the cell's ``points.parquet`` (k = 1, 2, ...).
REPEAT_POINTS = "repeat-{k}-points.parquet"
_REPEAT_RE = re.compile(r"repeat-(\d+)-points\.parquet$")


@dataclass(frozen=True)
class RepeatInterval:
    """Another seed's capacity lies in [low, high) with probability ``level``, from
    ``capacities`` (the main search's first, then each repeat's) and the search's resolution."""

    capacities: tuple[float, ...]
    low: float
    high: float
    level: float
    resolution: float

    @property
    def n(self) -> int:
        return len(self.capacities)

    def text(self) -> str:
        caps = ", ".join(f"{c:g}" for c in self.capacities)
        return (
            f"capacity over {self.n} workload seeds: {caps} req/s; {100 * self.level:.0f}% interval for "
            f"another seed's capacity [{self.low:.4g}, {self.high:.4g}) req/s"
        )


@lru_cache(maxsize=64)
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (one-sided probability ``p`` in (0.5, 1)), by bisection on its CDF
    (numerically integrated density): no SciPy."""
    if df < 1 or not 0.5 < p < 1:
        raise ValueError("t_quantile: need df >= 1 and 0.5 < p < 1")
    if df > 200:
        return NormalDist().inv_cdf(p)
    const = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def upper_tail(x: float) -> float:
        # P(T > x) = ∫_x^∞ f; substitute t = x + u/(1-u) to integrate over u in [0, 1)
        steps = 2000
        total = 0.0
        for i in range(steps):
            u = (i + 0.5) / steps
            t = x + u / (1 - u)
            total += const * (1 + t * t / df) ** (-(df + 1) / 2) / (1 - u) ** 2
        return total / steps

    lo, hi = 0.0, 1000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if upper_tail(mid) > 1 - p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def prediction_interval(
    capacities: list[float] | tuple[float, ...], precision: float, level: float = INTERVAL_LEVEL
) -> RepeatInterval | None:
    """The interval for another seed's capacity from ``capacities`` (at least two), or None."""
    caps = tuple(float(c) for c in capacities if c is not None and math.isfinite(c))
    if len(caps) < 2:
        return None
    n = len(caps)
    mean = sum(caps) / n
    var = sum((c - mean) ** 2 for c in caps) / (n - 1)
    res = (precision if math.isfinite(precision) and precision > 0 else 0.0) * mean
    half = t_quantile(0.5 + level / 2, n - 1) * math.sqrt(var + res * res / 12) * math.sqrt(1 + 1 / n)
    return RepeatInterval(caps, _sig(max(0.0, mean - half)), _sig(mean + half), level, res)


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def repeat_points_files(sweep: Path, cell_id: str) -> dict[int, Path]:
    """k -> the k-th repeat search's points file of a cell."""
    out = {}
    for f in (Path(sweep) / f"{CELL_PREFIX}{cell_id}").glob("repeat-*-points.parquet"):
        m = _REPEAT_RE.search(f.name)
        if m:
            out[int(m.group(1))] = f
    return dict(sorted(out.items()))


def load_repeat_points(sweep: Path) -> pd.DataFrame:
    """Every repeat search's points of the sweep, with ``capacity_repeat`` = k."""
    frames = []
    for cell in sorted(Path(sweep).glob(f"{CELL_PREFIX}*")):
        for k, f in repeat_points_files(Path(sweep), cell.name[len(CELL_PREFIX) :]).items():
            df = read_parquet_file(f).to_pandas()
            df["capacity_repeat"] = k
            frames.append(df)
    return pd.concat(frames, ignore_index=True, sort=False) if frames else pd.DataFrame()


def repeat_capacity(probes: list[Probe], precision: float) -> float | None:
    """One repeat search's capacity, from its own probes."""
    return capacity_from_probes(probes, precision).capacity_rps


def with_repeats(
    capacity: float | None,
    low: float | None,
    high: float | None,
    repeat_caps: list[float | None],
    precision: float | None,
) -> tuple[float | None, float | None, RepeatInterval | None]:
    """(interval low, interval high, the repeats' interval) of a capacity: from the repeats when
    there are any (and a capacity), else the one search's margin-decided ``low``, ``high``."""
    if capacity is None or not repeat_caps:
        return low, high, None
    got = prediction_interval([capacity, *(c for c in repeat_caps if c is not None)], precision or 0.0)
    if got is None:
        return low, high, None
    return got.low, got.high, got


def cell_interval(cap: CellCapacity, repeats: pd.DataFrame, attainment_pct: float, level: float) -> CellCapacity:
    """A cell's capacity with its interval from its repeat searches' points (``capacity_repeat``
    = k; ``load_repeat_points``), recomputed as the sweep did; unchanged without repeats."""
    if cap.kind != "rate" or cap.capacity_rps is None or repeats.empty:
        return cap
    precision = cap.precision if cap.precision else 0.0
    caps: list[float | None] = []
    for _, rows in repeats.groupby("capacity_repeat", sort=True):
        caps.append(repeat_capacity(rate_probes(pooled_loads(rows, attainment_pct, level)), precision))
    low, high, got = with_repeats(cap.capacity_rps, cap.interval_low_rps, cap.interval_high_rps, caps, precision)
    if got is None:
        return cap
    return replace(cap, interval_low_rps=low, interval_high_rps=high, interval_seeds=got.n)


__all__ = [
    "cell_interval",
    "INTERVAL_LEVEL",
    "REPEAT_POINTS",
    "RepeatInterval",
    "load_repeat_points",
    "prediction_interval",
    "repeat_capacity",
    "repeat_points_files",
    "t_quantile",
    "with_repeats",
]
