"""The master node, on locust's MasterRunner (this module imports locust: gevent patches).

locust carries the coordination: worker discovery and heartbeats, and bench's custom
messages (clock ping-pong, jobs, start/stop, streamed part files). No locust users are
spawned; the requests are sent and timed by each worker's asyncio measuring process.

Messages (worker -> master): bench_hello, bench_pong, bench_ready, bench_status,
bench_part, bench_done. (master -> worker): bench_ping, bench_job, bench_start,
bench_stop, bench_finish.
"""

from __future__ import annotations

# ruff: noqa: I001  (locust is imported first: gevent monkey-patches the standard library)

import locust  # noqa: F401  (monkey-patches the standard library first)

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
from gevent.event import AsyncResult, Event
from locust.env import Environment

from bench_llm.bench.distributed.assemble import PartRejected, RunAssembly
from bench_llm.bench.distributed.clock import ClockSample, OffsetEstimate, boot_id, estimate_offset
from bench_llm.bench.distributed.wire import ClientSettings, schedule_to_wire
from bench_llm.core.errors import BenchError
from bench_llm.loadgen.split import split_schedule
from bench_llm.workloads.spec import Schedule

log = logging.getLogger("bench_llm.bench.distributed")
_now = time.perf_counter_ns

#: A clock offset error bound or end-of-run drift above this is worth a note.
CLOCK_NOTE_NS = 1_000_000


@dataclass
class WorkerState:
    client_id: str
    host: str
    boot_id: str
    pid: int
    worker_id: int = -1
    state: str = "connected"  # connected | assigned | ready | running | done | failed | lost
    last_seen_ns: int = field(default_factory=_now)
    same_clock: bool = False
    clock_start: OffsetEstimate | None = None
    clock_end: OffsetEstimate | None = None
    applied_offset_ns: int = 0
    scheduled: int = 0
    stats: dict[str, Any] | None = None
    error: str | None = None
    lost_after_s: float | None = None


@dataclass(frozen=True)
class MasterSettings:
    workers: int
    bind_host: str = "127.0.0.1"
    port: int = 5557
    wait_workers_s: float = 120.0
    ready_timeout_s: float = 300.0
    start_lead_s: float = 1.0
    worker_timeout_s: float = 10.0
    clock_samples: int = 15


