"""The DP router's prefix-aware policy and its load guard (sim/routing.py), in virtual time."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pytest

from bench_llm.sim import backend as backend_module
from bench_llm.sim.backend import ModelBackend
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.routing import CacheAwareGuard, prefix_aware
from bench_llm.sim.virtual import OK, Send, run


@dataclass
class _Pool:
    cached: int
    usage: float

    def lookup(self, hashes: tuple[int, ...], limit_blocks: int) -> int:
        return min(self.cached, limit_blocks)


@dataclass
class _Replica:
    index: int
    load: int
    pool: _Pool


def test_rules_of_the_guard() -> None:
    hashes = tuple(range(10))  # a 160-token prompt in 16-token blocks
    warm = _Replica(0, 5, _Pool(cached=10, usage=0.5))
    cold = _Replica(1, 4, _Pool(cached=0, usage=0.1))
    assert prefix_aware([warm, cold], hashes, 16, 160) is warm  # balanced: the longest prefix
    busy = _Replica(0, 9, _Pool(cached=10, usage=0.5))
    assert prefix_aware([busy, cold], hashes, 16, 160) is cold  # 5 apart (> 4) and 2.25x (> 1.5): least loaded
    short = _Replica(0, 5, _Pool(cached=2, usage=0.5))
    assert prefix_aware([short, cold], hashes, 16, 160) is cold  # 20 % cached < 30 %: least KV in use


def _hot_prefix_sends(n: int = 600, gap_ns: int = 4_000_000) -> list[Send]:
    """Every request starts with the same 2,048-token prefix (one hot system prompt); the first
    goes alone, so one replica holds the prefix when the others arrive (250 requests/s)."""
    hot = tuple(range(1, 129))
    return [Send(2048 + 256, 64, hot + tuple(10_000 + 16 * i + k for k in range(16)),
                 at_ns=0 if i == 0 else 1_000_000_000 + i * gap_ns) for i in range(n)]


def _run(router: str) -> tuple[float, float]:
    """(TTFT p90 in ms, prefix-cache hit rate) of the hot-prefix load at DP 4."""
    backend = ModelBackend(ModelTiming("llama-3.1-8b", "h100", dp=4, router=router))  # type: ignore[arg-type]
    sends = _hot_prefix_sends()
    res = run(backend, sends)
    ttft = [(o.token_ns[0] - o.intended_ns) / 1e6 for o in res.outcomes if o.state == OK]
    assert len(ttft) == len(sends)
    return float(np.percentile(ttft, 90)), backend.prefix_hits / backend.prefix_queries


def test_prefix_aware_does_not_lose_to_round_robin_on_a_hot_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    rr_p90, rr_hit = _run("round-robin")
    pa_p90, pa_hit = _run("prefix-aware")
    assert abs(pa_hit - rr_hit) < 0.05  # the same reuse: every replica caches the hot prefix once
    assert pa_p90 <= 1.1 * rr_p90, (pa_p90, rr_p90)  # (measured: 55.7 ms against 53.1 ms)
    # without the guard, every request piles onto the replica holding the prefix
    unguarded = CacheAwareGuard(balance_abs_threshold=1 << 30)  # (measured: 1,950 ms against 53 ms)
    monkeypatch.setattr(backend_module, "prefix_aware", functools.partial(prefix_aware, guard=unguarded))
    bad_p90, bad_hit = _run("prefix-aware")
    assert bad_p90 > 10 * rr_p90 and abs(bad_hit - rr_hit) < 0.05, (bad_p90, rr_p90)
