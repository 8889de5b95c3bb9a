"""The sweep on the simulated engine's performance model (70B on H100, in virtual time, the
default; the interrupt test measures it live, in real time): every cell
runs or is skipped with its reason, each cell's capacity is found, and the recommendation
changes with the workload the way serving practice predicts:

* short prompts at high load: replicas win (DP2×TP2 serves more than TP4 on the same 4 GPUs,
  since TP4 pays collectives on every decode step for a faster single request);
* long prompts with a tight TTFT target: only TP4 prefills fast enough (TP2 misses the TTFT
  target even one request at a time, so adding a replica does not help).

Runs are kept short (small request counts, coarse precision); the sim's batch limit is set
low in the first scenario so the event rate stays small on two shared cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench_llm.bench.errors import ExitCode
from bench_llm.bench.sweep.store import read_cells
from tests.conftest import REPO, run_cli

BASE = [
    "sweep", "--engine", "sim", "--model", "llama-3.1-70b", "--gpu", "h100", "--gpus", "4",
    "--tp", "2,4", "--dp", "1,2", "--capacity",
    # these pin the model's answer on small, fast probes: the point estimate decides (at 95 %
    # a 90 % target needs 35 requests per passing load; tests/analysis/test_confidence.py pins that)
    "--confidence", "0",
    # one search per cell: these tests read capacities and the recommendation, not the seeds'
    # interval (tests/bench/test_capacity_repeats.py)
    "--capacity-repeats", "0",
]  # fmt: skip


def _sweep(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    r = run_cli(*BASE, *args, "--out", str(out), "--no-progress", cwd=REPO)  # in this process: no start-up
    # 4: a load the client could not measure truthfully on a busy host (named in the output)
    assert r.returncode in (0, ExitCode.UNTRUSTWORTHY), r.stderr[-3000:]
    return r


def test_short_prompts_at_high_load_favour_replicas(tmp_path: Path) -> None:
    out = tmp_path / "short"
    r = _sweep(
        out,
        "--input-tokens", "128", "--output-tokens", "16", "--requests", "20", "--warmup", "2",
        "--capacity-start", "10", "--precision", "0.2", "--max-probes", "7",
        "--slo", "ttft_ms=300,tpot_ms=40", "--target-rate", "38",
        "--engine-arg=--max-num-seqs=8",
    )  # fmt: skip
    cells = {c["cell_id"]: c for c in read_cells(out)}
    assert cells["tp4-dp2"]["status"] == "skipped" and "needs 8 GPUs, 4 available" in cells["tp4-dp2"]["reason"]
    for cid in ("tp2", "tp4", "tp2-dp2"):
        assert cells[cid]["status"] == "complete", cells[cid]
        assert cells[cid]["capacity_rps"] and cells[cid]["capacity_rps"] > 0
        cap = json.loads(cells[cid]["capacity_json"])["in128-out16"]
        assert cap["converged"], cap  # bracketed to the stated precision
        assert cells[cid]["limiting_factor"]
    # the same 4 GPUs: replicas serve more; TP4 gives the faster single request
    assert cells["tp2-dp2"]["capacity_rps"] > cells["tp4"]["capacity_rps"] > cells["tp2"]["capacity_rps"]
    rec = json.loads((out / "recommendation.json").read_text())
    assert rec["recommendation"]["cell_id"] == "tp2-dp2"
    assert rec["recommendation"]["evidence"]["load_value"] >= 38
    assert "RECOMMENDATION: tp2-dp2" in r.stdout
    assert "tp4 gives the fastest single request" in r.stdout
    assert "[1/3] tp2 rate-" in r.stderr  # progress per cell and load


def test_long_prompts_with_a_tight_ttft_favour_tp4(tmp_path: Path) -> None:
    out = tmp_path / "long"
    r = _sweep(
        out,
        "--input-tokens", "6000", "--output-tokens", "16", "--requests", "6", "--warmup", "1",
        "--capacity-start", "1", "--precision", "0.5", "--max-probes", "3",
        # 6000-token prefills queue behind each other: 6-request probes pass at 1 req/s where a
        # 400-request confirmation meets 76 %; at 80 % of requests tp4 is confirmed at 0.75 req/s
        "--slo", "ttft_ms=450,tpot_ms=100", "--attainment", "80", "--max-requests", "400", "--target-rate", "0.5",
    )  # fmt: skip
    cells = {c["cell_id"]: c for c in read_cells(out)}
    assert cells["tp4"]["capacity_rps"] and cells["tp4"]["capacity_rps"] >= 0.5
    for cid in ("tp2", "tp2-dp2"):
        assert cells[cid]["status"] == "complete" and cells[cid]["capacity_rps"] is None
        assert cells[cid]["limiting_factor"] == "prefill_unloaded"
    assert "RECOMMENDATION: tp4" in r.stdout
    # bench recommend reads the same answer back from the Parquet alone
    again = run_cli("recommend", str(out), "--json", cwd=REPO)
    assert again.returncode in (0, ExitCode.UNTRUSTWORTHY), again.stderr
    assert json.loads(again.stdout)["recommendation"]["cell_id"] == "tp4"


def test_an_engine_that_cannot_start_is_recorded_and_the_others_complete(tmp_path: Path) -> None:
    out = tmp_path / "oom"
    r = subprocess.run(
        [sys.executable, "-m", "bench_llm.bench", "sweep", "--engine", "sim", "--model", "llama-3.1-70b", "--gpu", "h100",
         "--tp", "1,4", "--rate", "2", "--requests", "6", "--warmup", "1", "--input-tokens", "64",
         "--output-tokens", "8", "--slo", "ttft_ms=1000", "--confidence", "0", "--engine-arg=--dtype=bf16", "--out", str(out),
         "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # a configuration that failed to start makes the sweep's exit status say so (the rest is judged)
    assert r.returncode in (ExitCode.CELL_FAILED, ExitCode.UNTRUSTWORTHY), r.stderr[-3000:]
    assert "FAILED: tp1: engine failed to start" in r.stderr
    cells = {c["cell_id"]: c for c in read_cells(out)}
    # 140 GB of BF16 weights do not fit one H100: the engine exits at start with its reason
    assert cells["tp1"]["status"] == "failed"
    assert "out of memory" in cells["tp1"]["reason"] and "out of memory" in cells["tp1"]["log_tail"]
    assert cells["tp4"]["status"] == "complete" and cells["tp4"]["capacity_rps"] == 2.0
    assert "RECOMMENDATION: tp4" in r.stdout and "out of memory" in r.stdout


def _alive_with_port(port: str) -> list[int]:
    """Processes whose command line carries ``--port PORT`` (the engine)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for a, b in zip(argv, argv[1:]):
            if a == b"--port" and b.decode(errors="replace") == port:
                found.append(int(d.name))
    return found


