"""Mooncake conversation replay through the simulated engine with prefix caching on.

The engine's hit rate (cached_tokens / prompt_tokens) must match the slice's reusable
prefix fraction computed from hash_ids: the shared blocks become shared prompt text.
A short slice, compressed in time, keeps the test bounded: arrivals at time_scale 0.05
and the engine's step times scaled by 0.2 (``--slowdown``), i.e. the schedule
benchmarks/mooncake_prefix_replay.py replays (time_scale 0.25, engine at speed 1) run five
times faster; the 120 arrivals span about 2 s instead of 10.5 s. The benchmark runs
longer slices and prints the figures.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import benchmark_module, shared_path

pytestmark = pytest.mark.slow


def _bench_module() -> ModuleType:
    return benchmark_module("mooncake_prefix_replay")


@pytest.mark.timeout(240)
def test_prefix_cache_hit_rate_matches_trace_reuse(tmp_path: Path) -> None:
    trace = shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl")
    mod = _bench_module()
    sim = "--timing model --model-preset llama-3.1-8b --gpu h200 --tp 8 --slowdown 0.2".split()
    r = mod.replay(trace, 120, 0.05, sim, tmp_path / "on", timeout_s=180)
    print(r)
    assert r["ok"] == r["requests"] == 120
    assert r["exact_lengths"] == 1.0
    assert r["reusable"] > 0.03
    assert abs(r["hit_rate"] - r["reusable"]) < 0.01, r
