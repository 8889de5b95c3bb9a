"""Mooncake conversation replay through the simulated engine with prefix caching on.

The engine's hit rate (cached_tokens / prompt_tokens) must match the slice's reusable
prefix fraction computed from hash_ids: the shared blocks become shared prompt text.
A short, time-scaled slice keeps the test bounded; benchmarks/mooncake_prefix_replay.py
runs longer slices and prints the figures.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import REPO, shared_path

pytestmark = pytest.mark.slow


def _bench_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("mooncake_prefix_replay", REPO / "benchmarks" / "mooncake_prefix_replay.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(240)
def test_prefix_cache_hit_rate_matches_trace_reuse(tmp_path: Path) -> None:
    trace = shared_path("traces", "mooncake-fast25", "conversation_trace.jsonl")
    mod = _bench_module()
    sim = "--timing model --model-preset llama-3.1-8b --gpu h200 --tp 8".split()
    r = mod.replay(trace, 120, 0.25, sim, tmp_path / "on", timeout_s=180)
    print(r)
    assert r["ok"] == r["requests"] == 120
    assert r["exact_lengths"] == 1.0
    assert r["reusable"] > 0.03
    assert abs(r["hit_rate"] - r["reusable"]) < 0.01, r
