"""A managed engine process: started from an argv list in its own process group (in
bench's session, so in bench's scheduler autogroup), its output sent to a log file,
waited on for readiness, and torn down as a group (SIGTERM, then SIGKILL) so no worker
survives.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench_llm.core.control import call
from bench_llm.core.errors import BenchError


class EngineStartError(BenchError, RuntimeError):
    """The engine died or did not become ready. ``summary``: what the launcher saw, one line;
    ``log``: the tail of the failed process's log ("" when there is none), which the message
    ends with (``summary; last log lines:`` then the tail). A caller reads the two fields,
    never the message."""

    def __init__(self, message: object = "", *args: object, log: str = "") -> None:
        self.summary = str(message)
        self.log = log
        super().__init__(f"{message}; last log lines:\n{log}" if log else message, *args)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled (a cell's process) with its fields
        return (_engine_start_error, (type(self), self.summary, self.log))


def _engine_start_error(cls: type[EngineStartError], summary: str, log: str) -> EngineStartError:
    return cls(summary, log=log)


def python_module(module: str, *args: str) -> list[str]:
    """argv running ``module`` of this installation in this interpreter, whatever the
    current folder holds: ``-P`` keeps the cwd off ``sys.path`` (a folder named ``bench``
    there would otherwise shadow the installed package)."""
    return [sys.executable, "-P", "-m", module, *args]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


_LIBC: object | None = None


def _load_libc() -> object | None:
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = ctypes.CDLL("libc.so.6", use_errno=True)
        except OSError:
            _LIBC = False
    return _LIBC or None


def _die_with_parent_of(parent_pid: int) -> None:  # runs in the child before exec (Linux only)
    libc = _load_libc()
    if libc is None:
        return
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # type: ignore[attr-defined]
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


class ManagedProcess:
    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        if isinstance(argv, str):
            raise TypeError("argv must be a list of arguments, never a shell string")
        self.argv = list(argv)
        self.log_path = Path(log_path)
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        _load_libc()  # before fork: no dlopen in the child
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                # Its own process group (group teardown) but bench's session: a new session is a
                # new scheduler autogroup (sched_autogroup_enabled), where a spinning engine worker
                # gets as much CPU as all of bench and bench wakes tens of ms late (issue 16).
                process_group=0,
                # if bench itself is killed (even with SIGKILL) the engine gets SIGTERM
                preexec_fn=functools.partial(_die_with_parent_of, os.getpid()) if os.name == "posix" else None,
            )
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, url: str, timeout_s: float, interval_s: float = 0.1) -> None:
        """Poll ``url`` until it answers 200; fail early if the process exits."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise EngineStartError(f"engine exited with code {code} during start-up", log=log_tail(self.log_path))
            reply = call(url, timeout_s=2)
            if reply.status == 200:
                return
            last = reply.problem()
            time.sleep(interval_s)
        raise EngineStartError(f"engine not ready after {timeout_s:g} s ({url}: {last})", log=log_tail(self.log_path))

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            # the leader is gone; make sure no other member of the group survives
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break

    def __enter__(self) -> "ManagedProcess":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
