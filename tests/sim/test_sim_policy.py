"""Engine profiles carry their scheduling policy, per-layer and per-sequence costs, and a calibration label."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench_llm.sim.backend import Arrival, ModelBackend, simulate
from bench_llm.sim.costmodel import CostModel, Parallel
from bench_llm.sim.options import ModelTiming, describe
from bench_llm.sim.policy import make_policy
from bench_llm.sim.presets import GPUS, MODELS, PROFILES
from bench_llm.sim.scheduler import Batch


def _batches(timing: ModelTiming, arrivals: list[Arrival]) -> list[Batch]:
    """Every step the single instance ran."""
    backend = ModelBackend(timing)
    inst = backend.instances[0]
    seen: list[Batch] = []
    start = inst.start_step

    def record(t: int) -> Batch | None:
        b = start(t)
        if b is not None:
            seen.append(b)
        return b

    inst.start_step = record  # type: ignore[method-assign]
    simulate(backend, arrivals)
    return seen


def _profile(name: str, **kw: object) -> ModelTiming:
    prof = dataclasses.replace(PROFILES["vllm"], policy=name, **kw)  # type: ignore[arg-type]
    return ModelTiming("llama-3.1-8b", "h100", profile_spec=prof, enable_prefix_caching=False)


ARRIVALS = [Arrival(0.0, 200, 300), Arrival(0.2, 3000, 20), Arrival(0.25, 12000, 20), Arrival(0.5, 100, 50)]


def test_v1_mixes_decodes_into_prefill_steps_and_splits_long_prompts() -> None:
    steps = _batches(_profile("v1-chunked"), ARRIVALS)
    assert any(b.prefill_tokens and b.decode_tokens for b in steps)
    assert max(b.prefill_tokens for b in steps) <= 8192  # the 12000-token prompt was chunked


def test_v0_prefill_steps_stall_every_decode_and_take_whole_prompts() -> None:
    steps = _batches(_profile("v0-prefill-first"), ARRIVALS)
    assert not any(b.prefill_tokens and b.decode_tokens for b in steps)
    assert max(b.prefill_tokens for b in steps) >= 12000  # never split, even past the budget


def test_sglang_prefill_first_splits_long_prompts_but_stalls_decodes() -> None:
    steps = _batches(_profile("sglang-prefill-first"), ARRIVALS)
    assert not any(b.prefill_tokens and b.decode_tokens for b in steps)
    assert max(b.prefill_tokens for b in steps) <= 8192


def test_multi_step_scheduling_makes_a_new_prompt_wait_for_the_decode_run() -> None:
    arrivals = [Arrival(0.0, 100, 400), Arrival(0.3, 100, 10)]

    def second_ttft(steps: int) -> float:
        outs = simulate(ModelBackend(_profile("v0-prefill-first", scheduler_steps=steps)), arrivals)
        return outs[1].ttft_s

    one_step = second_ttft(1)
    # up to 10 decode steps (~7 ms each for 8B on H100) before the prefill may start
    assert second_ttft(10) > one_step + 0.01


def test_tgi_waits_for_enough_waiting_requests_or_enough_decode_steps() -> None:
    tgi = make_policy("tgi-waiting-ratio")
    assert tgi.prefill_turn(waiting=1, running=0, in_prefill=0, decode_steps=0)  # nothing runs: prefill
    assert not tgi.prefill_turn(waiting=1, running=10, in_prefill=0, decode_steps=5)
    assert tgi.prefill_turn(waiting=1, running=10, in_prefill=0, decode_steps=20)  # max_waiting_tokens
    assert tgi.prefill_turn(waiting=12, running=10, in_prefill=0, decode_steps=1)  # 12 >= 1.2 x 10
    v0 = make_policy("v0-prefill-first", scheduler_steps=10)
    assert not v0.prefill_turn(waiting=3, running=4, in_prefill=0, decode_steps=3)  # inside a multi-step run
    assert v0.prefill_turn(waiting=3, running=4, in_prefill=0, decode_steps=10)
    with pytest.raises(ValueError, match="unknown scheduling policy"):
        make_policy("fcfs")


def test_moe_mla_and_per_sequence_terms_add_to_a_step() -> None:
    gpu = GPUS["h200"]

    def step_s(model: str, tp: int, **kw: object) -> float:
        prof = dataclasses.replace(PROFILES["vllm"], **kw)  # type: ignore[arg-type]
        cm = CostModel(MODELS[model], gpu, prof, Parallel(tp=tp), "fp8")
        return cm.step([], 4, 4 * 1000).latency_s

    base = step_s("deepseek-v3", 8, moe_layer_us=0.0, mla_layer_us=0.0)
    assert step_s("deepseek-v3", 8, moe_layer_us=100.0, mla_layer_us=0.0) == pytest.approx(base + 58 * 100e-6)
    assert step_s("deepseek-v3", 8, moe_layer_us=0.0, mla_layer_us=100.0) == pytest.approx(base + 61 * 100e-6)
    dense = step_s("llama-3.1-8b", 1, moe_layer_us=0.0, mla_layer_us=0.0)
    assert step_s("llama-3.1-8b", 1, moe_layer_us=100.0, mla_layer_us=100.0) == pytest.approx(dense)
    assert step_s("llama-3.1-8b", 1, per_seq_us=50.0) == pytest.approx(dense + 4 * 50e-6)


def test_a_slow_expert_gemm_ceiling_slows_large_moe_steps_only() -> None:
    gpu = GPUS["h200"]

    def step_s(tokens: int, tflops: float) -> float:
        prof = dataclasses.replace(PROFILES["vllm"], moe_gemm_tflops=tflops)
        return CostModel(MODELS["mixtral-8x7b"], gpu, prof, Parallel(tp=2), "bf16").step([(tokens, 0)], 0, 0).latency_s

    assert step_s(8192, 97.0) > 2.0 * step_s(8192, 0.0)
    assert step_s(1, 97.0) == pytest.approx(step_s(1, 0.0), rel=0.01)


def test_eager_steps_above_the_cuda_graph_limit_take_the_launch_floor() -> None:
    # sglang-2024: decode batches above 160 (SGLang's default CUDA-graph limit) and prefills run eagerly,
    # at least eager_layer_us per layer; a graphed decode batch of 160 does not
    prof = PROFILES["sglang-2024"]
    cm = CostModel(MODELS["deepseek-v3"], GPUS["h200"], prof, Parallel(tp=8), "fp8")
    floor = 61 * prof.eager_layer_us * 1e-6
    assert prof.cuda_graph_max_bs == 160 and floor > 0.1
    graphed, eager, prefill = cm.step([], 160, 160 * 300), cm.step([], 161, 161 * 300), cm.step([(128, 0)], 0, 0)
    assert graphed.parts["eager"] == 0.0 and graphed.latency_s < floor
    assert eager.latency_s >= floor and eager.parts["eager"] > 0.0 and prefill.latency_s >= floor
    assert sum(eager.parts.values()) == pytest.approx(eager.latency_s)
    # every other profile leaves the term out
    vllm = CostModel(MODELS["deepseek-v3"], GPUS["h200"], PROFILES["vllm"], Parallel(tp=8), "fp8")
    assert vllm.step([], 600, 600 * 300).parts["eager"] == 0.0


def test_the_dcp_exchange_grows_with_the_decode_batch() -> None:
    cm = CostModel(MODELS["deepseek-v3"], GPUS["h200"], PROFILES["vllm"], Parallel(tp=8, dcp=8), "fp8")
    one, many = cm.step([], 1, 1000).parts["dcp"], cm.step([], 1024, 1024 * 1000).parts["dcp"]
    # one sequence: two latency-bound collectives per layer (alpha at 8 GPUs: 15 us on H200)
    assert one == pytest.approx(2 * 61 * 15e-6, rel=0.05)
    # 1024 sequences: the query all-gather and the output/LSE exchange move ~150 MB per layer each
    assert many > 10 * one
    assert cm.step([(512, 0)], 0, 0).parts["dcp"] == 0.0


def test_every_result_names_its_profile_policy_and_calibration() -> None:
    info = describe(ModelTiming("llama-3.1-70b", "h100", tp=4, profile="vllm-v0"))
    assert (info["profile"], info["policy"]) == ("vllm-v0", "v0-prefill-first")
    assert "2024" in str(info["era"]) and str(info["calibration"]).startswith("calibrated against")
    ds = describe(ModelTiming("deepseek-v3", "h200", tp=8))
    assert str(ds["calibration"]).startswith("uncalibrated: no published figure backs deepseek-v3 on the vllm")
    assert str(describe(ModelTiming("deepseek-v3", "h200", tp=8, profile="sglang-2024"))["calibration"]).startswith(
        "calibrated")


def test_the_cli_offers_every_profile() -> None:
    from bench_llm.bench.commands.sim import _PROFILES

    assert set(_PROFILES) == set(PROFILES)
    for prof in PROFILES.values():
        prof.scheduling_policy()  # every profile names a known policy


def test_bench_sim_describe_prints_uncalibrated() -> None:
    from click.testing import CliRunner

    from bench_llm.bench.cli import cli

    res = CliRunner().invoke(cli, ["sim", "describe", "--model-preset", "deepseek-v3", "--gpu", "h200", "--tp", "8"])
    assert res.exit_code == 0, res.output
    assert '"calibration": "uncalibrated' in res.output


def test_pipeline_micro_batches_share_the_running_requests() -> None:
    t = ModelTiming("llama-3.1-70b", "h100", tp=1, pp=4, enable_prefix_caching=False)
    steps = _batches(t, [Arrival(0.0, 64, 40) for _ in range(64)])
    # each of the 4 stages gets a quarter of the decodes (vLLM's virtual engines), not one batch of all
    assert max(b.decode_tokens for b in steps) <= 16
    assert sum(1 for b in steps if b.decode_tokens == 16) > 10


def test_a_toml_profile_can_switch_the_policy_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    from bench_llm.sim.options import apply_toml

    good = tmp_path / "v0.toml"
    good.write_text('[profile]\npolicy = "v0-prefill-first"\nscheduler_steps = 8\n')
    t = apply_toml(ModelTiming(), good, {})
    assert t.engine_profile.scheduling_policy().scheduler_steps == 8
    bad = tmp_path / "bad.toml"
    bad.write_text('[profile]\npolicy = "fcfs"\n')
    with pytest.raises(ValueError, match="unknown scheduling policy 'fcfs'; known: v1-chunked"):
        apply_toml(ModelTiming(), bad, {})
