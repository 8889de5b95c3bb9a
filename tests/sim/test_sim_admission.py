"""Per-engine admission limits (KV reserved for output not yet generated, TRT-LLM's batch-size limit)
and disaggregated deployments whose prefill pool has its own layout (issue 35), in virtual time."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from bench_llm.sim.backend import Arrival, ModelBackend, simulate
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.presets import PROFILES
from bench_llm.sim.scheduler import Limits
from bench_llm.sim.virtual import Plan, Send, run
from tests.conftest import benchmark_module


def _peak_running(timing: ModelTiming, n: int, isl: int, osl: int) -> int:
    """The most requests running at once when ``n`` arrive together."""
    backend = ModelBackend(timing)
    peak = 0

    def watch(_req: object, _event: str, _t: int) -> None:
        nonlocal peak
        peak = max(peak, backend.running)

    backend.observer = watch
    simulate(backend, [Arrival(0.0, isl, osl) for _ in range(n)])
    return peak


def _small_kv(profile: str, **extra: object) -> ModelTiming:
    # 8B BF16 on one GPU with a KV cache of ~75,000 tokens: memory sets the limit
    prof = dataclasses.replace(PROFILES[profile], gpu_memory_utilization=0.35, **extra)
    return ModelTiming("llama-3.1-8b", "h100", "bf16", profile_spec=prof, enable_prefix_caching=False)


def test_profiles_carry_each_engines_admission_defaults() -> None:
    vllm, sglang, trt = PROFILES["vllm"], PROFILES["sglang"], PROFILES["trtllm"]
    assert vllm.kv_reserve_ratio == 0.0  # blocks as tokens come; max_num_seqs 1024 on >= 70 GiB GPUs
    assert (sglang.kv_reserve_ratio, sglang.kv_reserve_clip) == (0.098, 4096)  # new_token_ratio floor, CLIP
    assert (trt.kv_reserve_ratio, trt.max_num_seqs) == (1.0, 2048)  # GUARANTEED_NO_EVICT, max_batch_size
    seqs, _, _ = ModelTiming("llama-3.1-8b", "h200", profile="trtllm").limits()
    assert seqs == 2048


def test_reserving_the_whole_output_admits_fewer_and_queues_the_rest() -> None:
    """Long outputs: an engine that reserves every request's whole output (TRT-LLM's default capacity
    policy) runs fewer at once than one that allocates as tokens come (vLLM), and the rest wait."""
    free = _small_kv("vllm")
    reserve = _small_kv("vllm", kv_reserve_ratio=1.0)
    kv_tokens = free.cost_model().kv_tokens()
    n, isl, osl = 64, 256, 2048
    assert n * (isl + osl) > kv_tokens > n * isl * 2  # all prompts fit, all whole outputs do not
    lazy, strict = _peak_running(free, n, isl, osl), _peak_running(reserve, n, isl, osl)
    assert strict < lazy
    assert strict * (isl + osl) <= kv_tokens + (isl + osl)  # (an idle engine admits one whatever it needs)


def test_a_partial_reservation_admits_between_the_two() -> None:
    n, isl, osl = 64, 256, 2048
    lazy = _peak_running(_small_kv("vllm"), n, isl, osl)
    part = _peak_running(_small_kv("vllm", kv_reserve_ratio=0.1, kv_reserve_clip=4096), n, isl, osl)
    full = _peak_running(_small_kv("vllm", kv_reserve_ratio=1.0), n, isl, osl)
    assert full <= part <= lazy and full < lazy


def test_reservation_costs_ttft_in_a_closed_loop() -> None:
    """What the measured rows show as a wait for the first token beyond the running limit."""
    def mean_ttft(timing: ModelTiming) -> float:
        res = run(ModelBackend(timing), [Send(256, 2048) for _ in range(96)], Plan(concurrency=48))
        return sum(o.token_ns[0] - o.intended_ns for o in res.outcomes) / len(res.outcomes) / 1e6

    assert mean_ttft(_small_kv("vllm", kv_reserve_ratio=1.0)) > 2 * mean_ttft(_small_kv("vllm"))


def test_limits_default_to_no_reservation() -> None:
    assert Limits(8, 8192, 16, 100).reserve_ratio == 0.0


# -- prefill pool with its own layout --------------------------------------------------------------
def _disagg(**kw: object) -> ModelTiming:
    return ModelTiming("deepseek-v3", "h200", "fp8", tp=1, dp=8, ep=8, disagg_prefill=1, disagg_decode=1,
                       profile="sglang", enable_prefix_caching=False, router="least-queue", **kw)  # type: ignore[arg-type]


def test_the_prefill_pool_runs_its_own_layout() -> None:
    same, tp8 = _disagg(), _disagg(prefill_tp=8, prefill_dp=1, prefill_ep=1)
    assert tp8.prefill_layout_differs and not same.prefill_layout_differs
    b_same, b_tp8 = ModelBackend(same), ModelBackend(tp8)
    assert len(b_same.prefill_pool) == 8 and len(b_tp8.prefill_pool) == 1  # DP8 ranks vs one TP8 instance
    assert len(b_tp8.decode_pool) == 8
    assert b_tp8.prefill_pool[0].cost.par.tp == 8 and b_tp8.decode_pool[0].cost.par.tp == 1
    assert tp8.gpus == 16 and same.gpus == 16


def test_a_prefill_pool_of_one_instance_queues_long_prompts() -> None:
    """Eight DP ranks prefill eight prompts at once; one TP8 instance takes them in turn (faster each):
    the layout, not only the GPU count, sets P/D TTFT (the 8192-token rows with a TP8 prefill node)."""
    def mean_ttft(timing: ModelTiming) -> float:
        res = simulate(ModelBackend(timing), [Arrival(0.0, 8192, 8) for _ in range(32)])
        return sum(o.ttft_s for o in res) / len(res)

    assert mean_ttft(_disagg(prefill_tp=8, prefill_dp=1, prefill_ep=1)) > 1.1 * mean_ttft(_disagg())


def test_a_prefill_layout_needs_disaggregation() -> None:
    with pytest.raises(ValueError, match="needs disaggregation"):
        ModelTiming("llama-3.1-8b", "h200", prefill_tp=2)
    with pytest.raises(ValueError, match=">= 0"):
        _disagg(prefill_tp=-1)


def test_the_prefill_pool_takes_its_own_batch_limits() -> None:
    """P/D prefill workers run small batches (AIConfigurator's generator: max_batch_size 1, ISL + 1 500
    tokens a step): with one request per step a burst of prompts is prefilled one after another (no step
    carries more than one prompt), and the mean TTFT of 16 prompts arriving together rises above the batched
    pool's, a little: a 1 024-token DeepSeek prefill is compute-bound, batching saves only the weight reads."""
    def run(timing: ModelTiming) -> tuple[float, int]:
        backend = ModelBackend(timing)
        res = simulate(backend, [Arrival(0.0, 1024, 4) for _ in range(16)])
        return sum(o.ttft_s for o in res) / len(res), max(backend.stats.iteration_tokens)

    one = _disagg(prefill_tp=8, prefill_dp=1, prefill_ep=1, prefill_max_num_seqs=1, prefill_max_num_batched_tokens=2528)
    batched = _disagg(prefill_tp=8, prefill_dp=1, prefill_ep=1)
    b = ModelBackend(one)
    assert b.prefill_pool[0].limits.max_num_seqs == 1 and b.prefill_pool[0].limits.max_num_batched_tokens == 2528
    assert b.decode_pool[0].limits.max_num_seqs == ModelBackend(batched).decode_pool[0].limits.max_num_seqs
    (ttft_one, most_one), (ttft_batched, most_batched) = run(one), run(batched)
    assert most_one == 1024 and most_batched >= 2 * 1024
    assert ttft_one > 1.05 * ttft_batched
    with pytest.raises(ValueError, match="need disaggregation"):
        ModelTiming("llama-3.1-8b", "h200", prefill_max_num_seqs=1)
    with pytest.raises(ValueError, match=">= 0"):
        _disagg(prefill_max_num_seqs=-1)


