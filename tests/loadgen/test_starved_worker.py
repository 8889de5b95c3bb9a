"""A starved worker, live (issue 20): ``bench run --workers 2`` against the embedded engine
while the test stops one worker process (SIGSTOP, ~3 s, then SIGCONT). Every time window the
starvation spans is flagged, and the summary names that worker; which worker was stopped is
read from the monitor samples it did not write, not from the summary under test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bench_llm.analysis.load import load_run
from tests.conftest import bench_argv, wait_until

REPO = Path(__file__).resolve().parents[2]
STOP_S = 3.0


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            out.append(int(entry.name))
    return out


@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the worker processes")
def test_a_stopped_worker_flags_every_window_it_spans_and_is_named(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = bench_argv(
        "run", "--workers", "2", "--rate", "40", "--requests", "100000", "--duration", "8", "--drain-timeout", "5",
        "--input-tokens", "8", "--output-tokens", "8", "--sim-ttft-ms", "5", "--sim-itl-ms", "2",
        "--out", str(out), "--no-progress", "--json",
    )
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    stopped: int | None = None
    try:
        wait_until(lambda: len(_children(proc.pid)) == 2 or proc.poll() is not None, 120, "two worker processes")  # (slow to spawn on a loaded host)
        # both shares are being measured once each worker flushed measured rows (every 1 s)
        wait_until(lambda: len(list((out / "requests").glob("part-001-*"))) > 0 or proc.poll() is not None, 120,
                   "worker 1's first rows")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        stopped = max(_children(proc.pid))  # either worker will do: which one is read back below
        stop_ns = time.perf_counter_ns()
        os.kill(stopped, signal.SIGSTOP)
        time.sleep(STOP_S)
        os.kill(stopped, signal.SIGCONT)
        cont_ns = time.perf_counter_ns()
        stopped = None
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, 3), stderr.decode()[-2000:]
    summary = json.loads(stdout)
    run = load_run(out)
    assert run.monitor is not None
    # the stopped worker: the one with no monitor sample while it was stopped (CLOCK_MONOTONIC
    # is shared by every process on the host: the test's stamps and the rows' compare)
    ts = run.monitor["ts_ns"].to_pylist()
    wids = run.monitor["worker_id"].to_pylist()
    margin = 300_000_000
    quiet = {w for w in (0, 1) if not any(wid == w and stop_ns + margin < t < cont_ns - margin for t, wid in zip(ts, wids))}
    assert len(quiet) == 1, quiet
    (worker,) = quiet

    client = summary["client"]
    assert client["silent_workers"] == [worker], client
    assert any(f"worker {worker} silent for" in w for w in client["warnings"]), client["warnings"]
    t0 = min(run.requests["intended_send_ns"].to_pylist())
    spanned = [w for w in client["windows"]
               if t0 + w["start_s"] * 1e9 < cont_ns and t0 + w["end_s"] * 1e9 > stop_ns]
    assert len(spanned) >= 3, (client["windows"], stop_ns - t0, cont_ns - t0)  # windows of 1 s over ~3 s
    for w in spanned:
        assert w["saturated"] and any(f"worker {worker} silent" in why for why in w["why"]), w
