"""A sweep marks a load saturated when the engine turned requests away at admission, whatever
their share, with their number and kind in the reason (core/rejections.py): vLLM's HTTP 503
past ``--max-num-queued-reqs`` (the vLLM-flavoured simulated engine, launched per cell with
the flag as an axis) and SGLang's abort with status 503 past ``--max-queued-requests`` (the
SGLang-flavoured simulated engine, measured where it runs). Both in real time (admission
limits are not modelled in virtual time, which says so); small request counts."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

from bench_llm.launch.process import free_port
from tests.bench.test_cli_run import _wait_for_port
from tests.conftest import REPO, bench_argv

LOAD = ["--model", "llama-3.1-8b", "--rate", "40", "--requests", "30", "--warmup", "0", "--input-tokens", "256",
        "--output-tokens", "32", "--no-progress"]  # fmt: skip


def _rejected(stdout: str, kind: str) -> int:
    m = re.search(rf"SATURATED: (\d+) of 30 requests rejected at admission \((\d+) {kind}: ", stdout)
    assert m is not None, stdout[-3000:]
    assert m.group(1) == m.group(2)
    return int(m.group(1))


def test_a_max_num_queued_reqs_axis_on_the_vllm_flavoured_sim_saturates_loads_with_rejections(tmp_path: Path) -> None:
    p = subprocess.run(
        bench_argv("sweep", "--engine", "sim", "--gpu", "h100", "--tp", "1", "--axis", "max-num-queued-reqs=1",
                   "--engine-arg=--max-num-seqs=2", "--clock", "auto", "--out", str(tmp_path / "s"), *LOAD),
        capture_output=True, text=True, timeout=240, cwd=REPO,
    )  # fmt: skip
    assert p.returncode in (0, 4), p.stderr[-3000:]  # 4: a load the busy host could not measure truthfully
    out = p.stdout + p.stderr  # the per-load verdict lines are progress (stderr)
    assert "tp1-max-num-queued-reqs_1 rate-40" in out and _rejected(out, "http_503") > 0


def test_the_axis_is_refused_in_virtual_time_with_the_way_out(tmp_path: Path) -> None:
    p = subprocess.run(
        bench_argv("sweep", "--engine", "sim", "--gpu", "h100", "--tp", "1", "--axis", "max-num-queued-reqs=1",
                   "--out", str(tmp_path / "s"), *LOAD),
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert "--max-num-queued-reqs: not modelled in virtual time; measure in real time (--clock auto)" in p.stdout + p.stderr


def test_sglang_max_queued_requests_saturates_the_loads_it_rejects_in(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        bench_argv("sim", "serve", "--port", str(port), "--flavor", "sglang", "--timing", "model", "--model-preset",
                   "llama-3.1-8b", "--max-num-seqs", "2", "--max-queued-requests", "1"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for_port(port)
        p = subprocess.run(
            bench_argv("sweep", "--engine", "sglang", "--url", f"sg=http://127.0.0.1:{port}@1",
                       "--out", str(tmp_path / "s"), *LOAD),
            capture_output=True, text=True, timeout=180, cwd=REPO,
        )  # fmt: skip
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert p.returncode in (0, 4), p.stderr[-3000:]
    out = p.stdout + p.stderr
    assert _rejected(out, "abort_503") > 0 and "The request queue is full." in out