# -- benchmarks/aic_compare.py --------------------------------------------------------------------
def _aic_compare() -> ModuleType:
    return benchmark_module("aic_compare")


def test_aic_compare_skips_cleanly_without_aiconfigurator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec("aiconfigurator") is not None:
        pytest.skip("aiconfigurator is installed here: the skip path cannot be exercised")
    rows = tmp_path / "rows.csv"
    rows.write_text("id,model_path,backend,mode\n")
    assert _aic_compare().main(["estimate", str(tmp_path / "out.json"), "--rows", str(rows)]) == 0
    assert "skipped" in capsys.readouterr().out
    assert not (tmp_path / "out.json").exists()


def test_aic_compare_asks_about_the_bundled_model_at_the_rows_layout() -> None:
    mod = _aic_compare()
    row = {"model_path": "nvidia/Llama-3.1-8B-Instruct-FP8", "mode": "agg", "backend": "vllm", "isl": "1000",
           "osl": "100", "gemm_quant_mode": "fp8", "moe_quant_mode": "", "batch_size": "64", "tp_size": "2",
           "pp_size": "", "attention_dp_size": "", "moe_tp_size": "", "moe_ep_size": ""}
    kw = mod._kwargs(row)
    assert kw["model_path"] == "meta-llama/Meta-Llama-3.1-8B"  # not bundled under its own name
    assert (kw["batch_size"], kw["tp_size"], kw["attention_dp_size"], kw["isl"]) == (64, 2, 1, 1000)
    assert "moe_tp_size" not in kw  # blank columns are left to AIConfigurator's defaults