class MasterNode:
    def __init__(self, settings: MasterSettings, echo: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.echo = echo
        self.env = Environment(user_classes=[])
        self.runner = self.env.create_master_runner(settings.bind_host, settings.port)
        self.workers: dict[str, WorkerState] = {}
        self.assembly: RunAssembly | None = None
        self.stop_requested = Event()
        self._pongs: dict[tuple[str, int], AsyncResult] = {}
        self._changed = Event()
        for name, handler in (
            ("bench_hello", self._on_hello),
            ("bench_pong", self._on_pong),
            ("bench_ready", self._on_ready),
            ("bench_status", self._on_status),
            ("bench_part", self._on_part),
            ("bench_done", self._on_done),
        ):
            self.runner.register_message(name, handler)

    # -- message handlers (run in locust's listener greenlet: keep them short) ---------
    def _on_hello(self, environment: Environment, msg: Any) -> None:
        d = msg.data or {}
        if msg.node_id not in self.workers:
            self.workers[msg.node_id] = WorkerState(msg.node_id, str(d.get("host")), str(d.get("boot_id")), int(d.get("pid", 0)))
        self._changed.set()

    def _on_pong(self, environment: Environment, msg: Any) -> None:
        recv = _now()
        result = self._pongs.pop((msg.node_id, int(msg.data["seq"])), None)
        if result is not None:
            result.set((recv, int(msg.data["worker_ns"])))

    def _seen(self, node_id: str) -> WorkerState | None:
        w = self.workers.get(node_id)
        if w is not None and w.state != "lost":
            w.last_seen_ns = _now()
        return w

    def _on_ready(self, environment: Environment, msg: Any) -> None:
        w = self._seen(msg.node_id)
        if w is not None and w.state == "assigned":
            w.state = "ready"
            self._changed.set()

    def _on_status(self, environment: Environment, msg: Any) -> None:
        self._seen(msg.node_id)

    def _on_part(self, environment: Environment, msg: Any) -> None:
        w = self._seen(msg.node_id)
        if w is None or self.assembly is None or w.worker_id < 0:
            return
        d = msg.data
        try:
            self.assembly.add_part(w.worker_id, str(d["table"]), str(d["name"]), bytes(d["data"]))
        except PartRejected as exc:
            self.echo(f"warning: {exc}")

    def _on_done(self, environment: Environment, msg: Any) -> None:
        w = self._seen(msg.node_id)
        if w is None or w.state == "lost":
            return
        d = msg.data or {}
        w.stats = d.get("stats")
        w.error = d.get("error")
        w.state = "failed" if w.error else "done"
        self._changed.set()

    # -- steps ---------------------------------------------------------------------
    def wait_for_workers(self) -> list[WorkerState]:
        n = self.settings.workers
        deadline = time.monotonic() + self.settings.wait_workers_s
        self.echo(f"master: waiting for {n} worker(s) on {self.settings.bind_host}:{self.settings.port} ...")
        while len(self.workers) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.stop_requested.is_set():
                raise BenchError(f"only {len(self.workers)} of {n} workers connected within {self.settings.wait_workers_s:g} s")
            self._changed.clear()
            self._changed.wait(timeout=min(remaining, 0.5))
        chosen = list(self.workers.values())[:n]
        for wid, w in enumerate(chosen):
            w.worker_id = wid
        for extra in list(self.workers.values())[n:]:
            self.runner.send_message("bench_finish", {"reason": "more workers than needed"}, client_id=extra.client_id)
            del self.workers[extra.client_id]
        return chosen

    def measure_clock(self, w: WorkerState) -> OffsetEstimate | None:
        samples: list[ClockSample] = []
        for seq in range(self.settings.clock_samples):
            result: AsyncResult = AsyncResult()
            self._pongs[(w.client_id, seq)] = result
            sent = _now()
            self.runner.send_message("bench_ping", {"seq": seq}, client_id=w.client_id)
            try:
                recv, worker_ns = result.get(timeout=2.0)
            except gevent.Timeout:
                self._pongs.pop((w.client_id, seq), None)
                continue
            samples.append(ClockSample(sent, worker_ns, recv))
        return estimate_offset(samples) if samples else None

    def run(self, schedule: Schedule, client: ClientSettings, out: Path, base_meta: dict[str, Any]) -> RunAssembly:
        workers = self.wait_for_workers()
        my_boot = boot_id()
        for w in workers:
            w.same_clock = w.boot_id == my_boot
            w.clock_start = self.measure_clock(w)
            if w.clock_start is None:
                raise BenchError(f"worker {w.worker_id} ({w.host}) did not answer clock pings")
            w.applied_offset_ns = 0 if w.same_clock else w.clock_start.offset_ns
        run_id = uuid.uuid4().hex[:16]
        self.assembly = RunAssembly(out, run_id, schedule, base_meta)
        try:
            self._run(schedule, client, run_id, workers)
        except BenchError as exc:
            # the folder must not claim to be running: record why it failed
            extra = {"distributed": {"workers": [_worker_record(w, 0) for w in workers]}}
            self.assembly.finish("failed", {"notes": [], "warnings": [str(exc)]}, extra, 0)
            raise
        return self.assembly

    def _run(self, schedule: Schedule, client: ClientSettings, run_id: str, workers: list[WorkerState]) -> None:
        shares = split_schedule(schedule, len(workers))
        for w, share in zip(workers, shares):
            w.scheduled = len(share.measured)
            w.state = "assigned"
            w.last_seen_ns = _now()
            job = {
                "run_id": run_id,
                "worker_id": w.worker_id,
                "client": client.to_wire(),
                "schedule": schedule_to_wire(share),
                "shift_ns": -w.applied_offset_ns,
            }
            self.runner.send_message("bench_job", job, client_id=w.client_id)
        self.echo(f"master: run {run_id}: {len(schedule.measured)} requests split over {len(workers)} workers")
        self._wait_ready(workers)
        ready = [w for w in workers if w.state == "ready"]
        t0 = _now() + int(self.settings.start_lead_s * 1e9)
        for w in ready:
            w.state = "running"
            w.last_seen_ns = _now()
            self.runner.send_message("bench_start", {"start_at_ns": t0 + w.applied_offset_ns}, client_id=w.client_id)
        self.echo(f"master: started {len(ready)} worker(s)")
        self._supervise(workers, t0)
        for w in workers:
            if w.state == "done":
                w.clock_end = self.measure_clock(w)
        for w in workers:
            if w.state != "lost":
                self.runner.send_message("bench_finish", {"reason": "run complete"}, client_id=w.client_id)
        self._finish(workers, t0)

    def _wait_ready(self, workers: list[WorkerState]) -> None:
        deadline = time.monotonic() + self.settings.ready_timeout_s
        while any(w.state == "assigned" for w in workers):
            self._mark_lost(workers, t0=None)
            if time.monotonic() > deadline:
                for w in workers:
                    if w.state == "assigned":
                        w.state, w.error = "failed", f"not ready within {self.settings.ready_timeout_s:g} s"
                break
            if self.stop_requested.is_set():
                raise BenchError("stopped before the run started")
            self._changed.clear()
            self._changed.wait(timeout=0.2)
        if not any(w.state == "ready" for w in workers):
            errors = "; ".join(f"worker {w.worker_id}: {w.error or w.state}" for w in workers)
            raise BenchError(f"no worker became ready ({errors})")

    def _mark_lost(self, workers: list[WorkerState], t0: int | None) -> None:
        limit = int(self.settings.worker_timeout_s * 1e9)
        now = _now()
        for w in workers:
            if w.state in ("assigned", "ready", "running") and now - w.last_seen_ns > limit:
                w.state = "lost"
                w.lost_after_s = (w.last_seen_ns - t0) / 1e9 if t0 is not None else None
                w.error = f"no message for {self.settings.worker_timeout_s:g} s"
                self.echo(f"master: WARNING worker {w.worker_id} ({w.host}) lost: {w.error}")

    def _supervise(self, workers: list[WorkerState], t0: int) -> None:
        stop_sent = False
        while any(w.state == "running" for w in workers):
            self._mark_lost(workers, t0)
            if self.stop_requested.is_set() and not stop_sent:
                stop_sent = True
                for w in workers:
                    if w.state == "running":
                        self.runner.send_message("bench_stop", {}, client_id=w.client_id)
            self._changed.clear()
            self._changed.wait(timeout=0.2)

    def _finish(self, workers: list[WorkerState], t0: int) -> None:
        assert self.assembly is not None
        measured = self.assembly.measured_by_worker()
        total_scheduled = sum(w.scheduled for w in workers)
        total_recorded = sum(measured.values())
        warnings: list[str] = []
        notes: list[str] = []
        for w in workers:
            rec = measured.get(w.worker_id, 0)
            if w.state == "lost":
                when = f" {w.lost_after_s:.1f} s into the run" if w.lost_after_s is not None else ""
                warnings.append(
                    f"worker {w.worker_id} ({w.host}) lost{when} ({w.error}): {rec} of its {w.scheduled} "
                    "requests recorded; its in-flight and unflushed requests are missing"
                )
            elif w.state == "failed":
                warnings.append(f"worker {w.worker_id} ({w.host}) failed ({w.error}): {rec} of its {w.scheduled} requests recorded")
            if not w.same_clock and w.clock_start is not None:
                drift = _drift(w)
                if w.clock_start.rtt_ns // 2 > CLOCK_NOTE_NS or (drift is not None and abs(drift) > CLOCK_NOTE_NS):
                    notes.append(
                        f"worker {w.worker_id} clock: offset error bound {w.clock_start.rtt_ns / 2e6:.2f} ms, "
                        f"drift {'-' if drift is None else f'{drift / 1e6:.2f}'} ms; cross-worker timings carry that error"
                    )
        interrupted = any(bool((w.stats or {}).get("interrupted")) for w in workers if w.state == "done")
        short = total_recorded < total_scheduled
        if any(w.state in ("lost", "failed") for w in workers) or (short and not interrupted):
            pct = 100.0 * total_recorded / total_scheduled if total_scheduled else 0.0
            warnings.append(
                f"offered load fell short: {total_recorded} of {total_scheduled} scheduled requests recorded "
                f"({pct:.0f}%); rates and latencies describe a lower load than the workload asked for"
            )
        if interrupted:
            notes.append("run interrupted: in-flight requests recorded as cancelled")
        stats = [w.stats or {} for w in workers]
        notes_json = {
            "notes": notes,
            "warnings": warnings,
            "offered_load_short": short,
            "sent": sum(int(s.get("sent", 0)) for s in stats),
            "completed": sum(int(s.get("completed", 0)) for s in stats),
            "failed": sum(int(s.get("failed", 0)) for s in stats),
            "cancelled": sum(int(s.get("cancelled", 0)) for s in stats),
            "max_in_flight": sum(int(s.get("max_in_flight", 0)) for s in stats),
            "t0_ns": t0,
            "end_ns": max([int(s["end_ns"]) for s in stats if "end_ns" in s] or [_now()]),
        }
        extra = {
            "distributed": {
                "coordinator": "locust",
                "locust_version": locust.__version__,
                "master": {"boot_id": boot_id(), "bind": f"{self.settings.bind_host}:{self.settings.port}"},
                "start_lead_s": self.settings.start_lead_s,
                "workers": [_worker_record(w, measured.get(w.worker_id, 0)) for w in workers],
            }
        }
        self.assembly.finish("interrupted" if interrupted else "complete", notes_json, extra, t0)
        for line in warnings:
            self.echo(f"master: WARNING {line}")

    def close(self) -> None:
        """Release every worker (also after an error) and stop locust."""
        for w in self.workers.values():
            if w.state != "lost":
                self.runner.send_message("bench_finish", {"reason": "master stopped"}, client_id=w.client_id)
        try:
            self.runner.quit()
        finally:
            gevent.sleep(0.1)


def _drift(w: WorkerState) -> int | None:
    if w.clock_start is None or w.clock_end is None:
        return None
    return w.clock_end.offset_ns - w.clock_start.offset_ns


def _worker_record(w: WorkerState, recorded: int) -> dict[str, Any]:
    return {
        "worker_id": w.worker_id,
        "host": w.host,
        "boot_id": w.boot_id,
        "pid": w.pid,
        "status": w.state,
        "error": w.error,
        "scheduled": w.scheduled,
        "recorded": recorded,
        "same_clock": w.same_clock,
        "applied_offset_ns": w.applied_offset_ns,
        "clock_start": w.clock_start.as_dict() if w.clock_start else None,
        "clock_end": w.clock_end.as_dict() if w.clock_end else None,
        "drift_ns": _drift(w),
        "stats": w.stats,
    }
