"""analysis.distributions.final_summaries: the figures of PooledDistribution.summary, in the memory
of the values held once (issue 20: peak RSS of the closing summary)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from bench_llm.analysis.distributions import PooledDistribution, final_summaries

PS = (50, 90, 95, 99, 99.9)


def _pooled(limit: int, parts: list[np.ndarray]) -> tuple[PooledDistribution, PooledDistribution, PooledDistribution]:
    itl, gap, own = PooledDistribution(limit), PooledDistribution(limit), PooledDistribution(limit)
    for p in parts:
        itl.add(p)
        gap.add(p, same_as=itl)  # the very same arrays (one token per chunk)
        own.add(p * 2.0)
    return itl, gap, own


@pytest.mark.parametrize("limit", [10**9, 1000])  # exact, and histogram past the limit
def test_same_figures_as_summary_and_values_consumed(limit: int) -> None:
    rng = np.random.default_rng(1)
    parts = [rng.gamma(2.0, 5.0, 700) for _ in range(5)]
    want = [d.summary(PS) for d in _pooled(limit, parts)]
    dists = list(_pooled(limit, parts))
    got = final_summaries(dists, PS)
    assert got == want  # bit for bit: mean and percentiles
    assert got[0] == got[1] and got[2] != got[0]
    if limit > 3500:
        with pytest.raises(ValueError):
            dists[0].values()


def test_exact_values_held_once() -> None:
    parts = [np.random.default_rng(k).random(250_000) for k in range(8)]  # 16 MB in all
    dists = list(_pooled(10**9, parts))
    del parts
    held = sum(p.nbytes for p in dists[0]._parts) + sum(p.nbytes for p in dists[2]._parts)
    tracemalloc.start()
    try:
        final_summaries(dists, PS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # summary() holds a concatenation, a NaN-free copy and numpy's sorted copy beside the parts
    # (3x the values of one distribution); here one gathered array, partitioned in place
    assert peak < 0.6 * held, (peak, held)
