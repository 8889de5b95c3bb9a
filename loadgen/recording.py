"""Recording: ended requests into rows, off the read path.

``Recording`` owns what happens after a request ended: its record is built and handed
to the writer (at once, or through the completion backlog spread over loop iterations),
the run's outcome counters, the writer thread that turns rows into Parquet parts, and
the cyclic GC, paused for the run (``paused_gc``) and run by hand when failures add up.
The dispatch side (``loadgen/dispatch.py``) calls ``finish`` or ``defer``; the monitor
(``loadgen/monitoring.py``) calls ``flush_due`` on its ticks; the runner calls ``close``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from bench_llm.loadgen.options import RunOptions, RunStats
from bench_llm.loadgen.recorder import RequestRecorder
from bench_llm.loadgen.transport import StreamError
from bench_llm.results.record import RequestRecord
from bench_llm.results.writer import _RECORD_FIELDS, MonitorWriter, PartWriter, RequestsWriter

_now = time.perf_counter_ns


class Recording:
    """Records ended requests and writes the run's rows (see the module docstring)."""

    #: Time spent recording finished requests per loop iteration (at least one request,
    #: 0.1-0.4 ms for 256 tokens): when a whole batch of streams ends in the same engine
    #: step, their records are spread over iterations so that socket reads (and their
    #: stamps) and the sends of freed closed-loop slots come in between.
    FINISH_BUDGET_NS = 100_000
    #: Ended requests waiting to be recorded beyond which they are recorded at once (at
    #: least twice the closed loop's slots, so one engine step's completions never are).
    FINISH_BACKLOG_MAX = 4096
    #: Failed requests after which the paused cyclic GC runs once.
    #: A failure leaves reference cycles (exceptions, their tracebacks and frames, asyncio's
    #: tasks and timers: ~12 KB each); with the GC paused for the run, a server that fails
    #: every request would otherwise grow the client's memory without bound.
    FAILURES_PER_COLLECT = 1024

    def __init__(
        self,
        writer: RequestsWriter,
        monitor_writer: MonitorWriter | None,
        stats: RunStats,
        requires_done: bool = True,
        save_text: bool = False,
        concurrency: int = 0,
        options: RunOptions | None = None,
    ) -> None:
        self.writer = writer
        #: The time-based warm-up and cool-down, when the run has either.
        self._windows = options if options is not None and (options.warmup_s or options.cooldown_s) else None
        self.monitor_writer = monitor_writer
        self.stats = stats
        self._requires_done = requires_done
        self._save_text = save_text
        #: Ended requests waiting to be recorded: (recorder, end ns, error).
        self.backlog: deque[tuple[RequestRecorder, int, StreamError | None]] = deque()
        self._backlog_max = max(self.FINISH_BACKLOG_MAX, 2 * concurrency)
        self._failed_since_collect = 0
        self._writes: set[asyncio.Future[None]] = set()
        self._writing: set[PartWriter] = set()
        self._write_pool: ThreadPoolExecutor | None = None
        self._write_error: BaseException | None = None
        #: Called once, at the first write that fails (a full disk): the runner stops the run,
        #: which keeps what was written (``Runner``).
        self.on_write_error: Callable[[], None] | None = None

    # -- one ended request ------------------------------------------------------------
    def finish(self, recorder: RequestRecorder, end: int, error: StreamError | None) -> RequestRecord:
        """Build the record of an ended request, hand it to the writer, count it."""
        record = recorder.finish(end, error, self._requires_done, self._save_text)
        if self._windows is not None and record.phase == "measure":
            phase = self._windows.phase_at(self.stats.t0_ns, record.intended_send_ns)
            if phase is not None:
                record = dataclasses.replace(record, phase=phase)
        writer = self.writer
        if isinstance(writer, PartWriter):
            # The per-chunk lists go to the writer as numpy arrays: pyarrow converts those
            # with a copy, where lists of Python ints cost ms per flush with the GIL held
            # (stalling the event loop, and every user-clock stamp, for that long).
            row = {name: getattr(record, name) for name in _RECORD_FIELDS}
            row["chunk_ns"] = np.array(record.chunk_ns, dtype=np.int64)
            row["chunk_tokens"] = np.array(record.chunk_tokens, dtype=np.int32)
            writer.add(row)
        else:
            writer.add_record(record)
        stats = self.stats
        compiled, python = recorder.payloads_read
        stats.payloads_compiled += compiled
        stats.payloads_python += python
        if record.phase == "warmup":
            stats.warmup_excluded += 1
        elif record.phase == "cooldown":
            stats.cooldown_excluded += 1
        if record.ok:
            stats.completed += 1
        elif record.error_type == "cancelled":
            stats.cancelled += 1
        else:
            stats.failed += 1
            stats.error_types[record.error_type or "unknown"] += 1
        if not record.ok:
            self._failed_since_collect += 1
            if self._failed_since_collect >= self.FAILURES_PER_COLLECT:
                self._collect_garbage()
        return record

    def defer(self, recorder: RequestRecorder, end: int, error: StreamError | None) -> None:
        """Record an ended request a loop iteration later (within the per-iteration
        budget), so the sends its freed slot makes are not delayed by the bookkeeping."""
        backlog = self.backlog
        if not backlog:
            asyncio.get_running_loop().call_soon(self.finish_pending)
        backlog.append((recorder, end, error))
        if len(backlog) > self._backlog_max:
            # Requests end faster than the budget records them: a server that fails
            # every request at once (refused, 5xx) in a closed loop. Record them now,
            # so the backlog, and memory, stay bounded.
            self.finish_pending(budget_ns=None)

    def finish_pending(self, budget_ns: int | None = FINISH_BUDGET_NS) -> None:
        """Record finished requests, for at most ``budget_ns`` (at least one request)."""
        pending = self.backlog
        finish = self.finish
        if budget_ns is None:
            while pending:
                finish(*pending.popleft())
            return
        deadline = _now() + budget_ns
        while pending:
            finish(*pending.popleft())
            if _now() >= deadline:
                break
        if pending:
            asyncio.get_running_loop().call_soon(self.finish_pending)

    def _collect_garbage(self) -> None:
        """A full collection of what the run allocated (what it froze at its start is never
        scanned; a young-generation collection would promote a failing request's live
        cycle, which then dies where only a full one finds it). It pauses the loop in
        proportion to the objects alive (ms in a failure storm); the pause shows in the
        event-loop lag the monitor records."""
        self._failed_since_collect = 0
        gc.collect()

    # -- the writer thread --------------------------------------------------------------
    async def flush_due(self, force: bool = False) -> None:
        """Hand due rows to the writer thread. The monitor does not wait for the write
        (its samples keep their cadence); a writer with a write in progress keeps its
        rows until the next tick. ``force`` (the end of the run) waits."""
        for w in (self.writer, self.monitor_writer):
            if w is None or not (force or w.due) or (not force and w in self._writing):
                continue
            rows = w.take()
            if not rows:
                continue
            if self._write_pool is None:
                self._write_pool = ThreadPoolExecutor(1, "bench-writer", _background_priority)
            # Tracked: cancelling the monitor at the end of a run must not lose a write
            # whose rows were already taken; the run awaits every tracked write.
            write = asyncio.get_running_loop().run_in_executor(self._write_pool, PartWriter.write, w, rows)
            self._writes.add(write)
            self._writing.add(w)
            write.add_done_callback(functools.partial(self._write_done, w))
            if force:
                await asyncio.shield(write)

    def _write_done(self, writer: PartWriter, write: asyncio.Future[None]) -> None:
        self._writes.discard(write)
        self._writing.discard(writer)
        if not write.cancelled() and write.exception() is not None and self._write_error is None:
            self._write_error = write.exception()
            if self.on_write_error is not None:
                self.on_write_error()

    async def settle(self) -> None:
        """The end of the run, once nothing else writes: await the writes in progress
        (their errors are kept), record the backlog."""
        await asyncio.gather(*self._writes, return_exceptions=True)
        self.finish_pending(budget_ns=None)

    async def close(self) -> None:
        """Write every row left and stop the writer thread; a write's error is raised."""
        try:
            await self.flush_due(force=True)
        finally:
            if self._write_pool is not None:
                self._write_pool.shutdown(wait=False)

    def raise_write_error(self) -> None:
        if self._write_error is not None:
            raise self._write_error


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector stops the loop for tens of ms once hundreds of
    thousands of chunk events are alive; the hot path makes no cycles, so it is paused
    for the run (and what was allocated before is frozen out of its view)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


#: Nice value of the Parquet writer thread. Low enough that the event loop preempts a
#: write at once when they share a core, high enough that a busy loop cannot starve the
#: writer (nice 10 still gets ~10 % of a contended core; the flush bound must hold).
WRITER_NICE = 10


def _background_priority() -> None:
    """Lower the Parquet writer thread's CPU priority (Linux: per thread). When the client
    shares a core with it, the event loop then preempts a write instead of waiting out its
    time slice (a 256-row part costs ~8 ms of CPU), so user-space stamps are not delayed."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
    except (AttributeError, OSError):
        pass


def warm_up_writer() -> None:
    """Write one empty Parquet table in memory: the first real flush otherwise pays for
    pyarrow's lazy imports (hundreds of ms) in the middle of the measurement."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench_llm.results.schema import REQUESTS_SCHEMA

    pq.write_table(REQUESTS_SCHEMA.empty_table(), pa.BufferOutputStream(), compression="zstd")
