"""benchmarks/silicon_bound.py: the busy-time lower bound of a measured row, against hand arithmetic."""

from __future__ import annotations

from types import ModuleType

import pytest

from bench_llm.sim.presets import GPUS, MODELS
from bench_llm.sim.silicon import Point
from tests.conftest import benchmark_module


def _mod() -> ModuleType:
    return benchmark_module("silicon_bound")


def _row(ttft_ms: float, tpot_ms: float, tp: int = 1, isl: int = 4000, osl: int = 100, c: int = 32) -> Point:
    return Point("x", "vllm", "llama-3.1-8b", "agg", isl, osl, c, tp, 1, 1, 0, 0, ttft_ms=ttft_ms, tpot_ms=tpot_ms)


def test_terms_are_the_hand_arithmetic() -> None:
    m = _mod()
    gpu, model = GPUS["h200"], MODELS["llama-3.1-8b"]
    # a cycle of exactly 1 s per stream: 32 requests a second
    b = m.bound(_row(ttft_ms=10.0, tpot_ms=990.0 / 99), model, gpu, 2.0)
    assert b.rate == pytest.approx(32.0)
    matmul = 8.03e9 - 2 * 128256 * 4096  # embedding and LM head left out
    assert b.linear == pytest.approx(32 * 4000 * 2 * matmul / 1979e12)
    assert b.attn == pytest.approx(32 * 32 * 4 * 32 * 128 * 4000 * 4000 / 2 / 989e12)
    kv_token = 32 * 2 * 8 * 128  # elements per token, all layers
    assert b.kv == pytest.approx(32 * 99 * (4000 + 50) * kv_token * 2.0 / 4.8e12)
    assert b.kv_fp8 == pytest.approx(b.kv / 2)
    assert b.total == pytest.approx(b.linear + b.attn + b.kv)


def test_tensor_parallel_divides_each_gpu_share() -> None:
    m = _mod()
    gpu, model = GPUS["h200"], MODELS["llama-3.1-8b"]
    one = m.bound(_row(100.0, 10.0), model, gpu, 2.0)
    four = m.bound(_row(100.0, 10.0, tp=4), model, gpu, 2.0)
    assert four.linear == pytest.approx(one.linear / 4)
    assert four.kv == pytest.approx(one.kv / 4)  # 8 KV heads over 4 GPUs


def test_a_faster_measurement_needs_more_busy_time() -> None:
    m = _mod()
    gpu, model = GPUS["h200"], MODELS["llama-3.1-8b"]
    slow = m.bound(_row(400.0, 30.0), model, gpu, 2.0)
    fast = m.bound(_row(184.29, 11.67), model, gpu, 2.0)  # the measured vLLM 8B 4000/100 C32 TP1 figures
    assert slow.total < 1.0 < fast.total
    assert fast.at_model_rates(gpu) > fast.total
