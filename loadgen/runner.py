"""The asyncio load runner: open loop by intended send time, or closed loop at N in flight.

Written once for every engine, in three parts, each in its own module:
``loadgen/dispatch.py`` turns the schedule into requests in flight (the adapter builds
each call, the transport sends it, a recorder receives it); ``loadgen/recording.py``
turns ended requests into rows (the completion backlog, the writer thread, GC control);
``loadgen/monitoring.py`` samples the client's health. ``Runner`` wires them for one
run: warm-up, t0, the measured schedule, the stop, and a flush of everything recorded.
A failed request is a row.
"""

from __future__ import annotations

import asyncio
import sys
import time

from bench_llm.adapters.base import Adapter
from bench_llm.loadgen.dispatch import Dispatcher, _sleep_until, _turn_messages
from bench_llm.loadgen.monitoring import Monitor
from bench_llm.loadgen.options import RunOptions, RunStats
from bench_llm.loadgen.progress import Progress
from bench_llm.loadgen.recorder import DigestQueue
from bench_llm.loadgen.recording import Recording, paused_gc, warm_up_writer
from bench_llm.loadgen.transport import Preconnecting, Transport
from bench_llm.results.writer import MonitorWriter, RequestsWriter
from bench_llm.workloads.spec import Schedule

__all__ = ["RunOptions", "RunStats", "Runner", "_sleep_until", "_turn_messages", "_warm_up_writer"]

_now = time.perf_counter_ns
_warm_up_writer = warm_up_writer

#: The GIL switch interval during a run: the Parquet flush runs in a thread, and a shorter
#: interval bounds how long it can hold the event loop off (the default 5 ms would show up
#: in timestamps).
SWITCH_INTERVAL_S = 0.0005


class Runner:
    """One run of a schedule (``run``); ``stop.set()`` ends it early, recording what is in flight."""

    def __init__(
        self,
        schedule: Schedule,
        adapter: Adapter,
        transport: Transport,
        writer: RequestsWriter,
        monitor_writer: MonitorWriter | None = None,
        options: RunOptions = RunOptions(),
    ) -> None:
        self.schedule = schedule
        self.transport = transport
        self.options = options
        self.stats = RunStats()
        self.stop = asyncio.Event()
        self.recording = Recording(
            writer,
            monitor_writer,
            self.stats,
            requires_done=getattr(adapter, "requires_done", True),
            save_text=options.save_text,
            concurrency=schedule.concurrency or 0,
            options=options,
        )
        self.recording.on_write_error = self.stop.set  # a full disk ends the run; what was written stays
        self.dispatch = Dispatcher(schedule, adapter, transport, self.recording, self.stats, options, self.stop)
        self.monitor = Monitor(
            self.stats, monitor_writer, options.worker_id, options.monitor_interval_s, on_tick=self.recording.flush_due
        )

    async def run(self) -> RunStats:
        """Warm-up, then the measured schedule. Always flushes what was recorded."""
        sched = self.schedule
        progress = Progress(len(sched.requests), sched.name, enabled=self.options.progress)
        self.monitor.progress = progress
        loop = asyncio.get_running_loop()
        # Parse one iteration later: slots freed in this iteration send their next
        # request first (their tasks were woken before the drain is queued).
        self.dispatch.digest_queue = DigestQueue(lambda drain: loop.call_soon(loop.call_soon, drain))
        warm_up_writer()
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
        try:
            with paused_gc():
                await self._run_monitored()
        finally:
            progress.close()
            sys.setswitchinterval(switch)
        self.recording.raise_write_error()
        return self.stats

    async def _run_monitored(self) -> None:
        """The run with its monitor beside it; the end flushes every row recorded."""
        monitor = asyncio.ensure_future(self.monitor.run())
        try:
            await self._phases()
        except asyncio.CancelledError:
            self.stats.interrupted = True
            await self.dispatch.cancel_in_flight()
        finally:
            self.stats.end_ns = _now()
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
            # writes the cancelled monitor had started (errors are kept for raise_write_error)
            await self.recording.settle()
            self.monitor.sample(_now(), None)  # a closing sample (CPU and time read together), so short runs have one
            await self.recording.close()

    async def _phases(self) -> None:
        """Warm-up, t0, the measured schedule until it is done or ``stop`` is set."""
        sched = self.schedule
        dispatch = self.dispatch
        if sched.warmup:
            await dispatch.closed(sched.warmup, min(len(sched.warmup), self.options.warmup_concurrency), False)
        if sched.mode == "closed":
            # a closed loop's slots all send at t0: their connections are opened first
            if isinstance(self.transport, Preconnecting):
                await self.transport.preconnect(max(1, sched.concurrency or 1))
        start_at = self.options.start_at_ns
        self.stats.t0_ns = start_at if start_at is not None else _now() + int(self.options.start_lead_s * 1e9)
        body = (
            dispatch.closed(sched.measured, sched.concurrency or 1, True)
            if sched.mode == "closed"
            else dispatch.open(sched.measured)
        )
        work = asyncio.ensure_future(body)
        stopper = asyncio.ensure_future(self.stop.wait())
        done, _ = await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if stopper in done:
            self.stats.interrupted = True
            work.cancel()
            await dispatch.cancel_in_flight(work)
        else:
            stopper.cancel()
            work.result()
