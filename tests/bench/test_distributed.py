"""Distributed load generation (bench locust master|worker) on loopback.

The end-to-end tests start a simulated engine, a master and two workers as subprocesses
on 127.0.0.1 (bounded: ~80 requests, a few seconds of load each).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench_llm.analysis.load import load_run
from bench_llm.analysis.summary import summarize
from bench_llm.bench.distributed.assemble import PartRejected, RunAssembly
from bench_llm.bench.distributed.clock import CLOCK_DOMAIN_ENV, ClockSample, estimate_offset
from bench_llm.bench.distributed.loopback import run_loopback
from bench_llm.bench.distributed.measure import ShiftedRequestsWriter
from bench_llm.bench.distributed.wire import schedule_from_wire, schedule_to_wire
from bench_llm.bench.embedded import embedded_engine
from bench_llm.results.reader import read_requests, read_run_meta
from bench_llm.results.record import RequestRecord
from bench_llm.results.schema import REQUESTS_SCHEMA
from bench_llm.workloads.spec import Message, RequestSpec, Schedule
from bench_llm.workloads.synthetic import SyntheticWorkload

REQUESTS = 80
WORKLOAD = ["--rate", "20", "--arrival", "poisson", "--requests", str(REQUESTS), "--input-tokens", "64",
            "--output-tokens", "32", "--seed", "7"]  # fmt: skip
# Tolerances, distributed vs single-process, same workload and engine (fixed 50 ms TTFT,
# 10 ms ITL). Generous: the test machine is shared with other work.
RATE_REL_TOL = 0.10
TTFT_P50_ABS_MS, TTFT_P90_ABS_MS = 10.0, 25.0
ITL_P50_ABS_MS, ITL_P90_ABS_MS = 1.5, 6.0


# -- units -------------------------------------------------------------------------------
def test_schedule_survives_the_wire() -> None:
    chat = RequestSpec("c1", 5, 7, messages=(Message("system", "s"), Message("user", "u")), session_id="s1", turn=1)
    sched = SyntheticWorkload(requests=5, rate=3.0, warmup=2, seed=3).schedule()
    sched = Schedule(sched.name, sched.seed, "open", (*sched.requests, chat), rate=3.0, arrival="poisson",
                     description={"k": 1})  # fmt: skip
    back = schedule_from_wire(schedule_to_wire(sched))
    assert back == sched


def test_offset_estimate_uses_the_fastest_round_trip() -> None:
    # worker clock = master + 1000; the slow sample is skewed by an asymmetric path
    samples = [ClockSample(0, 1000 + 90, 100), ClockSample(500, 1500 + 10, 520), ClockSample(900, 1900 + 300, 1300)]
    est = estimate_offset(samples)
    assert est.rtt_ns == 20 and est.offset_ns == 1000
    with pytest.raises(ValueError):
        estimate_offset([])


def test_shifted_writer_moves_every_timestamp(tmp_path: Path) -> None:
    w = ShiftedRequestsWriter(tmp_path, "r", worker_id=3, shift_ns=-1000)
    rec = RequestRecord(
        request_id="a", phase="measure", worker_id=3, session_id=None, turn=0, prefix_group=None,
        intended_send_ns=5000, send_ns=5100, first_byte_ns=5200, first_token_ns=5300, first_content_ns=5300,
        end_ns=6000, chunk_ns=[5300, 5600], chunk_tokens=[1, 1], output_tokens=2, token_source="chunks",
        input_tokens_target=4, input_tokens_source="approx", max_output_tokens=2, prompt_tokens=None,
        completion_tokens=None, cached_tokens=None, http_status=200, finish_reason="length", ok=True,
        error_type=None, error_message=None, server_request_id=None, output_text=None,
    )  # fmt: skip
    w.add_record(rec)
    w.flush()
    row = read_requests(tmp_path).to_pylist()[0]
    assert (row["intended_send_ns"], row["send_ns"], row["end_ns"]) == (4000, 4100, 5000)
    assert row["chunk_ns"] == [4300, 4600] and row["worker_id"] == 3
    assert row["end_ns"] - row["first_token_ns"] == rec.end_ns - rec.first_token_ns


def test_assembly_rejects_foreign_part_names(tmp_path: Path) -> None:
    sched = SyntheticWorkload(requests=2, rate=1.0).schedule()
    asm = RunAssembly(tmp_path, "rid", sched, {"extra_json": {}})
    sink = pa.BufferOutputStream()
    pq.write_table(REQUESTS_SCHEMA.empty_table(), sink)
    data = sink.getvalue().to_pybytes()
    for table, name, wid in (("requests", "../run.parquet", 0), ("requests", "part-001-000000.parquet", 0),
                             ("other", "part-000-000000.parquet", 0)):  # fmt: skip
        with pytest.raises(PartRejected):
            asm.add_part(wid, table, name, data)
    with pytest.raises(PartRejected):
        asm.add_part(0, "requests", "part-000-000000.parquet", b"not parquet")
    assert asm.add_part(1, "requests", "part-001-000000.parquet", data) == 0
    assert (tmp_path / "requests" / "part-001-000000.parquet").exists()


def test_cli_help_never_imports_locust() -> None:
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from bench_llm.bench.cli import cli\n"
        "r1 = CliRunner().invoke(cli, ['--help']); r2 = CliRunner().invoke(cli, ['locust', 'master', '--help'])\n"
        "assert r1.exit_code == 0 and 'locust' in r1.output, r1.output\n"
        "assert r2.exit_code == 0 and '--workers' in r2.output, r2.output\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('locust', 'gevent')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- end to end --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    with embedded_engine(log, ["--ttft-ms", "50", "--itl-ms", "10"]) as url:
        yield url


def _single_run(url: str, out: Path) -> None:
    argv = [sys.executable, "-m", "bench_llm.bench", "run", "--url", url, "--out", str(out), "--no-progress", *WORKLOAD]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.timeout(240)
def test_two_workers_match_a_single_process_run(engine_url: str, tmp_path: Path) -> None:
    # the second worker process pretends to be another machine: its measured clock offset
    # is applied to its rows (the cross-machine path), which must not change the result
    dist = run_loopback(engine_url, tmp_path / "dist", WORKLOAD, workers=2, worker_env=[{}, {CLOCK_DOMAIN_ENV: "other"}])
    assert dist.returncode == 0, dist.master_stderr + "\n".join(dist.worker_stderr)
    _single_run(engine_url, tmp_path / "single")

    d_run, s_run = load_run(tmp_path / "dist"), load_run(tmp_path / "single")
    # one dataset with the single-run schema, both workers present, the whole schedule stored
    assert d_run.requests.schema.equals(s_run.requests.schema)
    assert sorted(set(d_run.requests["worker_id"].to_pylist())) == [0, 1]
    assert pq.read_table(tmp_path / "dist" / "schedule.parquet").num_rows == REQUESTS
    meta = read_run_meta(tmp_path / "dist")
    assert meta["status"] == "complete" and meta["notes"]["warnings"] == []
    workers = meta["extra"]["distributed"]["workers"]
    assert [w["status"] for w in workers] == ["done", "done"]
    assert all(w["clock_start"]["rtt_ns"] > 0 and w["drift_ns"] is not None for w in workers)
    assert sorted(w["same_clock"] for w in workers) == [False, True]
    other = next(w for w in workers if not w["same_clock"])
    assert other["applied_offset_ns"] == other["clock_start"]["offset_ns"]
    assert abs(other["applied_offset_ns"]) <= other["clock_start"]["error_bound_ns"] + 2_000_000

    d, s = summarize(d_run.requests), summarize(s_run.requests)
    assert d.requests.measured == s.requests.measured == REQUESTS
    assert d.requests.ok == s.requests.ok == REQUESTS
    d_rate, s_rate = d.throughput.requests_per_s, s.throughput.requests_per_s
    assert abs(d_rate - s_rate) <= RATE_REL_TOL * s_rate, (d_rate, s_rate)
    lat_d, lat_s = d.latency, s.latency
    assert abs(lat_d["ttft_ms"]["p50"] - lat_s["ttft_ms"]["p50"]) <= TTFT_P50_ABS_MS
    assert abs(lat_d["ttft_ms"]["p90"] - lat_s["ttft_ms"]["p90"]) <= TTFT_P90_ABS_MS
    assert abs(lat_d["itl_ms"]["p50"] - lat_s["itl_ms"]["p50"]) <= ITL_P50_ABS_MS
    assert abs(lat_d["itl_ms"]["p90"] - lat_s["itl_ms"]["p90"]) <= ITL_P90_ABS_MS


def _measure_processes(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "bench_llm.bench.distributed.measure" in cmd and marker in cmd:
            pids.append(int(entry.name))
    return pids


@pytest.mark.timeout(240)
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the orphaned measuring process")
def test_killed_worker_leaves_a_readable_run_and_a_warning(engine_url: str, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    res = run_loopback(
        engine_url, tmp_path / "dist", WORKLOAD, workers=2, logs=logs, kill_worker=1, kill_after_s=3.0,
        master_args=["--worker-timeout", "3"],
    )  # fmt: skip
    assert res.returncode == 0, res.master_stderr
    assert "lost" in res.master_stderr

    meta = read_run_meta(tmp_path / "dist")
    assert meta["status"] == "complete"
    warnings = meta["notes"]["warnings"]
    assert any("lost" in w for w in warnings) and any("offered load fell short" in w for w in warnings)
    assert meta["notes"]["offered_load_short"] is True
    workers = {w["status"]: w for w in meta["extra"]["distributed"]["workers"]}
    assert set(workers) == {"done", "lost"}
    survivor, lost = workers["done"], workers["lost"]
    assert survivor["recorded"] == survivor["scheduled"] == REQUESTS // 2
    assert 0 < lost["recorded"] < lost["scheduled"]  # rows streamed before the kill are kept

    table = read_requests(tmp_path / "dist")
    assert table.num_rows == survivor["recorded"] + lost["recorded"]
    summary = subprocess.run(
        [sys.executable, "-m", "bench_llm.bench", "summary", str(tmp_path / "dist")], capture_output=True, text=True, timeout=60
    )
    assert summary.returncode == 0, summary.stderr
    assert "WARNING: offered load fell short" in summary.stdout
    assert "WARNING: worker" in summary.stdout and "lost" in summary.stdout

    # the killed worker's measuring process noticed and stopped (no orphan keeps sending)
    deadline = time.monotonic() + 15
    while _measure_processes(str(logs)) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftovers = _measure_processes(str(logs))
    for pid in leftovers:
        os.kill(pid, 9)
    assert not leftovers


@pytest.mark.timeout(120)
def test_worker_side_error_is_one_line_and_the_folder_says_failed(engine_url: str, tmp_path: Path) -> None:
    res = run_loopback(
        engine_url, tmp_path / "dist", ["--rate", "4", "--requests", "8"], workers=2,
        master_args=["--api-key-file", str(tmp_path / "missing-key")],
    )  # fmt: skip
    assert res.returncode != 0
    errors = [line for line in res.master_stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no worker became ready" in errors[0] and "missing-key" in errors[0]
    assert "Traceback" not in res.master_stderr
    meta = read_run_meta(tmp_path / "dist")
    assert meta["status"] == "failed" and "missing-key" in meta["notes"]["warnings"][0]
