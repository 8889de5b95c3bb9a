"""Sweep orchestration on the fixed-timing embedded engine (fast): cells, skips, failures,
the folder layout, resume after a kill, and the sweep definition (flags and TOML)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from bench_llm.analysis.recommend import recommend
from bench_llm.analysis.recommend_io import load_points, sweep_dataset
from bench_llm.bench.sweep.orchestrate import run_sweep
from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec, SweepSpecError, WorkloadSpec, load_spec
from bench_llm.bench.sweep.store import read_cells
from bench_llm.core.errors import BenchError
from bench_llm.results.reader import read_run_meta
from bench_llm.results.sweep_rows import LoadRef, RunMeta
from tests.conftest import REPO
from tests.sweep_fakes import FixedSimLauncher


def _spec(**kw: object) -> SweepSpec:
    base = dict(
        model="m",
        gpus=4,
        matrix=MatrixSpec(tp=(2, 4), dp=(1, 2)),
        loads=LoadSpec(rates=(10.0, 20.0), requests=12, warmup=2),
        workloads=(WorkloadSpec(input_tokens=32, output_tokens=8),),
        slo={"ttft_ms": 1000.0, "tpot_ms": 200.0},
        # these tests pin the orchestration, not sample sizes: at 50 % a dozen requests all
        # meeting the SLOs decide a load (at 90 % it takes 35; tests/analysis/test_confidence.py)
        attainment_pct=50.0,
    )
    base.update(kw)
    return SweepSpec(**base)  # type: ignore[arg-type]


def _planned(points: pd.DataFrame, repeats: int = 1) -> pd.DataFrame:
    """The loads the sweep planned, without the re-measurements a client that could not
    measure truthfully on a busy host may add (docs/sweeps.md, Confidence)."""
    return points[points["repeat"] < repeats].reset_index(drop=True)


def test_cells_run_skip_and_fail_with_the_engine_log(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    launcher = FixedSimLauncher(bad_cells=("tp4",))
    lines: list[str] = []
    res = run_sweep(_spec(), out, launcher=launcher, echo=lines.append, progress=False)
    cells = {r["cell_id"]: r for r in read_cells(out)}
    assert set(cells) == {"tp2", "tp4", "tp2-dp2", "tp4-dp2"}
    assert cells["tp4-dp2"]["status"] == "skipped" and "needs 8 GPUs, 4 available" in cells["tp4-dp2"]["reason"]
    assert cells["tp4"]["status"] == "failed"
    assert "engine failed to start" in cells["tp4"]["reason"]
    assert "No such option" in cells["tp4"]["log_tail"]  # the engine's own last lines
    assert cells["tp2"]["status"] == "complete" and cells["tp2-dp2"]["status"] == "complete"
    assert res.failed == ("tp4",) and res.skipped == ("tp4-dp2",)
    assert cells["tp2"]["capacity_rps"] == 20.0 and cells["tp2"]["capacity_rps_per_gpu"] == 10.0
    assert any("FAILED" in ln for ln in lines) and any("tp2 rate-10" in ln for ln in lines)

    # each load is an ordinary run folder with the sweep's extra_json
    meta = read_run_meta(out / "cell=tp2-dp2" / "load=rate-10")
    extra = meta["extra"]
    assert extra["sweep_id"] == json.loads((out / "sweep.json").read_text())["sweep_id"]
    assert extra["cell"]["dp"] == 2 and extra["cell"]["tp"] == 2 and extra["cell"]["engine"] == "sim"
    # the point row's vocabulary (results/sweep_rows.py), no nested "load" any more
    assert "load" not in extra and RunMeta.from_row(extra).load == LoadRef("rate", 10.0, "rate-10")
    assert extra["repeat"] == 0 and extra["saturated"] is False
    # warm-up once per cell, recorded and excluded
    first = pq.read_table(out / "cell=tp2" / "load=rate-10" / "requests").to_pandas()
    second = pq.read_table(out / "cell=tp2" / "load=rate-20" / "requests").to_pandas()
    assert (first["phase"] == "warmup").sum() == 2 and (second["phase"] == "warmup").sum() == 0
    assert (out / "cell=tp2" / "engine.log").exists()

    # one dataset partitioned by cell with the configuration as columns
    table = sweep_dataset(out).to_table()
    assert set(table.column("cell").to_pylist()) == {"tp2", "tp2-dp2"}
    for col in ("tp", "dp", "gpus", "load_value", "attainment", "goodput_rps", "ttft_p90_ms"):
        assert col in table.column_names
    pts = _planned(load_points(out))
    assert len(pts) == 4 and set(pts["gpus"]) == {2, 4}

    # --resume keeps a failed cell; --retry-failed runs it again (now it starts)
    again = FixedSimLauncher()
    run_sweep(_spec(), out, resume=True, launcher=again, echo=lambda s: None, progress=False)
    assert again.started == []
    run_sweep(_spec(), out, resume=True, retry_failed=True, launcher=again, echo=lambda s: None, progress=False)
    assert again.started == ["tp4"]
    assert {r["cell_id"]: r["status"] for r in read_cells(out)}["tp4"] == "complete"


def test_recommendation_file_and_rescoring(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    run_sweep(_spec(matrix=MatrixSpec(tp=(1, 2))), out, launcher=FixedSimLauncher(), echo=lambda s: None, progress=False)
    rec = recommend(out).to_json()
    assert rec["recommendation"]["cell_id"] == "tp1"  # both meet the SLOs; tp1 uses fewer GPUs
    assert rec["recommendation"]["evidence"]["attainment"] == 1.0
    # re-judged from the request tables with an SLO no request can meet (fixed TTFT is 20 ms)
    strict = recommend(out, slo={"ttft_ms": 5.0}).to_json()
    assert strict["recommendation"] is None
    assert all(c["capacity_rps"] is None for c in strict["workloads"]["in32-out8"]["configurations"])


def test_resume_after_a_kill_runs_only_the_missing_cells(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    # small real-time loads (1 s + 0.5 s per cell) and the point estimate deciding (confidence 0:
    # no extension loads): resume does not depend on their size, and tp2 + tp4 still take seconds
    # after tp1 completes, so the kill lands mid-sweep (asserted below: tp4 not complete)
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from bench_llm.bench.sweep.orchestrate import run_sweep
        from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec, WorkloadSpec
        from tests.sweep_fakes import FixedSimLauncher
        spec = SweepSpec(model="m", matrix=MatrixSpec(tp=(1, 2, 4)),
                         loads=LoadSpec(rates=(10.0, 20.0), requests=10, warmup=0),
                         workloads=(WorkloadSpec(input_tokens=32, output_tokens=8),),
                         slo={{"ttft_ms": 1000.0}}, confidence=0.0)
        run_sweep(spec, Path({str(out)!r}), launcher=FixedSimLauncher(), echo=print, progress=False)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            statuses = {r["cell_id"]: r["status"] for r in read_cells(out)} if (out / "cells.parquet").exists() else {}
            if statuses.get("tp1") == "complete":
                break
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.05)
        else:
            pytest.fail("the first cell did not finish in time")
        os.kill(proc.pid, signal.SIGKILL)  # no chance to clean up
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    before = {r["cell_id"]: r["status"] for r in read_cells(out)}
    assert before["tp1"] == "complete" and before.get("tp4") != "complete"
    run_id_tp1 = read_run_meta(out / "cell=tp1" / "load=rate-10")["run_id"]

    spec = SweepSpec(
        model="m",
        matrix=MatrixSpec(tp=(1, 2, 4)),
        loads=LoadSpec(rates=(10.0, 20.0), requests=10, warmup=0),
        workloads=(WorkloadSpec(input_tokens=32, output_tokens=8),),
        slo={"ttft_ms": 1000.0},
        confidence=0.0,
    )
    launcher = FixedSimLauncher()
    res = run_sweep(spec, out, resume=True, launcher=launcher, echo=lambda s: None, progress=False)
    assert "tp1" not in launcher.started
    assert set(launcher.started) == {c for c, s in before.items() if s != "complete"} | (
        {"tp2", "tp4"} - set(before)
    )
    assert res.reused == ("tp1",)
    after = {r["cell_id"]: r["status"] for r in read_cells(out)}
    assert after == {"tp1": "complete", "tp2": "complete", "tp4": "complete"}
    assert read_run_meta(out / "cell=tp1" / "load=rate-10")["run_id"] == run_id_tp1  # untouched
    # a rerun without --resume refuses to mix sweeps; a changed definition refuses to resume
    # (other SLOs re-judge the sweep instead: tests/bench/test_sweep_rejudge.py)
    with pytest.raises(BenchError, match="--resume"):
        run_sweep(spec, out, launcher=launcher, echo=lambda s: None)
    changed = SweepSpec(**{**spec.__dict__, "workloads": (WorkloadSpec(input_tokens=64, output_tokens=8),)})
    with pytest.raises(BenchError, match="workloads"):
        run_sweep(changed, out, resume=True, launcher=launcher, echo=lambda s: None)


def test_sweep_toml_and_flag_validation(tmp_path: Path) -> None:
    f = tmp_path / "sweep.toml"
    f.write_text(
        textwrap.dedent(
            """
            engine = "sim"
            model = "llama-3.1-70b"
            gpu = "h100"
            gpus = 4
            slo = { ttft_ms = 1000, tpot_ms = 60 }
            target_rate = 2.0

            [matrix]
            tp = [2, 4]
            dp = [1, 2]

            [loads]
            capacity = true
            requests = 40

            [[workloads]]
            label = "long"
            input_tokens = 6000
            output_tokens = 32
            """
        )
    )
    spec = load_spec(f)
    spec.validate()
    assert spec.matrix.tp == (2, 4) and spec.loads.capacity and spec.workloads[0].tag == "long"
    bad = tmp_path / "bad.toml"
    bad.write_text('model = "m"\n[loads]\nrates = [1]\nrequestz = 3\n')
    with pytest.raises(SweepSpecError, match="loads.requestz"):
        load_spec(bad)
    with pytest.raises(SweepSpecError, match="mutually exclusive"):
        _spec(loads=LoadSpec(rates=(1.0,), concurrency=(2,))).validate()
    with pytest.raises(SweepSpecError, match="needs --slo"):
        _spec(loads=LoadSpec(capacity=True), slo={}).validate()


def test_cli_flags_override_the_file_and_bad_input_is_one_line(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('model = "m"\n[matrix]\ntp = [1]\n[loads]\nrates = [1]\n')
    r = subprocess.run(
        [sys.executable, "-m", "bench_llm.bench", "sweep", "--config", str(f), "--tp", "x", "--out", str(tmp_path / "o")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.strip().startswith("error: --tp") and "Traceback" not in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "bench_llm.bench", "recommend", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "not a sweep folder" in r.stderr


def test_concurrency_loads_with_repeats_are_pooled(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    spec = _spec(
        matrix=MatrixSpec(tp=(1, 2)),
        loads=LoadSpec(concurrency=(1, 4), requests=8, warmup=0),
        repeats=2,
        target_concurrency=4,
    )
    run_sweep(spec, out, launcher=FixedSimLauncher(), echo=lambda s: None, progress=False)
    pts = _planned(load_points(out, cell_id="tp1"), repeats=2)
    assert sorted(pts["load_label"]) == ["conc-1-r1", "conc-1-r2", "conc-4-r1", "conc-4-r2"]
    assert set(pts["repeat"]) == {0, 1}
    # repeats use different prompts (seeds), the same lengths
    a = pq.read_table(out / "cell=tp1" / "load=conc-1-r1" / "schedule.parquet")
    assert a.num_rows == 8
    rec = recommend(out).to_json()
    cfg = {c["cell_id"]: c for c in rec["workloads"]["in32-out8"]["configurations"]}
    assert cfg["tp1"]["max_concurrency"] == 4
    assert [p["requests"] for p in cfg["tp1"]["loads"]] == [16, 16]  # two repeats pooled per load
    assert rec["recommendation"]["cell_id"] == "tp1"
    assert rec["recommendation"]["evidence"]["load"] == "concurrency 4"


def test_a_tgi_load_past_its_admission_limit_says_requests_were_rejected(tmp_path: Path) -> None:
    # TGI as deployed by someone else (its --max-concurrent-requests, here 2): the loads above
    # it get in-stream 'overloaded' errors, and their verdict names them
    out = tmp_path / "sweep"
    launcher = FixedSimLauncher(extra_argv=("--flavor", "tgi", "--max-concurrent-requests", "2"), ttft_ms=100.0)
    spec = _spec(engine="tgi", matrix=MatrixSpec(tp=(1,)), loads=LoadSpec(concurrency=(2, 4), requests=8, warmup=0))
    run_sweep(spec, out, launcher=launcher, echo=lambda s: None, progress=False)
    pts = load_points(out, cell_id="tp1").set_index("load_label")
    assert not pts.loc["conc-2", "saturated"] and pts.loc["conc-2", "rejected_at_admission"] == 0
    assert pts.loc["conc-4", "saturated"] and pts.loc["conc-4", "rejected_at_admission"] > 0
    assert "rejected at admission" in pts.loc["conc-4", "saturation_reason"]


def test_an_engine_dying_mid_cell_fails_that_cell_and_the_sweep_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    launcher = FixedSimLauncher(crash_at={"tp1": "rate-20"})
    spec = _spec(matrix=MatrixSpec(tp=(1, 2)), loads=LoadSpec(rates=(10.0, 20.0, 40.0), requests=10, warmup=0))
    run_sweep(spec, out, launcher=launcher, echo=lambda s: None, progress=False)
    cells = {r["cell_id"]: r for r in read_cells(out)}
    assert cells["tp1"]["status"] == "failed"
    assert "stopped answering during load rate-20" in cells["tp1"]["reason"]
    assert "simulated crash" in cells["tp1"]["log_tail"]
    assert cells["tp2"]["status"] == "complete"
    # what tp1 measured before it died is kept
    pts = _planned(load_points(out, cell_id="tp1"))
    assert list(pts["load_label"]) == ["rate-10", "rate-20"]
    assert pts.iloc[0]["attainment"] == 1.0 and pts.iloc[1]["ok"] < 10


def test_loads_run_with_the_sweeps_client_workers_and_clock(tmp_path: Path) -> None:
    """``workers``/``clock`` reach every load's run (as bench run's flags do); a sweep.json
    stored before these fields existed resumes as it was measured (one process, user clock)."""
    out = tmp_path / "sweep"
    spec = _spec(matrix=MatrixSpec(tp=(1,)), loads=LoadSpec(rates=(10.0,), requests=8, warmup=0), workers=2, clock="user")
    spec.validate()
    run_sweep(spec, out, launcher=FixedSimLauncher(), echo=lambda s: None, progress=False)
    meta = read_run_meta(out / "cell=tp1" / "load=rate-10")
    assert meta["adapter"]["workers"] == 2
    assert meta["clock"].startswith("user:")
    with pytest.raises(SweepSpecError, match="clock"):
        _spec(clock="tsc").validate()
    with pytest.raises(SweepSpecError, match="workers"):
        _spec(workers=0).validate()

    # an older sweep.json (no workers, no clock): resumed without flags, it keeps the user clock
    stored = json.loads((out / "sweep.json").read_text())
    for key in ("workers", "clock"):
        del stored["spec"][key]
    (out / "sweep.json").write_text(json.dumps(stored))
    from bench_llm.bench.sweep.orchestrate import stored_spec

    old = stored_spec(out)
    assert old is not None and (old.workers, old.clock) == (1, "user")
    res = run_sweep(old, out, resume=True, launcher=FixedSimLauncher(), echo=lambda s: None, progress=False)
    assert res.reused == ("tp1",)
    with pytest.raises(BenchError, match="clock"):  # a different clock is a different sweep
        run_sweep(replace(old, clock="auto"), out, resume=True, launcher=FixedSimLauncher(), echo=lambda s: None)


def test_a_sweeps_engine_version_reaches_the_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the user's version picks version-gated flags (TGI --prometheus-port from 3.3.0)
    from bench_llm.bench.sweep.engines import CellEngine, DefaultLauncher
    from bench_llm.launch import launcher as launch_module
    from bench_llm.launch.config import ParallelConfig

    f = tmp_path / "sweep.toml"
    f.write_text('engine = "tgi"\nmodel = "m"\nengine_version = "3.2.3"\n')
    spec = load_spec(f)
    assert spec.engine_version == "3.2.3"
    seen = []
    monkeypatch.setattr(launch_module, "launch", lambda s, log: seen.append(s))
    DefaultLauncher().start(CellEngine("tgi", "m", None, ParallelConfig(), None, engine_version=spec.engine_version),
                            tmp_path / "engine.log")
    assert seen[0].engine_version == "3.2.3"