def test_ctrl_c_stops_cleanly_and_resume_finishes(tmp_path: Path) -> None:
    import re
    import signal
    import time

    out = tmp_path / "int"
    # --confidence 0: the point estimate decides, so no extension loads (8 + 16 + 32 requests at
    # 4 req/s per cell otherwise); the interrupt and the resume do not depend on their number
    args = [sys.executable, "-m", "bench_llm.bench", "sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100",
            "--tp", "1,2", "--rate", "4", "--requests", "8", "--warmup", "0", "--input-tokens", "64",
            "--output-tokens", "8", "--slo", "ttft_ms=1000", "--confidence", "0", "--clock", "auto", "--out", str(out),
            "--no-progress"]  # fmt: skip
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "cell=tp1" / "load=rate-4" / "run.parquet").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the first load never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130, err[-2000:]
    assert "bench sweep --resume --out" in err
    port = re.search(r"ready after .* at http://127\.0\.0\.1:(\d+)", err)
    assert port and not _alive_with_port(port.group(1))  # the engine went down with the sweep
    assert {c["cell_id"]: c["status"] for c in read_cells(out)} == {"tp1": "running"}

    again = subprocess.run(
        [sys.executable, "-m", "bench_llm.bench", "sweep", "--resume", "--out", str(out), "--no-progress"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    assert {c["cell_id"]: c["status"] for c in read_cells(out)} == {"tp1": "complete", "tp2": "complete"}
    assert list((out / ".partial").iterdir())  # the interrupted attempt is kept aside
    assert "RECOMMENDATION: tp1" in again.stdout
