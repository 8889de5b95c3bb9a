"""Workload axes: input length, output length and workload name vary inside each cell (one
launch serves every workload value), from ``--axis`` and TOML ``[matrix]``; every point records
the values it ran with, capacity and the recommendation are per workload value, the dry run
lists them, and ``--resume`` finishes a sweep interrupted between two workload values."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench_llm.analysis.recommend_io import load_points
from bench_llm.bench.commands.sweep import _apply_flags, _axes, _workload_axes
from bench_llm.bench.sweep.dryrun import dry_run_lines
from bench_llm.bench.sweep.matrix import expand
from bench_llm.bench.sweep.orchestrate import run_sweep
from bench_llm.bench.sweep.spec import (
    LoadSpec,
    MatrixSpec,
    SweepSpec,
    SweepSpecError,
    WorkloadSpec,
    load_spec,
)
from bench_llm.bench.sweep.store import read_cells
from bench_llm.core.errors import BenchError
from tests.conftest import REPO

#: tp1 and tp2 under short and long prompts: the short ones fit one GPU at 3 req/s, the long ones
#: need TP2's faster prefill (pinned below); rates and requests kept small (virtual time).
SWEEP = [
    "sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "1,2",
    "--axis", "input-tokens=128,4096", "--output-tokens", "32", "--rate", "2,4", "--requests", "100",
    "--warmup", "1", "--slo", "ttft_ms=300,tpot_ms=30", "--target-rate", "3", "--no-progress",
]  # fmt: skip


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench_llm.bench", *args], cwd=REPO, capture_output=True, text=True, timeout=240, check=False)


def _spec(**kw: object) -> SweepSpec:
    base: dict[str, object] = {
        "model": "llama-3.1-8b", "gpu": "h100", "matrix": MatrixSpec(tp=(1, 2), input_tokens=(128, 1024)),
        "loads": LoadSpec(rates=(2.0,), requests=40, warmup=0), "slo": {"ttft_ms": 300.0},
    }  # fmt: skip
    base.update(kw)
    return SweepSpec(**base)  # type: ignore[arg-type]


def test_workload_axes_expand_inside_each_cell_not_into_more_cells() -> None:
    spec = _spec(matrix=MatrixSpec(tp=(1, 2), input_tokens=(128, 1024), output_tokens=(16, 64)))
    spec.validate()
    assert [c.cell_id for c in expand(spec)] == ["tp1", "tp2"]  # no launch per workload value
    ws = spec.cell_workloads
    assert [w.tag for w in ws] == ["in128-out16", "in128-out64", "in1024-out16", "in1024-out64"]
    assert [(w.input_tokens, w.output_tokens) for w in ws] == [(128, 16), (128, 64), (1024, 16), (1024, 64)]
    # the base workload's other settings carry over
    seeded = _spec(workloads=(WorkloadSpec(seed=7, arrival="constant"),))
    assert {(w.seed, w.arrival) for w in seeded.cell_workloads} == {(7, "constant")}
    named = _spec(matrix=MatrixSpec(workload=("chat", "workloads/long.toml")))
    assert [(w.tag, w.name) for w in named.cell_workloads] == [("chat", "chat"), ("long", "workloads/long.toml")]
    assert _spec(matrix=MatrixSpec()).cell_workloads == (WorkloadSpec(),)  # no axis: as given


def test_workload_axes_from_the_cli_and_toml_and_their_refusals(tmp_path: Path) -> None:
    axes = _axes(("input-tokens=128,1024", "max-num-seqs=8,32", "workload=chat"))
    assert _workload_axes(axes) == {"input_tokens": (128, 1024), "workload": ("chat",)}
    assert axes == {"max-num-seqs": ("8", "32")}  # what is left is an engine flag axis
    with pytest.raises(BenchError, match="--axis output-tokens"):
        _workload_axes({"output-tokens": ("long",)})
    spec = _apply_flags(None, {"model": "m", "axes": ("output-tokens=16,64",), "tp": "1,2"})
    assert spec.matrix.output_tokens == (16, 64) and spec.matrix.flags == {} and spec.matrix.tp == (1, 2)
    f = tmp_path / "s.toml"
    f.write_text(textwrap.dedent("""
        model = "m"
        [matrix]
        tp = [1, 2]
        input_tokens = [128, 1024]
        output_tokens = [32]
        [matrix.flags]
        max-num-seqs = [8, 32]
        [loads]
        rates = [1.0]
        """))  # fmt: skip
    spec = load_spec(f)
    spec.validate()
    assert [w.tag for w in spec.cell_workloads] == ["in128-out32", "in1024-out32"]
    assert len(expand(spec)) == 4  # tp x max-num-seqs: the workload axis adds no cell
    for bad, why in (
        ({"matrix": MatrixSpec(workload=("chat",), input_tokens=(128,))}, "a named workload sets its own lengths"),
        ({"workloads": (WorkloadSpec(name="chat"),)}, "a named workload sets its own lengths"),
        ({"workloads": (WorkloadSpec(label="a"), WorkloadSpec(label="b"))}, "several"),
        ({"matrix": MatrixSpec(input_tokens=(0,))}, "matrix.input_tokens: 0"),
        ({"matrix": MatrixSpec(output_tokens=(8, 8))}, "matrix.output_tokens: values repeat"),
    ):
        with pytest.raises(SweepSpecError, match=why):
            _spec(**bad).validate()


def test_the_dry_run_lists_the_workload_values_once_for_every_cell() -> None:
    lines = dry_run_lines(_spec(engine="vllm", model="org/m"))
    assert lines[0].startswith("# bench sweep --dry-run: engine vllm, model org/m, 2 cells")
    assert lines[1] == (
        "# 2 workloads, each measured in every cell (no launch of its own): "
        "in128 (input 128, output 128 tokens); in1024 (input 1024, output 128 tokens)"
    )
    assert sum(1 for ln in lines if ln.startswith("cell ")) == 2
    one = dry_run_lines(_spec(engine="vllm", model="org/m", matrix=MatrixSpec(tp=(1, 2))))
    assert not any("workloads" in ln for ln in one)  # one workload: the output as before


def test_tp_by_input_length_on_the_simulated_engine_recommends_per_workload(tmp_path: Path) -> None:
    out = tmp_path / "wl"
    r = _bench(*SWEEP, "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    cells = {c["cell_id"]: c for c in read_cells(out)}
    assert sorted(cells) == ["tp1", "tp2"] and all(c["status"] == "complete" for c in cells.values())
    assert len(list(out.glob("cell=*/engine.log"))) == 2  # one engine per cell serves both workloads
    # every point records the values it ran with; every combination was measured
    pts = load_points(out)
    ran = {(row.cell_id, row.workload, row.input_tokens, row.output_tokens, row.load_value) for row in pts.itertuples()}
    assert ran == {
        (c, f"in{i}", i, 32, rate) for c in ("tp1", "tp2") for i in (128, 4096) for rate in (2.0, 4.0)
    }  # fmt: skip
    # capacity per workload value: the long prompts cost tp1 its 4 req/s
    caps = {c: json.loads(cells[c]["capacity_json"]) for c in cells}
    assert caps["tp1"]["in128"]["capacity_rps"] == 4.0 and caps["tp1"]["in4096"]["capacity_rps"] == 2.0
    assert caps["tp2"]["in4096"]["capacity_rps"] == 4.0
    # one pick per workload, each saying which workload it is for
    rec = json.loads((out / "recommendation.json").read_text())
    picks = {w: wr["recommendation"]["cell_id"] for w, wr in rec["workloads"].items()}
    assert picks == {"in128": "tp1", "in4096": "tp2"}
    assert "workload in128:" in r.stdout and "workload in4096:" in r.stdout
    assert "RECOMMENDATION: tp1 (1 GPU)" in r.stdout and "RECOMMENDATION: tp2 (2 GPUs)" in r.stdout
    assert "for workload in128; each workload's own pick is below" in r.stdout


def test_resume_finishes_a_cell_interrupted_between_two_workload_values(tmp_path: Path) -> None:
    out = tmp_path / "int"
    spec = _spec()
    seen: list[str] = []

    def echo(line: str) -> None:
        seen.append(line)
        if " tp2 in1024-rate-2:" in line:  # tp2 measured in128, then is stopped in in1024
            raise KeyboardInterrupt

    res = run_sweep(spec, out, echo=echo)
    assert res.interrupted
    assert {c["cell_id"]: c["status"] for c in read_cells(out)} == {"tp1": "complete", "tp2": "running"}
    # a workload axis is measured inside every cell: changing it on resume is refused
    changed = _bench("sweep", "--resume", "--out", str(out), "--axis", "input-tokens=128,2048", "--no-progress")
    assert changed.returncode == 2 and "matrix.input_tokens" in changed.stderr, changed.stderr[-2000:]
    again = _bench("sweep", "--resume", "--out", str(out), "--no-progress")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "done tp1: complete (kept from the earlier run)" in again.stderr
    assert {c["cell_id"]: c["status"] for c in read_cells(out)} == {"tp1": "complete", "tp2": "complete"}
    pts = load_points(out)
    assert sorted(zip(pts["cell_id"], pts["workload"])) == [
        ("tp1", "in1024"), ("tp1", "in128"), ("tp2", "in1024"), ("tp2", "in128"),
    ]  # fmt: skip
    assert list((out / ".partial").iterdir())  # the interrupted attempt is kept aside
    rec = json.loads((out / "recommendation.json").read_text())
    assert set(rec["workloads"]) == {"in128", "in1024"}
