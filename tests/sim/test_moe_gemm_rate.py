"""The expert-GEMM ceiling by FP8 scaling and GPU (issue 35: the Mixtral FP8 regression).

The Hopper-fitted 90 TFLOP/s ceiling (vLLM's 2024 BF16 Triton fused-MoE kernel) applies to BF16 experts and,
on vLLM, to block-scaled FP8 experts (DeepSeek's 128x128 blocks); per-tensor FP8 experts (Mixtral FP8
checkpoints) run at the dense FP8 rate, and a GPU without wgmma (A100) at its own dense rate."""

from __future__ import annotations

import dataclasses

import pytest

from bench_llm.sim.backend import Arrival, ModelBackend, simulate
from bench_llm.sim.costmodel import CostModel, Parallel
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.presets import GPUS, MODELS, PROFILES, Dtype


def _step_s(model: str, gpu: str, dtype: Dtype, tp: int, tokens: int, profile: str = "vllm",
            capped: bool = True) -> float:
    prof = PROFILES[profile]
    if not capped:
        prof = dataclasses.replace(prof, moe_gemm_tflops=0.0, moe_gemm_tflops_fp8=0.0)
    cm = CostModel(MODELS[model], GPUS[gpu], prof, Parallel(tp=tp), dtype)
    return cm.step([(tokens, 0)], 0, 0).latency_s


def test_per_tensor_fp8_experts_run_at_the_dense_fp8_rate_block_fp8_ones_keep_the_ceiling() -> None:
    assert not MODELS["mixtral-8x7b"].fp8_block_scaled and MODELS["deepseek-v3"].fp8_block_scaled
    assert PROFILES["vllm"].moe_gemm_tflops_fp8 > 0  # the ceiling is still there for block-scaled experts
    # Mixtral FP8 on H100: a large prefill step costs what it costs without any ceiling
    assert _step_s("mixtral-8x7b", "h100", "fp8", 2, 8192) == pytest.approx(
        _step_s("mixtral-8x7b", "h100", "fp8", 2, 8192, capped=False))
    # DeepSeek FP8 on vLLM (the vllm#25049 row needs it): capped, much slower than uncapped
    assert _step_s("deepseek-v3", "h200", "fp8", 8, 8192) > 2.0 * _step_s("deepseek-v3", "h200", "fp8", 8, 8192,
                                                                          capped=False)
    # BF16 Mixtral on Hopper keeps the fitted ceiling (the vLLM CI H200 throughput row)
    assert _step_s("mixtral-8x7b", "h200", "bf16", 2, 8192) > 2.0 * _step_s("mixtral-8x7b", "h200", "bf16", 2,
                                                                            8192, capped=False)


def test_a_gpu_without_wgmma_runs_the_triton_kernel_at_its_dense_rate() -> None:
    assert not GPUS["a100"].wgmma and GPUS["h100"].wgmma and GPUS["h200"].wgmma
    assert _step_s("mixtral-8x7b", "a100", "bf16", 2, 8192) == pytest.approx(
        _step_s("mixtral-8x7b", "a100", "bf16", 2, 8192, capped=False))


def _offline_tok_s(timing: ModelTiming, n: int) -> float:
    outs = simulate(ModelBackend(timing), [Arrival(0.0, 1000, 1000) for _ in range(n)])
    return sum(len(o.token_ns) for o in outs) / (max(o.token_ns[-1] for o in outs) / 1e9)


def test_mixtral_fp8_tp2_h100_offline_throughput_is_no_longer_capped() -> None:
    # 1000 requests of 1000/1000 at once, FP8 weights and KV, the default (vllm) profile: 2 880 output tok/s
    # with the ceiling on per-tensor experts (0.19x of the figure the simulator matched before the ceiling)
    t = ModelTiming("mixtral-8x7b", "h100", "fp8", kv_dtype="fp8", tp=2, enable_prefix_caching=False)
    assert _offline_tok_s(t, 1000) > 12000
