"""Multi-process load generation on one machine (``bench run --workers N``).

One asyncio process has one core and one GIL; past some tens of thousands of chunks a
second its own queueing shows up in every timestamp. The schedule is computed once by
the parent, split by intended send time (``loadgen.split``), and each worker process
runs its share with its own runner, transport and writers, writing its own
``requests/part-<worker>-*`` and ``client_monitor/part-<worker>-*`` files into the same
run folder (rows carry ``worker_id``); readers see one dataset. The parent writes
``run.parquet``.

Start-up: every worker imports, connects nothing yet, and runs its warm-up (only
worker 0 has any); when all are ready the parent picks one t0 on CLOCK_MONOTONIC (the
clock ``perf_counter_ns`` reads, shared by every process on the host) and each worker
starts its measured share at that instant (``RunOptions.start_at_ns``). Workers are
pinned one per core when the allowed CPU set has enough cores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import os
import signal
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench_llm.adapters.base import Adapter
from bench_llm.loadgen.options import RunOptions, RunStats
from bench_llm.loadgen.recording import warm_up_writer
from bench_llm.loadgen.runner import Runner
from bench_llm.loadgen.split import split_schedule
from bench_llm.loadgen.transport import Preconnecting, Timeouts
from bench_llm.loadgen.transports import make_transport
from bench_llm.results.writer import MonitorWriter, RequestsWriter
from bench_llm.workloads.spec import Schedule

#: Time between "all workers ready" and t0, so no worker starts late.
START_LEAD_NS = 200_000_000


@dataclass(frozen=True)
class WorkerJob:
    run_dir: Path
    run_id: str
    worker_id: int
    schedule: Schedule
    adapter: Adapter
    url: str
    timeouts: Timeouts
    transport: str
    clock: str
    options: RunOptions
    cpu: int | None


def plan_cpus(n: int) -> list[int | None]:
    """One core per worker when the allowed set has at least ``n`` cores, else no pinning."""
    if not hasattr(os, "sched_getaffinity"):
        return [None] * n
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < n:
        return [None] * n
    return [cpus[w] for w in range(n)]


def _with_requests(schedule: Schedule, requests: Sequence[Any]) -> Schedule:
    return dataclasses.replace(schedule, requests=tuple(requests))


def _worker_main(job: WorkerJob, conn: Connection) -> None:
    """Entry point of one worker process."""
    if job.cpu is not None:
        try:
            os.sched_setaffinity(0, {job.cpu})
        except OSError:
            pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it sends SIGTERM
    from bench_llm.core.eventloop import run_async

    try:
        stats = run_async(lambda: _worker_async(job, conn))
        conn.send(("done", stats))
    except BaseException as exc:  # report, never hang the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


async def _worker_async(job: WorkerJob, conn: Connection) -> RunStats:
    loop = asyncio.get_running_loop()
    transport = make_transport(job.transport, job.url, job.timeouts, job.clock)
    writer = RequestsWriter(job.run_dir, job.run_id, worker_id=job.worker_id)
    monitor = MonitorWriter(job.run_dir, worker_id=job.worker_id)
    base = dataclasses.replace(job.options, worker_id=job.worker_id, progress=False)
    current: list[Runner] = []
    stopped = asyncio.Event()

    def on_term() -> None:
        stopped.set()
        for r in current:
            r.stop.set()

    loop.add_signal_handler(signal.SIGTERM, on_term)
    try:
        warm = job.schedule.warmup
        if warm:
            runner = Runner(_with_requests(job.schedule, warm), job.adapter, transport, writer, monitor, base)
            current[:] = [runner]
            await runner.run()
        warm_up_writer()  # pyarrow's lazy imports take seconds: before t0, not after
        if isinstance(transport, Preconnecting) and job.schedule.mode == "closed":
            # before t0, not after it: the warm-up's connections may be too old to reuse
            await transport.preconnect(max(1, job.schedule.concurrency or 1))
        conn.send(("ready", transport.describe()))
        t0 = await asyncio.to_thread(conn.recv)
        runner = Runner(
            _with_requests(job.schedule, job.schedule.measured),
            job.adapter,
            transport,
            writer,
            monitor,
            dataclasses.replace(base, start_at_ns=t0),
        )
        current[:] = [runner]
        if stopped.is_set():
            runner.stop.set()
        stats = await runner.run()
        stats.error_types = dict(stats.error_types)  # type: ignore[assignment]
        return stats
    finally:
        await transport.close()


class WorkerPool:
    """Runs a schedule over ``n`` worker processes; ``stop`` ends them cleanly."""

    def __init__(
        self,
        run_dir: Path,
        run_id: str,
        schedule: Schedule,
        adapter: Adapter,
        url: str,
        timeouts: Timeouts,
        n: int,
        transport: str = "auto",
        clock: str = "auto",
        options: RunOptions = RunOptions(),
    ) -> None:
        self.n = n
        self.cpus = plan_cpus(n)
        parts = split_schedule(schedule, n)
        self.jobs = [
            WorkerJob(run_dir, run_id, w, parts[w], adapter, url, timeouts, transport, clock, options, self.cpus[w])
            for w in range(n)
        ]
        self.stop = asyncio.Event()
        self.transport_info: dict[str, Any] = {}
        self._procs: list[Any] = []

    def _terminate(self) -> None:
        for p in self._procs:
            if p.is_alive():
                try:
                    os.kill(p.pid, signal.SIGTERM)
                except OSError:
                    pass

    async def run(self) -> RunStats:
        ctx = mp.get_context("spawn")
        conns: list[Connection] = []
        for job in self.jobs:
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(job, child_end), name=f"bench-worker-{job.worker_id}", daemon=True)
            proc.start()
            child_end.close()
            self._procs.append(proc)
            conns.append(parent_end)
        watcher = asyncio.ensure_future(self._watch_stop())
        results: list[RunStats] = []
        errors: list[str] = []
        try:
            ready = await asyncio.gather(*(asyncio.to_thread(_recv, c) for c in conns))
            for kind, payload in ready:
                if kind == "ready":
                    self.transport_info = payload
                else:
                    errors.append(str(payload))
            t0 = time.perf_counter_ns() + START_LEAD_NS
            for c, (kind, _) in zip(conns, ready):
                if kind == "ready":
                    c.send(t0)
            done = await asyncio.gather(*(asyncio.to_thread(_recv, c) for c, (k, _) in zip(conns, ready) if k == "ready"))
            for kind, payload in done:
                if kind == "done":
                    results.append(payload)
                else:
                    errors.append(str(payload))
        finally:
            watcher.cancel()
            for p in self._procs:
                await asyncio.to_thread(p.join, 30)
                if p.is_alive():
                    p.kill()
        if errors:
            from bench_llm.core.errors import BenchError

            raise BenchError(f"load worker failed: {errors[0]}")
        return merge_stats(results, self.stop.is_set())

    async def _watch_stop(self) -> None:
        await self.stop.wait()
        self._terminate()


def _recv(conn: Connection) -> tuple[str, Any]:
    try:
        return conn.recv()  # type: ignore[no-any-return]
    except EOFError:
        return ("error", "worker process exited without a result")


def merge_stats(parts: Sequence[RunStats], interrupted: bool = False) -> RunStats:
    """One RunStats for the whole run (max_in_flight is the sum of the workers' maxima)."""
    out = RunStats()
    errors: dict[str, int] = defaultdict(int)
    for s in parts:
        out.sent += s.sent
        out.completed += s.completed
        out.failed += s.failed
        out.cancelled += s.cancelled
        out.max_in_flight += s.max_in_flight
        out.payloads_compiled += s.payloads_compiled
        out.payloads_python += s.payloads_python
        out.warmup_excluded += s.warmup_excluded
        out.cooldown_excluded += s.cooldown_excluded
        out.t0_ns = s.t0_ns if not out.t0_ns else min(out.t0_ns, s.t0_ns)
        out.end_ns = max(out.end_ns, s.end_ns)
        out.interrupted = out.interrupted or s.interrupted
        for k, v in dict(s.error_types).items():
            errors[k] += v
    out.interrupted = out.interrupted or interrupted
    out.error_types = errors
    return out
