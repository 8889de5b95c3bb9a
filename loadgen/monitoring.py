"""Monitoring: the client's own health, sampled while it runs.

Every ``interval_s`` the ``Monitor`` writes one ``client_monitor`` row (event-loop lag,
process CPU, load counters), lets ``on_tick`` hand due rows to the writer thread, and
updates the progress line. The analysis reads the rows to judge, window by window,
whether the client itself was the bottleneck.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from bench_llm.loadgen.options import RunStats
from bench_llm.loadgen.progress import Progress
from bench_llm.results.writer import MonitorWriter

_now = time.perf_counter_ns

#: Time between two updates of the progress line.
PROGRESS_EVERY_NS = 250_000_000


class Monitor:
    """Samples the client's health (``run`` until cancelled; ``sample`` once)."""

    def __init__(
        self,
        stats: RunStats,
        writer: MonitorWriter | None,
        worker_id: int,
        interval_s: float,
        progress: Progress | None = None,
        on_tick: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.stats = stats
        self.writer = writer
        self.worker_id = worker_id
        self.interval_s = interval_s
        self.progress = progress
        self._on_tick = on_tick

    async def run(self) -> None:
        interval = self.interval_s
        next_progress = 0
        while True:
            before = _now()
            await asyncio.sleep(interval)
            after = _now()
            self.sample(after, max(0, after - before - int(interval * 1e9)))
            if self._on_tick is not None:
                await self._on_tick()
            if self.progress is not None and after >= next_progress:
                s = self.stats
                self.progress.update(s.completed + s.failed + s.cancelled, s.in_flight, s.failed)
                next_progress = after + PROGRESS_EVERY_NS

    def sample(self, ts_ns: int, loop_lag_ns: int | None) -> None:
        """One self-monitoring row: event-loop lag, process CPU, load counters."""
        mw = self.writer
        if mw is None:
            return
        s = self.stats
        mw.add(
            {
                "worker_id": self.worker_id,
                "ts_ns": ts_ns,
                "loop_lag_ns": loop_lag_ns,
                "cpu_s": time.process_time(),
                "in_flight": s.in_flight,
                "sent": s.sent,
                "completed": s.completed + s.failed + s.cancelled,
            }
        )
