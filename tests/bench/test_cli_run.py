"""`bench run` end to end on the embedded engine: timing, durability, errors."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench_llm.analysis.load import load_run
from tests.conftest import bench_argv, run_cli, wait_until


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(bench_argv(*args), capture_output=True, text=True, timeout=timeout)


def test_embedded_engine_run_writes_a_complete_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = _run("run", "--concurrency", "4", "--requests", "12", "--input-tokens", "8", "--output-tokens", "8",
             "--sim-ttft-ms", "5", "--sim-itl-ms", "1", "--out", str(out), "--json", "--no-progress")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["requests"]["ok"] == 12 and s["requests"]["failed"] == 0
    assert s["tokens"]["sources"] == {"server_cumulative": 12}
    assert (out / "run.parquet").exists() and (out / "schedule.parquet").exists()
    assert (out / "engine.log").exists()
    # the default clock: the kernel's receive stamps where the platform has them; the
    # summary names the clock its timings come from
    from bench_llm.loadgen.socket_clock import kernel_timestamps_supported

    clock = load_run(out).meta["clock"].split(":")[0]
    assert clock == ("kernel" if kernel_timestamps_supported() else "user")
    assert s["run"]["clock"].startswith(clock)
    p = _run("summary", str(out), timeout=60)
    assert p.returncode == 0 and p.stdout.splitlines()[0].endswith(f"clock={clock}"), p.stdout


def test_client_stamps_match_the_engines_emission_log(tmp_path: Path) -> None:
    """Engine (its own process) at TTFT 50 ms / ITL 10 ms, 16 in flight: every client chunk
    stamp is compared with the engine's own log of when it wrote that token (same
    CLOCK_MONOTONIC). The first-token stamp error p50 must be within 0.5 ms and the ITL
    p50 within 10 ± 0.5 ms. The engine's own intake time (socket to handler, ~1-2 ms here)
    is engine time, not client error, so it is not held against the client.

    Contention from other processes on a small machine only ever adds delay, so the test
    makes up to three attempts and passes on the first that is within bounds; every
    attempt's figures are printed.
    """
    import numpy as np
    import pyarrow.compute as pc

    from bench_llm.launch.process import free_port
    from bench_llm.results.reader import read_requests

    attempts = []
    for attempt in range(3):
        port, log, out = free_port(), tmp_path / f"emissions{attempt}.parquet", tmp_path / f"run{attempt}"
        server = subprocess.Popen(
            bench_argv("sim", "serve", "--host", "127.0.0.1", "--port", str(port), "--timing", "fixed",
                       "--ttft-ms", "50", "--itl-ms", "10", "--emission-log", str(log)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for_port(port)
            p = _run("run", "--url", f"http://127.0.0.1:{port}", "--model", "sim-model", "--concurrency", "16",
                     "--requests", "96", "--input-tokens", "32", "--output-tokens", "64", "--out", str(out),
                     "--json", "--no-progress")
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
        assert p.returncode == 0, p.stderr
        s = json.loads(p.stdout)
        assert s["requests"]["ok"] == 96 and s["requests"]["failed"] == 0
        req = read_requests(out)
        req = req.filter(pc.equal(req["phase"], "measure"))
        emitted = pq.read_table(log).to_pandas().sort_values(["server_request_id", "token_index"])
        first_emitted = emitted.groupby("server_request_id")["actual_ns"].first()
        rows = req.select(["server_request_id", "first_token_ns"]).to_pandas().set_index("server_request_id")
        joined = rows.join(first_emitted, how="inner")
        assert len(joined) == 96
        err_ms = float(np.median(joined["first_token_ns"] - joined["actual_ns"])) / 1e6
        itl = s["latency"]["itl_ms"]["p50"]
        attempts.append((round(err_ms, 3), itl, s["latency"]["ttft_ms"]["p50"]))
        print(f"attempt {attempt}: first-token stamp error p50 {err_ms:.3f} ms, ITL p50 {itl:.3f} ms, "
              f"TTFT p50 {s['latency']['ttft_ms']['p50']:.3f} ms")
        if abs(err_ms) <= 0.5 and abs(itl - 10) <= 0.5:
            return
    pytest.fail(f"stamp error / ITL p50 outside 0±0.5 / 10±0.5 ms in every attempt (err, ITL, TTFT): {attempts}")


def _wait_for_port(port: int, timeout: float = 30.0) -> None:
    import socket

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_until(listening, timeout, f"the engine listening on port {port}", poll_s=0.1)


def _flushed_rows(run_dir: Path) -> int:
    """Rows in the run's flushed part files (each is renamed into place complete)."""
    rows = 0
    for part in (run_dir / "requests").glob("part-*.parquet"):
        try:
            rows += pq.read_metadata(part).num_rows
        except OSError:  # compacted away meanwhile
            pass
    return rows


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc; empty elsewhere)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigkill_mid_run_leaves_readable_rows(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        bench_argv("run", "--concurrency", "8", "--requests", "100000", "--output-tokens", "8",
                   "--sim-itl-ms", "1", "--sim-ttft-ms", "5", "--out", str(out), "--no-progress"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        wait_until(lambda: _flushed_rows(out) > 50, 120, "more than 50 rows flushed")
        engines = _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    parts = sorted((out / "requests").glob("part-*.parquet"))
    assert parts, "no part file flushed before the kill"
    rows = sum(pq.read_table(p).num_rows for p in parts)
    assert rows > 50
    run = load_run(out)
    assert run.meta["status"] == "running"  # killed: never marked complete
    assert run.requests.num_rows == rows
    # the engine subprocess died with its parent (PDEATHSIG)
    wait_until(lambda: not any(map(_alive, engines)), 30, f"the engine ({engines}) dying with bench")
    log = (out / "engine.log").read_text() if (out / "engine.log").exists() else ""
    assert "Traceback" not in log


def test_ctrl_c_stops_cleanly_with_a_complete_file(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        bench_argv("run", "--concurrency", "8", "--requests", "100000", "--output-tokens", "50",
                   "--out", str(out), "--no-progress"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    wait_until(lambda: _flushed_rows(out) > 0, 120, "the first rows flushed")  # measuring, requests in flight
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    run = load_run(out)
    assert run.meta["status"] == "interrupted"
    types = set(run.requests.column("error_type").to_pylist())
    assert "cancelled" in types  # in-flight requests recorded, not dropped
    assert "requests:" in stdout  # the summary was still printed
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--rate", "-1"], "--rate"),
        (["--rate", "2", "--concurrency", "4"], "not both"),
        (["--requests", "0"], "--requests"),
        (["--concurrency", "2", "--slo", "ttft=5"], "SLO"),
        (["--concurrency", "2", "--slo", "ttft_ms=abc"], "not a number"),
        (["--arrival", "sometimes", "--rate", "1"], "arrival"),
        (["--concurrency", "2", "--percentiles", "50,200"], "percentiles"),
    ],
)
def test_nonsense_arguments_get_one_line_errors(tmp_path: Path, args: list[str], needle: str) -> None:
    # in this process: what is tested is the message bench prints, not an interpreter's start-up;
    # an exception escaping the CLI's one translation point fails the test with its traceback
    p = run_cli("run", "--out", str(tmp_path / "x"), *args)
    assert p.returncode == 2
    err = p.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and needle in err, err


def test_summary_of_missing_folder_is_one_line(tmp_path: Path) -> None:
    p = run_cli("summary", str(tmp_path / "nope"))
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
