"""A master and N workers as subprocesses on 127.0.0.1, for tests and benchmarks.

Optionally SIGKILLs one worker a given time after the master announced the start, to
exercise worker loss. Every process started here is stopped before returning.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench_llm.launch.process import free_port, python_module


@dataclass(frozen=True)
class LoopbackResult:
    run_dir: Path
    returncode: int
    master_stdout: str
    master_stderr: str
    worker_stderr: tuple[str, ...]
    killed_worker_pid: int | None


def _bench(*args: str) -> list[str]:
    return python_module("bench_llm.bench", *args)


def run_loopback(
    url: str,
    out: Path,
    workload_args: Sequence[str],
    workers: int = 2,
    logs: Path | None = None,
    kill_worker: int | None = None,
    kill_after_s: float = 1.0,
    master_args: Sequence[str] = (),
    worker_env: Sequence[dict[str, str]] = (),
    timeout_s: float = 180.0,
) -> LoopbackResult:
    """Run ``bench locust master`` + ``workers`` x ``bench locust worker``; return when done.

    ``kill_worker`` is an index into the started worker processes (not a worker_id);
    ``worker_env[i]`` adds environment variables to worker process ``i``.

    Longer than most functions on purpose: the master and worker processes are started,
    watched and reaped inside one ``try``/``finally``, so that no process outlives an error;
    split into steps, that guarantee would be spread over several functions.
    """
    logs = logs or out.parent / f"{out.name}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    m_out, m_err = logs / "master.out", logs / "master.err"
    procs: list[subprocess.Popen[bytes]] = []
    w_errs = [logs / f"worker{i}.err" for i in range(workers)]
    killed: int | None = None
    try:
        with open(m_out, "wb") as fo, open(m_err, "wb") as fe:
            master = subprocess.Popen(
                _bench(
                    "locust", "master", "--workers", str(workers), "--port", str(port), "--url", url,
                    "--out", str(out), "--wait-workers", "60", *master_args, *workload_args,
                ),
                stdout=fo,
                stderr=fe,
                stdin=subprocess.DEVNULL,
            )
        procs.append(master)
        for i in range(workers):
            with open(w_errs[i], "wb") as fe:
                procs.append(
                    subprocess.Popen(
                        _bench("locust", "worker", "--master-port", str(port), "--spool-dir", str(logs / f"spool{i}")),
                        stdout=subprocess.DEVNULL,
                        stderr=fe,
                        stdin=subprocess.DEVNULL,
                        env={**os.environ, **(worker_env[i] if i < len(worker_env) else {})},
                    )
                )
        deadline = time.monotonic() + timeout_s
        if kill_worker is not None:
            while b"master: started" not in m_err.read_bytes():
                if master.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            time.sleep(kill_after_s)
            victim = procs[1 + kill_worker]
            killed = victim.pid
            os.kill(victim.pid, signal.SIGKILL)
        try:
            code = master.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = -1
        for p in procs[1:]:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    return LoopbackResult(
        out,
        code,
        m_out.read_text(errors="replace"),
        m_err.read_text(errors="replace"),
        tuple(p.read_text(errors="replace") for p in w_errs),
        killed,
    )
