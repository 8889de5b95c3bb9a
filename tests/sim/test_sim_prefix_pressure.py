"""Prefix caching under KV pressure: a request left waiting holds no cached blocks (issue 35)."""

from __future__ import annotations

import random

from bench_llm.sim.backend import ModelBackend
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.virtual import OK, Plan, Send, run


def _prompt(pid: int, isl: int) -> tuple[int, ...]:
    return tuple(pid * 1_000_003 + b + 1 for b in range(isl // 16))


def test_repeated_prompts_under_kv_pressure_all_finish() -> None:
    """32 closed-loop streams of 8 192-token prompts drawn from 40 (seeded) on 70B TP1, whose prompts and
    outputs need about twice the KV cache: requests are preempted and put back at the queue's head. Each
    used to keep its prompt's cached blocks while it waited, until the waiting requests held the whole
    cache and nothing ran again (95 of the 128 requests never finished)."""
    timing = ModelTiming("llama-3.1-70b", "h200", "fp8", tp=1, profile="vllm", enable_prefix_caching=True)
    isl, osl, c = 8192, 1024, 32
    assert c * (isl + osl) > 1.5 * timing.cost_model().kv_tokens()
    rng = random.Random(100)
    sends = [Send(isl, osl, _prompt(rng.randrange(40), isl), warmup=i < c) for i in range(4 * c)]
    res = run(ModelBackend(timing), sends, Plan(concurrency=c, warmup_concurrency=c))
    assert [o.state for o in res.outcomes] == [OK] * len(sends)
    assert all(len(o.token_ns) == osl for o in res.outcomes)
    assert any(o.cached_tokens for o in res.outcomes)  # the cache was used
