"""Shared test helpers."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"

# Subprocesses (`python -m bench_llm.bench ...`) import this checkout through its editable install
# (pyproject.toml maps bench_llm's layers onto the top-level folders); the repository root on
# PYTHONPATH would import nothing of ours and only expose its build metadata to pip.


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test saying why."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not present (../shared is only beside the developers' and CI's checkouts)")
    return p


def bench_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "bench_llm.bench", *args]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``bench ARGS`` in this process (click's test runner): what ``subprocess.run(bench_argv(...))``
    returns, without a fresh interpreter's start-up (1-3 s on a loaded 2-core host) per call. For
    tests of what a verb computes or prints; a test of the process itself (signals, exit on a
    crash, ``python -m``) keeps the subprocess."""
    from click.testing import CliRunner

    from bench_llm.bench.cli import cli

    old = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(cli, list(args), prog_name="bench", catch_exceptions=False)
    finally:
        os.chdir(old)
    return subprocess.CompletedProcess(["bench", *args], result.exit_code, result.stdout, result.stderr)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.02) -> None:
    """Poll ``condition`` until it holds; fail the test naming ``what`` after ``timeout_s``.
    Instead of a fixed sleep, which is too short on a loaded host and wasted on an idle one."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(poll_s)


def autogroup(pid: int | str) -> str | None:
    """The scheduler autogroup's name of a process, or None where the kernel shows none (CI
    containers give an empty file; a same-session check still holds there)."""
    try:
        fields = Path(f"/proc/{pid}/autogroup").read_text().split()
    except OSError:
        return None
    return fields[0] if fields else None


@contextlib.contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served from a thread on 127.0.0.1, a free port: its base URL while the block runs."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def benchmark_module(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` (scripts, not a package) loaded afresh as the module ``NAME``
    (registered, as a dataclass defined there looks its module up)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
