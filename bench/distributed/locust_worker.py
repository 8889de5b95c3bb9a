"""The worker node, on locust's WorkerRunner (this module imports locust: gevent patches).

The locust worker only coordinates: it answers clock pings, receives its share of the
schedule, starts the measuring process (``bench.distributed.measure``, plain asyncio,
no gevent), passes on the start time, and streams the part files that process flushes
to the master. If this process dies, the measuring process sees end-of-file on its stdin
and stops; whatever was streamed before stays in the master's run folder.
"""

from __future__ import annotations

# ruff: noqa: I001  (locust is imported first: gevent monkey-patches the standard library)

import locust  # noqa: F401  (monkey-patches the standard library first)

import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
from gevent import subprocess
from gevent.event import Event
from locust.env import Environment

from bench_llm.launch.process import python_module
from bench_llm.bench.distributed.clock import boot_id
from bench_llm.results.schema import MONITOR_DIR, REQUESTS_DIR

STATUS_INTERVAL_S = 0.25
#: Without a locust heartbeat from the master for this long, stop measuring: nobody
#: would receive the rows (locust itself only gives up after 60 s).
MASTER_SILENCE_S = 15.0


class WorkerNode:
    def __init__(
        self, master_host: str, master_port: int, spool_root: Path | None = None, echo: Callable[[str], None] = print
    ) -> None:
        self.echo = echo
        self.env = Environment(user_classes=[])
        self.spool = Path(tempfile.mkdtemp(prefix="bench-worker-", dir=spool_root))
        self.job: dict[str, Any] | None = None
        self.job_event = Event()
        self.finish_event = Event()
        self.finish_reason = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.sent_parts: set[str] = set()
        self.child_result: dict[str, Any] | None = None
        self.child_error: str | None = None
        self.worker_id = -1
        self.runner = self.env.create_worker_runner(master_host, master_port)
        for name, handler in (
            ("bench_ping", self._on_ping),
            ("bench_job", self._on_job),
            ("bench_start", self._on_start),
            ("bench_stop", self._on_stop),
            ("bench_finish", self._on_finish),
        ):
            self.runner.register_message(name, handler)

    def _send(self, msg_type: str, data: dict[str, Any]) -> None:
        self.runner.send_message(msg_type, data)

    # -- handlers ------------------------------------------------------------------
    def _on_ping(self, environment: Environment, msg: Any) -> None:
        self._send("bench_pong", {"seq": msg.data["seq"], "worker_ns": time.perf_counter_ns()})

    def _on_job(self, environment: Environment, msg: Any) -> None:
        if self.job is None:
            self.job = msg.data
            self.job_event.set()

    def _to_child(self, obj: dict[str, Any]) -> None:
        if self.proc is not None and self.proc.stdin is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.write((json.dumps(obj) + "\n").encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def _on_start(self, environment: Environment, msg: Any) -> None:
        self._to_child({"start_at_ns": int(msg.data["start_at_ns"])})

    def _on_stop(self, environment: Environment, msg: Any) -> None:
        self._to_child({"stop": True})

    def _on_finish(self, environment: Environment, msg: Any) -> None:
        self.finish_reason = str((msg.data or {}).get("reason", ""))
        self.finish_event.set()
        self.job_event.set()

    # -- the job -------------------------------------------------------------------
    def serve(self, wait_job_s: float = 3600.0) -> int:
        """Run one job for the master; returns the measuring process's exit code."""
        self._send("bench_hello", {"host": socket.gethostname(), "boot_id": boot_id(), "pid": os.getpid()})
        self.echo("worker: connected, waiting for a job")
        self.job_event.wait(timeout=wait_job_s)
        if self.job is None:
            self.echo(f"worker: no job ({self.finish_reason or 'timed out'})")
            return 0
        self.worker_id = int(self.job["worker_id"])
        job_file = self.spool / "job.json"
        job_file.write_text(json.dumps(self.job))
        self.echo(f"worker {self.worker_id}: {len(self.job['schedule']['requests'])} requests; starting the measuring process")
        self.proc = subprocess.Popen(
            python_module("bench_llm.bench.distributed.measure", str(job_file), str(self.spool)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        reader = gevent.spawn(self._read_child)
        while self.proc.poll() is None:
            self._stream_parts()
            self._send("bench_status", {"worker_id": self.worker_id})
            if self.finish_event.wait(timeout=STATUS_INTERVAL_S):
                self._to_child({"stop": True})
            last = self.runner.last_heartbeat_timestamp
            if last is not None and time.time() - last > MASTER_SILENCE_S:
                self.echo(f"worker {self.worker_id}: no heartbeat from the master for {MASTER_SILENCE_S:g} s; stopping")
                self._to_child({"stop": True})
                self.finish_event.set()
        reader.join(timeout=5)
        self._stream_parts()
        code = self.proc.returncode
        error = self.child_error
        if self.child_result is None and error is None:
            error = f"measuring process exited with code {code} before finishing"
        self._send("bench_done", {"worker_id": self.worker_id, "stats": (self.child_result or {}).get("stats"), "error": error})
        self.echo(f"worker {self.worker_id}: done ({error or 'ok'}); waiting for the master")
        # Stay reachable for the end-of-run clock check; the master says when to go.
        self.finish_event.wait(timeout=60)
        return 0 if error is None else 1

    def _read_child(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            kind = event.get("event")
            if kind == "ready":
                self._send("bench_ready", {"worker_id": self.worker_id})
            elif kind == "done":
                self.child_result = event
            elif kind == "error":
                self.child_error = str(event.get("message"))

    def _stream_parts(self) -> None:
        for table, folder in (("requests", REQUESTS_DIR), ("client_monitor", MONITOR_DIR)):
            directory = self.spool / folder
            if not directory.is_dir():
                continue
            for path in sorted(directory.glob("part-*.parquet")):
                key = f"{table}/{path.name}"
                if key in self.sent_parts:
                    continue
                self._send("bench_part", {"table": table, "name": path.name, "data": path.read_bytes()})
                self.sent_parts.add(key)

    def close(self, keep_spool: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        try:
            self.runner.quit()
        finally:
            gevent.sleep(0.1)
            if not keep_spool:
                shutil.rmtree(self.spool, ignore_errors=True)
