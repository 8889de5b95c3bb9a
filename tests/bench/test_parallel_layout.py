"""A parallel layout the engine or the model's shape cannot take is refused by name, before
anything runs (core/layout.py, the one home of the rule): EP consumes GPUs the layout has
(vLLM: tp×pcp×dp wide; SGLang: within the TP group; the simulated engine: the instance's
tp×pcp×dp), and TP, PP and EP must fit the model's heads, KV heads, layers and experts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from bench_llm.bench.cli import cli
from bench_llm.bench.commands.sim import build_config, serve
from bench_llm.bench.sweep.dryrun import dry_run_lines
from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec
from bench_llm.core.layout import Layout, ep_problems, layout_problems, shape_problems
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.presets import MODELS, ModelSpec


@pytest.fixture(autouse=True)
def _no_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _spec(engine: str, model: str, matrix: MatrixSpec, gpus: int | None = None) -> SweepSpec:
    spec = SweepSpec(model=model, engine=engine, gpus=gpus, matrix=matrix, loads=LoadSpec(rates=(1.0,)))
    spec.validate()
    return spec


def _heads(lines: list[str]) -> dict[str, str]:
    """cell id -> its header line."""
    return {line[5:].split(":", 1)[0]: line for line in lines if line.startswith("cell ")}


# -- the rule, per engine ------------------------------------------------------------------


def test_each_engine_builds_its_ep_group_from_gpus_the_layout_has() -> None:
    # vLLM: a switch spanning tp×pcp×dp
    assert ep_problems("vllm", Layout(tp=2, dp=2, ep=4)) == []
    (why,) = ep_problems("vllm", Layout(tp=1, ep=8))
    assert "ep=8 needs 8 GPUs" in why and "tp×pcp×dp" in why
    # SGLang: within the TP group (ep divides tp)
    assert ep_problems("sglang", Layout(tp=8, ep=8)) == [] and ep_problems("sglang", Layout(tp=8, ep=2)) == []
    (why,) = ep_problems("sglang", Layout(tp=1, ep=8))
    assert "ep=8 needs 8 GPUs, the TP group has 1" in why
    assert "does not divide tp=4" in ep_problems("sglang", Layout(tp=4, ep=3))[0]
    # the simulated engine: every GPU of the instance
    assert ep_problems("sim", Layout(tp=1, dp=8, ep=8)) == [] and ep_problems("sim", Layout(tp=2, ep=4))
    assert ep_problems("tgi", Layout(tp=2, ep=2)) == ["TGI has no expert parallelism: ep=2"]


def test_the_models_shape_bounds_its_parallel_sizes() -> None:
    llama70, mixtral, llama8 = MODELS["llama-3.1-70b"], MODELS["mixtral-8x7b"], MODELS["llama-3.1-8b"]
    assert shape_problems(Layout(tp=3), llama70) == ["llama-3.1-70b has 64 attention heads: tp must divide them, not 3"]
    assert shape_problems(Layout(tp=8), llama70) == [] and shape_problems(Layout(tp=16), llama70) == []
    toy = ModelSpec("toy", 1.0, 1.0, 4, 64, 48, 12, 2)  # 48 heads, 12 KV heads
    assert "12 KV heads: tp=16" in shape_problems(Layout(tp=16), toy)[0] and shape_problems(Layout(tp=24), toy) == []
    assert "80 layers" in shape_problems(Layout(pp=81), llama70)[0]
    assert "has 8 experts" in shape_problems(Layout(tp=16, ep=16), mixtral)[0]
    assert "not a mixture of experts" in shape_problems(Layout(tp=2, ep=2), llama8)[0]
    assert len(layout_problems("sim", Layout(tp=3, ep=2), llama8)) == 3  # EP width, heads, no experts


# -- the simulated engine and sim describe -------------------------------------------------


def test_the_simulated_engine_refuses_an_ep_group_larger_than_its_gpus() -> None:
    with pytest.raises(ValueError, match=r"ep=8 needs 8 GPUs, the layout has 1"):
        ModelTiming("mixtral-8x7b", tp=1, ep=8)
    with pytest.raises(ValueError, match="64 attention heads"):
        ModelTiming("llama-3.1-70b", tp=3)
    ok = ModelTiming("mixtral-8x7b", tp=2, dp=2, ep=4)
    assert ok.gpus == 4 and ok.gpus >= ok.ep


def test_sim_describe_refuses_tp1_ep8_and_shows_the_expert_layout() -> None:
    runner = CliRunner()
    bad = runner.invoke(cli, ["sim", "describe", "--model-preset", "mixtral-8x7b", "--tp", "1", "--ep", "8"])
    assert bad.exit_code == 2 and "ep=8 needs 8 GPUs" in bad.output, bad.output
    good = runner.invoke(cli, ["sim", "describe", "--model-preset", "mixtral-8x7b", "--tp", "2", "--dp", "2",
                               "--ep", "4", "--expert-imbalance", "1.8"])  # fmt: skip
    assert good.exit_code == 0, good.output
    info = json.loads(good.output)
    assert info["gpus"] == 4 and info["moe"]["ep_group_gpus"] == 4 and info["moe"]["experts_per_gpu"] == 2
    assert info["moe"]["expert_imbalance"] == 1.8 and "busiest" in info["moe"]["step"]
    tp70 = runner.invoke(cli, ["sim", "describe", "--model-preset", "llama-3.1-70b", "--tp", "3"])
    assert tp70.exit_code == 2 and "64 attention heads" in tp70.output


# -- the sweep matrix and the launch plans (dry run: nothing starts) -----------------------


def test_a_mixtral_sweep_on_4_gpus_never_counts_fewer_gpus_than_its_ep_group() -> None:
    spec = _spec("sim", "mixtral-8x7b", MatrixSpec(tp=(1, 2, 4), dp=(1, 2), ep=(1, 2, 4)), gpus=4)
    heads = _heads(dry_run_lines(spec))
    run = {cid: h for cid, h in heads.items() if "skipped" not in h}
    for cid, head in run.items():
        gpus = int(head.split(": ", 1)[1].split(" GPU")[0])
        ep = int(cid.split("ep")[1].split("-")[0]) if "-ep" in cid else 1
        assert gpus >= ep, head
    assert "tp2-ep4" not in run and "ep=4 needs 4 GPUs, the layout has 2" in heads["tp2-ep4"]
    assert "tp1-ep4" not in run and "tp2-dp2-ep4" in run and "tp4-ep4" in run


def test_a_sweep_refuses_tp3_for_a_64_head_model_by_name() -> None:
    heads = _heads(dry_run_lines(_spec("sim", "llama-3.1-70b", MatrixSpec(tp=(2, 3)))))
    assert "skipped" not in heads["tp2"]
    assert "skipped: invalid configuration: llama-3.1-70b has 64 attention heads" in heads["tp3"]


def test_sglang_and_vllm_plans_refuse_an_ep_group_their_engine_cannot_build() -> None:
    sg = dry_run_lines(_spec("sglang", "org/moe", MatrixSpec(tp=(1, 8), ep=(8,))))
    heads = _heads(sg)
    assert "skipped" in heads["tp1-ep8"] and "ep=8 needs 8 GPUs, the TP group has 1" in heads["tp1-ep8"]
    assert "skipped" not in heads["tp8-ep8"] and any("--tp-size 8 --ep-size 8" in line for line in sg)
    vl = _heads(dry_run_lines(_spec("vllm", "org/moe", MatrixSpec(tp=(1, 2), dp=(1, 2), ep=(4,)))))
    assert "skipped" in vl["tp1-ep4"] and "skipped" in vl["tp2-ep4"] and "skipped" not in vl["tp2-dp2-ep4"]


def test_expert_imbalance_is_a_sweep_axis_on_the_simulated_engine() -> None:
    spec = _spec("sim", "mixtral-8x7b", MatrixSpec(tp=(2,), ep=(2,), flags={"expert-imbalance": ("1.0", "2.0")}))
    lines = dry_run_lines(spec)
    heads = _heads(lines)
    assert set(heads) == {"tp2-ep2-expert-imbalance_1.0", "tp2-ep2-expert-imbalance_2.0"}
    assert not any("skipped" in h for h in heads.values())
    args = ["--timing", "model", "--model-preset", "mixtral-8x7b", "--tp", "2", "--ep", "2"]
    slow = build_config(serve.make_context("serve", [*args, "--expert-imbalance=2.0"]).params).model_timing
    even = build_config(serve.make_context("serve", [*args, "--expert-imbalance=1.0"]).params).model_timing
    assert slow.expert_imbalance == 2.0
    step = [(2048, 0)]
    assert slow.cost_model().step(step, 0, 0).latency_s > 1.2 * even.cost_model().step(step, 0, 0).latency_s


def test_bench_sweep_cli_dry_run_lists_the_refusal() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench_llm.bench", "sweep", "--engine", "sim", "--model", "llama-3.1-70b", "--tp", "3",
         "--rate", "1", "--dry-run"], capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "tp3: 3 GPUs, skipped: invalid configuration: llama-3.1-70b has 64 attention heads" in out.stdout, out


def test_a_sweep_with_no_possible_cell_is_refused_before_anything_runs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    runner = CliRunner()
    for args in (["--model", "llama-3.1-70b", "--tp", "3"], ["--model", "mixtral-8x7b", "--tp", "1", "--ep", "8"]):
        out = tmp_path / args[1]
        res = runner.invoke(cli, ["sweep", "--engine", "sim", *args, "--rate", "1", "--slo", "ttft_ms=500",
                                  "--out", str(out)])  # fmt: skip
        assert res.exit_code == 2 and "no cell of the matrix can run" in res.output, res.output
        assert not out.exists()
    # in virtual time too, an EP group wider than the layout is skipped by name, not started
    from bench_llm.bench.sweep.engines import VirtualLauncher
    from bench_llm.launch.config import ParallelConfig

    assert "ep=4 needs 4 GPUs" in VirtualLauncher().unsupported("sim", ParallelConfig(tp=2, ep=4))[0]
    assert VirtualLauncher().unsupported("sim", ParallelConfig(tp=2, dp=2, ep=4)) == []


def test_bench_run_launch_refuses_a_layout_the_model_cannot_take_before_starting(tmp_path) -> None:  # type: ignore[no-untyped-def]
    res = CliRunner().invoke(cli, ["run", "--launch", "--engine", "sim", "--model", "llama-3.1-70b", "--parallel", "tp=3",
                                   "--requests", "2", "--rate", "1", "--clock", "auto", "--out", str(tmp_path / "r")])  # fmt: skip
    assert res.exit_code == 2 and "--parallel tp3: llama-3.1-70b has 64 attention heads" in res.output, res.output
    assert not (tmp_path / "r" / "engine.log").exists()  # nothing started
