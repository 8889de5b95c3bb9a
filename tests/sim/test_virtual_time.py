"""The simulated engine in virtual time: the same question gets the same answer.

* a run's rows are the model's own outcome list (``sim.backend.simulate``), token for token,
  and ``bench summary`` reads them as it reads a measured run;
* closed loops, session turns and the drain deadline behave as the load runner's do;
* the same sweep twice gives byte-identical points, with no wall-clock or host in them;
* the sweep and ``bench run --launch --engine sim`` run in virtual time by default, and the
  plain ``bench run`` (fixed-timing embedded engine) stays in real time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench_llm.analysis.load import load_run
from bench_llm.bench.execute import RunConfig
from bench_llm.bench.virtual import CLOCK_LABEL, VirtualEngine, execute_virtual, virtual_engine
from bench_llm.launch.config import ParallelConfig
from bench_llm.loadgen.runner import RunOptions
from bench_llm.sim.backend import Arrival, ModelBackend, simulate
from bench_llm.sim.virtual import CANCELLED, OK, Plan, Send, run
from bench_llm.workloads.spec import RequestSpec, Schedule
from tests.conftest import REPO, run_cli

#: 1/128 s: offsets that are exact in float seconds too (simulate() takes seconds).
TICK_NS = 7_812_500


def _engine(**parallel: int) -> VirtualEngine:
    return virtual_engine("llama-3.1-8b", "h100", ParallelConfig(**parallel), ("--max-num-seqs=16",))


def _open_schedule(n: int, prompt_words: int = 300, output: int = 40, gap_ticks: int = 3) -> Schedule:
    specs = tuple(
        RequestSpec(f"r{i}", prompt_words, output, prompt=" ".join(f"w{i}x{j}" for j in range(prompt_words)),
                    send_offset_ns=i * gap_ticks * TICK_NS)
        for i in range(n)
    )  # fmt: skip
    return Schedule("test", 0, "open", specs, rate=128.0 / gap_ticks)


def _run(tmp: Path, schedule: Schedule, engine: VirtualEngine, **options: float) -> Path:
    cfg = RunConfig(out=tmp, url="virtual:", engine="sim", model="m", schedule=schedule,
                    options=RunOptions(**options))  # type: ignore[arg-type]
    return execute_virtual(cfg, engine).run_dir


def test_a_runs_rows_are_the_models_own_outcomes_and_summary_reads_them(tmp_path: Path) -> None:
    engine = _engine(tp=1, dp=2)
    schedule = _open_schedule(60)
    run_dir = _run(tmp_path / "r", schedule, engine)
    own = simulate(
        ModelBackend(engine.timing),
        [Arrival(s.send_offset_ns / 1e9, 300, 40) for s in schedule.requests],  # type: ignore[operator]
    )
    rows = load_run(run_dir).requests.to_pandas().set_index("request_id")
    assert len(rows) == 60 and rows["ok"].all()
    for i, o in enumerate(own):
        row = rows.loc[f"r{i}"]
        assert row["intended_send_ns"] == row["send_ns"] == o.arrival_ns
        assert list(row["chunk_ns"]) == o.token_ns  # token for token
        assert list(row["chunk_tokens"]) == [1] * 40 and row["completion_tokens"] == 40
        assert row["prompt_tokens"] == 300
    # bench summary: the same run, through the CLI, on the model's figures
    p = subprocess.run([sys.executable, "-m", "bench_llm.bench", "summary", str(run_dir), "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["run"]["clock"] == CLOCK_LABEL
    ttft = np.array([o.ttft_s * 1e3 for o in own])
    e2e = np.array([o.e2e_s * 1e3 for o in own])
    assert s["latency"]["ttft_ms"]["p50"] == pytest.approx(float(np.percentile(ttft, 50)), abs=1e-9)
    assert s["latency"]["e2e_ms"]["mean"] == pytest.approx(float(e2e.mean()), abs=1e-9)


def test_closed_loop_sessions_and_the_drain_deadline(tmp_path: Path) -> None:
    backend = ModelBackend(_engine().timing)
    # two slots over five requests: a slot takes the next request the instant its own ends
    sends = [Send(100, 20) for _ in range(5)]
    res = run(backend, sends, Plan(concurrency=2))
    assert all(o.state == OK for o in res.outcomes)
    starts = sorted(o.intended_ns for o in res.outcomes)
    ends = sorted(o.end_ns for o in res.outcomes if o.end_ns is not None)
    assert starts[:2] == [res.t0_ns, res.t0_ns] and starts[2:] == ends[:3]
    # a session's next turn goes think_ns after the previous answer ended
    backend = ModelBackend(_engine().timing)
    sends = [Send(50, 10, at_ns=0), Send(80, 10, after=0, think_ns=2_000_000_000)]
    a, b = run(backend, sends).outcomes
    assert a.end_ns is not None and b.intended_ns == a.end_ns + 2_000_000_000 and b.state == OK
    # requests still running at the drain deadline are cancelled there, with the tokens they had
    backend = ModelBackend(_engine().timing)
    res = run(backend, [Send(100, 5000, at_ns=0), Send(100, 5, at_ns=0)], Plan(drain_ns=1_000_000_000))
    long, short = res.outcomes
    assert short.state == OK and long.state == CANCELLED and long.end_ns == 1_000_000_000
    assert 0 < len(long.token_ns) < 5000


def test_the_same_sweep_twice_gives_byte_identical_points(tmp_path: Path) -> None:
    args = [
        "sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "1", "--dp", "1,2",
        "--capacity", "--slo", "ttft_ms=200,tpot_ms=30", "--input-tokens", "256", "--output-tokens", "8",
        "--requests", "100", "--max-requests", "200", "--max-probes", "4", "--engine-arg=--max-num-seqs=8",
        "--no-progress",
    ]  # fmt: skip
    outs = []
    for name in ("a", "b"):  # "a" in this process, "b" in a fresh interpreter (its own hash seed, no warm state)
        out = tmp_path / name
        if name == "a":
            r = run_cli(*args, "--out", str(out), cwd=REPO)
        else:
            r = subprocess.run([sys.executable, "-m", "bench_llm.bench", *args, "--out", str(out)],
                               cwd=REPO, capture_output=True, text=True, timeout=240)  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        assert "ran in virtual time" in r.stdout
        outs.append((out, r.stdout))
    (a, out_a), (b, out_b) = outs
    points = sorted(p.relative_to(a) for p in a.glob("cell=*/points.parquet"))
    assert {str(p) for p in points} == {"cell=tp1-dp2/points.parquet", "cell=tp1/points.parquet"}
    for p in points:
        assert (a / p).read_bytes() == (b / p).read_bytes()  # the files themselves, byte for byte
        table = pq.read_table(a / p)
        text = json.dumps(table.to_pylist(), default=str)
        import socket

        assert socket.gethostname() not in text and "unix" not in " ".join(table.column_names)
    rec_a, rec_b = (json.loads((d / "recommendation.json").read_text()) for d in (a, b))
    assert rec_a.pop("sweep") != rec_b.pop("sweep") and rec_a == rec_b  # all but the folder's own path
    # every load folder: the same requests, byte for byte, and a run id that is the question's digest
    for req in a.glob("cell=*/load=*/requests/*.parquet"):
        assert req.read_bytes() == (b / req.relative_to(a)).read_bytes()
    strip = [ln for ln in out_a.splitlines() if "sweep finished in" not in ln]
    assert strip == [ln for ln in out_b.splitlines() if "sweep finished in" not in ln]


def test_bench_run_on_the_modelled_engine_is_virtual_by_default_and_real_time_stays(tmp_path: Path) -> None:
    base = ["run", "--rate", "20", "--requests", "30", "--input-tokens", "64", "--output-tokens", "8", "--no-scrape"]
    launch = ["--launch", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100", "--parallel", "tp=1,dp=2"]
    r = run_cli(*base, *launch, "--out", str(tmp_path / "v"))  # in this process: virtual time starts nothing
    assert r.returncode == 0, r.stderr[-2000:]
    meta = load_run(tmp_path / "v").meta
    assert meta["clock"] == CLOCK_LABEL and meta["config"]["engine_launch"]["clock"] == "virtual"
    assert "ready at" not in r.stderr  # no engine process was started
    # the plain run (embedded fixed-timing engine) measures bench's client in real time
    r = subprocess.run([sys.executable, "-m", "bench_llm.bench", *base, "--out", str(tmp_path / "real")], cwd=REPO,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert not load_run(tmp_path / "real").meta["clock"].startswith("virtual")
    # virtual time is for the modelled engine only; faults are not modelled there
    bad = run_cli(*base, "--clock", "virtual", "--out", str(tmp_path / "x"))
    assert bad.returncode != 0 and "--launch --engine sim" in bad.stderr
    bad = run_cli(*base, *launch, "--engine-arg=--faults=reset=0.1", "--out", str(tmp_path / "y"))
    assert bad.returncode != 0 and "--faults" in bad.stderr and "--clock auto" in bad.stderr


def test_a_simulated_run_kept_in_memory_is_the_run_its_folder_holds(tmp_path: Path) -> None:
    """``simulate_run`` (the sweep judges a load on its tables without reading them back, and
    writes the run table once) gives what ``load_run`` reads once the run table is written."""
    from bench_llm.bench.virtual import simulate_run
    from bench_llm.results.reader import read_server_metrics
    from bench_llm.results.writer import write_run_meta

    cfg = RunConfig(out=tmp_path / "r", url="virtual:", engine="sim", model="m", schedule=_open_schedule(30),
                    scrape_interval_s=0.5)  # fmt: skip
    done = simulate_run(cfg, _engine(tp=1))
    assert not (done.result.run_dir / "run.parquet").exists()  # not a run folder until the caller writes it
    kept = done.run()
    write_run_meta(done.result.run_dir, done.meta)
    read = load_run(done.result.run_dir)
    assert kept.path == read.path and kept.meta == read.meta and kept.meta["clock"] == CLOCK_LABEL
    assert kept.requests.equals(read.requests) and kept.requests.num_rows == 30
    assert done.server_metrics is not None and done.server_metrics.equals(read_server_metrics(done.result.run_dir))
