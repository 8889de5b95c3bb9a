"""Engine flags as sweep axes: the matrix (CLI ``--axis`` and TOML ``[matrix.flags]``), cell ids,
what each engine refuses by name, the simulated engine honouring the flags it models, and a
four-cell sweep (tp × max-num-seqs) on the simulated engine that recommends among its cells."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from bench_llm.bench.commands.sweep import _axes
from bench_llm.bench.sweep.matrix import expand
from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec, SweepSpecError, load_spec
from bench_llm.bench.sweep.store import read_cells
from bench_llm.core.errors import BenchError
from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.profiles import unsupported_axes
from bench_llm.launch.tuning import SIM_TUNING_FLAGS, unsupported_args
from bench_llm.sim.options import ModelTiming, describe
from tests.conftest import REPO, run_cli


def _spec(**kw: object) -> SweepSpec:
    base: dict[str, object] = dict(
        model="llama-3.1-8b",
        matrix=MatrixSpec(tp=(1, 2), flags={"max-num-seqs": ("8", "32")}),
        loads=LoadSpec(rates=(1.0,)),
    )
    base.update(kw)
    return SweepSpec(**base)  # type: ignore[arg-type]


def test_a_flag_axis_multiplies_the_parallel_cells() -> None:
    spec = _spec()
    spec.validate()
    cells = expand(spec, unsupported_axes)
    assert [c.cell_id for c in cells] == [
        "tp1-max-num-seqs_8", "tp1-max-num-seqs_32", "tp2-max-num-seqs_8", "tp2-max-num-seqs_32",
    ]  # fmt: skip
    assert all(c.skip_reason is None for c in cells)
    assert cells[1].config.extra_args == ("--max-num-seqs=32",)
    assert cells[1].tuning == (("max-num-seqs", "32"),)
    # two axes: every combination, in the order the values were given
    two = expand(_spec(matrix=MatrixSpec(flags={"max-num-seqs": ("8", "32"), "dtype": ("bf16", "fp8")})))
    assert [c.cell_id for c in two][:2] == ["tp1-max-num-seqs_8-dtype_bf16", "tp1-max-num-seqs_8-dtype_fp8"]
    assert len(two) == 4


def test_matrix_flags_in_toml_and_bad_axes_are_one_line(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text(
        textwrap.dedent(
            """
            model = "m"
            [matrix]
            tp = [1, 2]
            [matrix.flags]
            max-num-seqs = [8, 32]
            gpu-memory-utilization = [0.8, 0.9]
            [loads]
            rates = [1.0]
            """
        )
    )
    spec = load_spec(f)
    spec.validate()
    assert spec.matrix.flags == {"max-num-seqs": (8, 32), "gpu-memory-utilization": (0.8, 0.9)}
    assert len(expand(spec)) == 8
    with pytest.raises(SweepSpecError, match="both a matrix axis and an --engine-arg"):
        _spec(engine_args=("--max-num-seqs=4",)).validate()
    with pytest.raises(SweepSpecError, match="matrix.flags.--x"):
        _spec(matrix=MatrixSpec(flags={"--x": ("1",)})).validate()
    with pytest.raises(SweepSpecError, match="values repeat"):
        _spec(matrix=MatrixSpec(flags={"max-num-seqs": ("8", "8")})).validate()
    assert _axes(("--max-num-seqs=8,32", "dtype=fp8")) == {"max-num-seqs": ("8", "32"), "dtype": ("fp8",)}
    for bad in ("max-num-seqs", "max-num-seqs=", "=8"):
        with pytest.raises(BenchError, match="expected FLAG=V1,V2"):
            _axes((bad,))


def test_each_engine_refuses_flags_it_lacks_by_name() -> None:
    def why(engine: str, *args: str) -> str:
        return "; ".join(unsupported_axes(engine, ParallelConfig(extra_args=args)))

    assert why("sim", "--max-num-seqs=8", "--gpu-memory-utilization=0.8") == ""
    assert why("sim", "--kv-cache-dtype=fp8") == "the simulated engine has no KV cache dtype flag (--kv-cache-dtype)"
    assert why("sim", "--block-size=32") == "the simulated engine does not model --block-size"
    assert why("sglang", "--max-num-seqs=8") == (
        "SGLang has no --max-num-seqs; its max running requests flag is --max-running-requests"
    )
    assert "--gpu-memory-utilization" in why("vllm", "--mem-fraction-static=0.8")
    assert "--max-batch-prefill-tokens" in why("tgi", "--max-num-batched-tokens=4096")
    assert why("vllm", "--schedule-conservativeness=0.5") == (
        "vLLM has no scheduling conservativeness flag (--schedule-conservativeness)"
    )
    # an engine's own names, and flags bench has no row for, go to the engine untouched
    assert why("vllm", "--max-num-seqs=8", "--block-size=32") == ""
    assert why("sglang", "--max-running-requests=8", "--mem-fraction-static=0.8") == ""
    # a refused flag skips the cell with the reason, before anything starts
    cells = expand(_spec(engine="sglang"), unsupported_axes)
    assert all("its max running requests flag is --max-running-requests" in (c.skip_reason or "") for c in cells)
    assert unsupported_args("vllm", ["positional", "-x"]) == []


def test_the_simulated_engine_honours_the_flags_it_takes() -> None:
    from bench_llm.bench.commands.sim import serve

    options = {opt.lstrip("-") for p in serve.params for opt in p.opts}
    assert SIM_TUNING_FLAGS <= options, SIM_TUNING_FLAGS - options
    base = describe(ModelTiming(preset="llama-3.1-8b", gpu="h100"))
    tuned = describe(ModelTiming(preset="llama-3.1-8b", gpu="h100", gpu_memory_utilization=0.5, max_num_seqs=8))
    assert tuned["gpu_memory_utilization"] == 0.5 and tuned["max_num_seqs"] == 8
    assert tuned["kv_tokens_per_instance"] < base["kv_tokens_per_instance"]
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        ModelTiming(gpu_memory_utilization=1.5)


def test_tp_by_max_num_seqs_on_the_simulated_engine_measures_four_cells_and_recommends(tmp_path: Path) -> None:
    out = tmp_path / "axes"
    r = run_cli(  # in this process: the sweep's answer is under test, not its process
        "sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100",
        "--tp", "1,2", "--axis", "max-num-seqs=8,32", "--rate", "8,24", "--requests", "20", "--warmup", "1",
        "--input-tokens", "128", "--output-tokens", "64", "--slo", "ttft_ms=500,tpot_ms=40",
        "--target-rate", "20", "--out", str(out), "--no-progress", cwd=REPO,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    cells = {c["cell_id"]: c for c in read_cells(out)}
    ids = ["tp1-max-num-seqs_8", "tp1-max-num-seqs_32", "tp2-max-num-seqs_8", "tp2-max-num-seqs_32"]
    assert sorted(cells) == sorted(ids)
    for cid in ids:
        assert cells[cid]["status"] == "complete", cells[cid]
        seqs = cid.rsplit("_", 1)[1]
        assert json.loads(cells[cid]["tuning"]) == {"max-num-seqs": seqs}
        assert f"--max-num-seqs={seqs}" in json.loads(cells[cid]["engine_argv"])
    rec = json.loads((out / "recommendation.json").read_text())
    assert {c["cell_id"] for c in rec["workloads"]["in128-out64"]["configurations"]} == set(ids)
    # on one GPU, eight running requests saturate at 24 req/s (requests queue); thirty-two keep up:
    # the smallest configuration meeting 20 req/s is the one-GPU cell with the larger batch limit
    assert rec["recommendation"]["cell_id"] == "tp1-max-num-seqs_32", r.stdout
    assert "RECOMMENDATION: tp1-max-num-seqs_32" in r.stdout
    assert cells["tp1-max-num-seqs_8"]["capacity_rps"] < 20 <= cells["tp1-max-num-seqs_32"]["capacity_rps"]
    # the report's cell table shows the values each cell ran with
    from bench_llm.analysis.report import ReportOptions, build_report

    build_report(out, tmp_path / "r.html", ReportOptions())
    html = (tmp_path / "r.html").read_text()
    assert "<th>tuning</th>" in html and "max-num-seqs" in html
