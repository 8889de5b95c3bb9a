"""The asyncio load runner: open loop by intended send time, or closed loop at N in flight.

Written once for every engine: it asks the adapter for the call, hands it to the
transport with a recorder, and writes the record. A failed request is a row.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adapters.base import Adapter, HttpCall
from loadgen.progress import Progress
from loadgen.recorder import MAX_EVENT_BYTES, DigestQueue, RequestRecorder
from loadgen.transport import EagerTransport, Preconnecting, StreamError, Transport
from results.record import RequestRecord
from results.writer import _RECORD_FIELDS, MonitorWriter, PartWriter, RequestsWriter
from workloads.spec import Message, RequestSpec, Schedule

_now = time.perf_counter_ns


class _Started:
    """A request a freed closed-loop slot already sent (``Runner._next_from``)."""

    __slots__ = ("recorder", "call", "exchange", "freed")

    def __init__(self, recorder: RequestRecorder, call: HttpCall, exchange: Any, freed: _Freed) -> None:
        self.recorder = recorder
        self.call = call
        self.exchange = exchange
        self.freed = freed


class _Freed:
    """What a closed-loop slot did when its request completed, inside the read that
    completed it: which spec it took next, when the slot was freed, and the request it
    sent, if it could send at once."""

    __slots__ = ("taken", "spec", "intended", "started")

    def __init__(self) -> None:
        self.taken = False
        self.spec: RequestSpec | None = None
        self.intended = 0
        self.started: _Started | None = None


@dataclass(frozen=True, slots=True)
class RunOptions:
    worker_id: int = 0
    #: Stop sending new requests this long after t0 (None: when the schedule is done).
    duration_s: float | None = None
    #: After ``duration_s``, how long in-flight requests may take before being cancelled
    #: (recorded as such). Without a duration every request runs to its end, bounded by the
    #: transport's per-request deadline (``Timeouts.total``).
    drain_timeout_s: float = 30.0
    #: Longest SSE event (or line) a response may carry (``RequestRecorder``).
    max_event_bytes: int = MAX_EVENT_BYTES
    warmup_concurrency: int = 4
    save_text: bool = False
    progress: bool | None = None
    monitor_interval_s: float = 0.1
    #: Delay between building the plan and t0, so the first sends are not late.
    start_lead_s: float = 0.05
    #: An explicit t0 (``perf_counter_ns``, CLOCK_MONOTONIC: shared by every process on the
    #: host) so several worker processes start their shares of one schedule together.
    start_at_ns: int | None = None


@dataclass(slots=True)
class RunStats:
    sent: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    t0_ns: int = 0
    end_ns: int = 0
    interrupted: bool = False
    error_types: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class Runner:
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
        self.adapter = adapter
        self.transport = transport
        # What the transport can do beyond ``send``, learned once from the contract.
        self._eager: EagerTransport[Any] | None = transport if isinstance(transport, EagerTransport) else None
        self.writer = writer
        self.monitor_writer = monitor_writer
        self.options = options
        self.stats = RunStats()
        self.stop = asyncio.Event()
        self._requires_done = getattr(adapter, "requires_done", True)
        self._tasks: set[asyncio.Task[int | None]] = set()
        sessions: dict[str, list[RequestSpec]] = defaultdict(list)
        for spec in schedule.measured:
            if spec.session_id is not None:
                sessions[spec.session_id].append(spec)
        self._sessions = {k: sorted(v, key=lambda s: s.turn) for k, v in sessions.items()}
        self._progress: Progress | None = None
        self._digest_queue: DigestQueue | None = None
        self._writes: set[asyncio.Future[None]] = set()
        self._writing: set[PartWriter] = set()
        self._write_pool: ThreadPoolExecutor | None = None
        self._write_error: BaseException | None = None
        self._to_finish: deque[tuple[RequestRecorder, int, StreamError | None]] = deque()
        self._backlog_max = max(self.FINISH_BACKLOG_MAX, 2 * (schedule.concurrency or 0))
        self._failed_since_collect = 0

    # -- one request -----------------------------------------------------------------
    async def _execute(
        self,
        spec: RequestSpec,
        intended_ns: int,
        call: HttpCall | None = None,
        history: Sequence[Message] = (),
        started: _Started | None = None,
        next_from: Callable[[], None] | None = None,
    ) -> tuple[RequestRecord | None, str, int]:
        """Send one request (or await one a freed slot already sent: ``started``);
        returns (record, answer text, end ns).

        A request outside a session is closed *after* its freed slot has sent the next
        one (``record`` is then None): the bookkeeping waits one loop iteration rather
        than delaying the next send.
        """
        stats = self.stats
        if started is not None:
            recorder, call = started.recorder, started.call
        else:
            recorder = self._recorder(spec, intended_ns)
            if call is None:
                call = self.adapter.build(spec, history)
            self._count_sent()
        error: StreamError | None = None
        cancelled = False
        eager = self._eager
        try:
            if eager is None:
                await self.transport.send(call, recorder)
            elif started is not None:
                await eager.complete(started.exchange, call, recorder)
            else:
                await eager.send(call, recorder, next_from)
        except StreamError as exc:
            # Kept without its traceback: the traceback holds this frame, which holds
            # ``error``, a cycle that only the (paused) cyclic GC would free.
            error = exc.with_traceback(None)
        except asyncio.CancelledError:
            error = StreamError("cancelled", "cancelled before completion (run stopped)")
            cancelled = True
        except Exception as exc:  # never lose a request to an unexpected client error
            error = StreamError("client_error", f"{type(exc).__name__}: {exc}")
        finally:
            stats.in_flight -= 1
        # A complete response ended with its last bytes; a failed one when it failed.
        last = recorder.last_data_ns
        end = last if error is None and last is not None else _now()
        if spec.session_id is None and not cancelled:
            backlog = self._to_finish
            if not backlog:
                asyncio.get_running_loop().call_soon(self._finish_pending)
            backlog.append((recorder, end, error))
            if len(backlog) > self._backlog_max:
                # Requests end faster than the budget records them: a server that fails
                # every request at once (refused, 5xx) in a closed loop. Record them now,
                # so the backlog, and memory, stay bounded.
                self._finish_pending(budget_ns=None)
            return None, "", end
        record = self._finish(recorder, end, error)
        if cancelled:
            raise asyncio.CancelledError
        return record, recorder.answer_text, end

    def _recorder(self, spec: RequestSpec, intended_ns: int) -> RequestRecorder:
        return RequestRecorder(
            spec,
            self.adapter.parser(),
            self.options.worker_id,
            intended_ns,
            keep_text=spec.session_id is not None or self.options.save_text or spec.constraint is not None,
            queue=self._digest_queue,
            max_event_bytes=self.options.max_event_bytes,
        )

    def _count_sent(self) -> None:
        stats = self.stats
        stats.sent += 1
        stats.in_flight += 1
        if stats.in_flight > stats.max_in_flight:
            stats.max_in_flight = stats.in_flight

    def _next_from(self, freed: _Freed, it: Iterator[RequestSpec], respect_duration: bool) -> None:
        """A closed-loop slot's request completed (called by the transport inside the
        read that completed it, before the slot's task wakes): take the next spec and,
        where an idle connection takes it at once, send it now, so a freed slot reaches
        the server within one ``send`` instead of after every other read of this loop
        iteration. Anything it cannot do here is left to the slot's task (never lost)."""
        if self.stop.is_set() or (respect_duration and self._past_duration()):
            return
        spec = next(it, None)
        freed.taken = True
        freed.spec = spec
        # The slot is free from the moment the client read the response's end: now, inside
        # that read. With the kernel clock the end's own stamp is the kernel's receipt,
        # earlier by however long the data waited to be read (a host pause, the other
        # streams of the same engine step); counting from it would report every burst of
        # completions as a late send. The send lag measures the client's send path, with
        # either clock.
        freed.intended = _now()
        if spec is None or spec.session_id is not None or spec.refused is not None:
            return
        eager = self._eager
        if eager is None:
            return
        try:
            recorder = self._recorder(spec, freed.intended)
            call = self.adapter.build(spec)
            nxt = _Freed()
            ex = eager.start(call, recorder, lambda: self._next_from(nxt, it, respect_duration))
        except Exception:  # the slot's task sends it the usual way
            return
        if ex is not None:
            self._count_sent()
            freed.started = _Started(recorder, call, ex, nxt)

    def _abandon(self, started: _Started) -> None:
        if self._eager is not None:  # (a started request exists only with an eager transport)
            self._eager.abort(started.exchange)
        self.stats.in_flight -= 1
        self._finish(started.recorder, _now(), StreamError("cancelled", "cancelled before completion (run stopped)"))

    def _finish(self, recorder: RequestRecorder, end: int, error: StreamError | None) -> RequestRecord:
        record = recorder.finish(end, error, self._requires_done, self.options.save_text)
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

    #: Failed requests after which the paused cyclic GC runs once.
    #: A failure leaves reference cycles (exceptions, their tracebacks and frames, asyncio's
    #: tasks and timers: ~12 KB each); with the GC paused for the run, a server that fails
    #: every request would otherwise grow the client's memory without bound.
    FAILURES_PER_COLLECT = 1024

    def _collect_garbage(self) -> None:
        """A full collection of what the run allocated (what it froze at its start is never
        scanned; a young-generation collection would promote a failing request's live
        cycle, which then dies where only a full one finds it). It pauses the loop in
        proportion to the objects alive (ms in a failure storm); the pause shows in the
        event-loop lag the monitor records."""
        self._failed_since_collect = 0
        gc.collect()

    #: Time spent recording finished requests per loop iteration (at least one request,
    #: 0.1-0.4 ms for 256 tokens): when a whole batch of streams ends in the same engine
    #: step, their records are spread over iterations so that socket reads (and their
    #: stamps) and the sends of freed closed-loop slots come in between.
    FINISH_BUDGET_NS = 100_000
    #: Ended requests waiting to be recorded beyond which they are recorded at once (at
    #: least twice the closed loop's slots, so one engine step's completions never are).
    FINISH_BACKLOG_MAX = 4096

    def _finish_pending(self, budget_ns: int | None = FINISH_BUDGET_NS) -> None:
        """Record finished requests, for at most ``budget_ns`` (at least one request)."""
        pending = self._to_finish
        finish = self._finish
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
            asyncio.get_running_loop().call_soon(self._finish_pending)

    async def _run_session_from(self, spec: RequestSpec, intended_ns: int, call: HttpCall | None) -> int | None:
        """Send ``spec``; if it opens a session, send the later turns after each answer.

        Returns when the last response ended (``end_ns``): a closed-loop slot is free from
        that moment, so the next request's intended send time is that instant and any
        client overhead before it reaches the socket shows as schedule lag.
        """
        turns = self._sessions.get(spec.session_id or "", [spec]) if spec.session_id else [spec]
        history: list[Message] = []
        start = turns.index(spec) if spec in turns else 0
        end_ns: int | None = None
        for i, turn in enumerate(turns[start:]):
            if self.stop.is_set():
                return end_ns
            if i > 0:
                intended_ns = (end_ns or _now()) + turn.think_time_ns
                await _sleep_until(intended_ns)
                if self.stop.is_set() or self._past_duration():
                    return end_ns
                call = None
            if turn.refused is not None:
                self._record_unsent(turn, intended_ns, "exceeds_context", turn.refused)
                self._skip_later_turns(turns[start + i + 1 :], turn)
                return end_ns
            record, answer, end_ns = await self._execute(turn, intended_ns, call, tuple(history))
            if record is None:
                continue  # not a session: nothing follows
            if not record.ok:
                # a broken turn ends its session; the failure is recorded, and so is every
                # later turn, as skipped (a run never drops a scheduled request silently)
                if record.error_type != "cancelled":
                    self._skip_later_turns(turns[start + i + 1 :], turn)
                return end_ns
            history.extend(_turn_messages(turn))
            history.append(Message("assistant", answer))
        return end_ns

    def _record_unsent(self, spec: RequestSpec, intended_ns: int, error_type: str, message: str) -> None:
        """A failed row for a request that is not sent (no send, byte or token stamp)."""
        self._finish(self._recorder(spec, intended_ns), intended_ns, StreamError(error_type, message))

    def _skip_later_turns(self, later: Sequence[RequestSpec], failed: RequestSpec) -> None:
        now = _now()
        for spec in later:
            why = f"turn {failed.turn} of session {failed.session_id} failed, so its later turns are not sent"
            self._record_unsent(spec, now, "skipped_turn", why)

    def _past_duration(self) -> bool:
        d = self.options.duration_s
        return d is not None and _now() >= self.stats.t0_ns + int(d * 1e9)

    def _spawn(self, coro: Coroutine[Any, Any, int | None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- phases ----------------------------------------------------------------------
    async def _closed(self, specs: Sequence[RequestSpec], concurrency: int, respect_duration: bool) -> None:
        units = [s for s in specs if s.session_id is None or s.turn == min(t.turn for t in self._sessions[s.session_id])]
        it = iter(units)

        if respect_duration:
            await _sleep_until(self.stats.t0_ns)  # the measured phase starts at t0

        sends_at_once = self._eager is not None

        async def slot() -> None:
            intended = _now()
            spec = next(it, None)
            started: _Started | None = None
            while spec is not None:
                if started is None and (self.stop.is_set() or (respect_duration and self._past_duration())):
                    return  # (a request already sent is awaited and recorded first)
                if spec.session_id is not None or not sends_at_once or spec.refused is not None:
                    ended = await self._run_session_from(spec, intended, None)
                    intended = ended if ended is not None else _now()
                    spec = next(it, None)
                    continue
                freed = started.freed if started is not None else _Freed()
                next_from = None if started is not None else (lambda f=freed: self._next_from(f, it, respect_duration))
                try:
                    _, _, end = await self._execute(spec, intended, started=started, next_from=next_from)
                except asyncio.CancelledError:
                    if freed.started is not None:  # sent from the completing read: recorded, not lost
                        self._abandon(freed.started)
                    raise
                if freed.taken:
                    spec, intended, started = freed.spec, freed.intended, freed.started
                else:
                    spec, intended, started = next(it, None), end, None

        slots = asyncio.gather(*(slot() for _ in range(max(1, concurrency))))
        # a Ctrl-C while wait_for drains the slots ends them with CancelledError, which
        # nobody awaits any more: retrieved here, not printed as a traceback at exit
        slots.add_done_callback(_retrieve)
        duration = self.options.duration_s
        if respect_duration and duration is not None:
            limit_ns = self.stats.t0_ns + int((duration + self.options.drain_timeout_s) * 1e9)
            try:
                await asyncio.wait_for(slots, timeout=max(0.0, (limit_ns - _now()) / 1e9))
            except asyncio.TimeoutError:
                pass  # requests still running past the drain timeout are recorded as cancelled
        else:
            await slots

    async def _open(self, specs: Sequence[RequestSpec]) -> None:
        first_turns = [s for s in specs if s.session_id is None or s.turn == self._sessions[s.session_id][0].turn]
        first_turns.sort(key=lambda s: s.send_offset_ns or 0)
        t0 = self.stats.t0_ns
        for spec in first_turns:
            deadline = t0 + (spec.send_offset_ns or 0)
            call = self.adapter.build(spec) if spec.session_id is None else None
            await _sleep_until(deadline)
            if self.stop.is_set() or self._past_duration():
                break
            self._spawn(self._run_session_from(spec, deadline, call))
        await self._drain()

    async def _drain(self) -> None:
        """Let in-flight requests finish (after ``duration_s``: within the drain timeout);
        cancel the rest."""
        if not self._tasks:
            return
        timeout = self.options.drain_timeout_s if self.options.duration_s is not None else None
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _monitor(self) -> None:
        interval = self.options.monitor_interval_s
        next_progress = 0
        while True:
            before = _now()
            await asyncio.sleep(interval)
            after = _now()
            self._sample(after, max(0, after - before - int(interval * 1e9)))
            await self._flush_due()
            if self._progress is not None and after >= next_progress:
                s = self.stats
                self._progress.update(s.completed + s.failed + s.cancelled, s.in_flight, s.failed)
                next_progress = after + 250_000_000

    def _sample(self, ts_ns: int, loop_lag_ns: int | None) -> None:
        """One self-monitoring row: event-loop lag, process CPU, load counters."""
        mw = self.monitor_writer
        if mw is None:
            return
        s = self.stats
        mw.add(
            {
                "worker_id": self.options.worker_id,
                "ts_ns": ts_ns,
                "loop_lag_ns": loop_lag_ns,
                "cpu_s": time.process_time(),
                "in_flight": s.in_flight,
                "sent": s.sent,
                "completed": s.completed + s.failed + s.cancelled,
            }
        )

    async def _flush_due(self, force: bool = False) -> None:
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

    async def run(self) -> RunStats:
        """Warm-up, then the measured schedule. Always flushes what was recorded."""
        sched = self.schedule
        total = len(sched.requests)
        self._progress = Progress(total, sched.name, enabled=self.options.progress)
        loop = asyncio.get_running_loop()
        # Parse one iteration later: slots freed in this iteration send their next
        # request first (their tasks were woken before the drain is queued).
        self._digest_queue = DigestQueue(lambda drain: loop.call_soon(loop.call_soon, drain))
        _warm_up_writer()
        # The Parquet flush runs in a thread; a shorter GIL switch interval bounds how long
        # it can hold the event loop off (the default 5 ms would show up in timestamps).
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, 0.0005))
        # The cyclic garbage collector stops the loop for tens of ms once hundreds of
        # thousands of chunk events are alive; the hot path makes no cycles, so it is
        # paused for the run (and what was allocated before is frozen out of its view).
        gc_was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()
        monitor = asyncio.ensure_future(self._monitor())
        try:
            if sched.warmup:
                await self._closed(sched.warmup, min(len(sched.warmup), self.options.warmup_concurrency), False)
            if sched.mode == "closed":
                # a closed loop's slots all send at t0: their connections are opened first
                if isinstance(self.transport, Preconnecting):
                    await self.transport.preconnect(max(1, sched.concurrency or 1))
            start_at = self.options.start_at_ns
            self.stats.t0_ns = start_at if start_at is not None else _now() + int(self.options.start_lead_s * 1e9)
            body = (
                self._closed(sched.measured, sched.concurrency or 1, True)
                if sched.mode == "closed"
                else self._open(sched.measured)
            )
            work = asyncio.ensure_future(body)
            stopper = asyncio.ensure_future(self.stop.wait())
            done, _ = await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if stopper in done:
                self.stats.interrupted = True
                work.cancel()
                for t in list(self._tasks):
                    t.cancel()
                await asyncio.gather(work, *self._tasks, return_exceptions=True)
            else:
                stopper.cancel()
                work.result()
        except asyncio.CancelledError:
            self.stats.interrupted = True
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            self.stats.end_ns = _now()
            monitor.cancel()
            await asyncio.gather(monitor, return_exceptions=True)
            # writes the cancelled monitor had started (errors are kept in _write_error)
            await asyncio.gather(*self._writes, return_exceptions=True)
            self._finish_pending(budget_ns=None)
            self._sample(_now(), None)  # a closing sample (CPU and time read together), so short runs have one
            try:
                await self._flush_due(force=True)
            finally:
                if self._write_pool is not None:
                    self._write_pool.shutdown(wait=False)
            self._progress.close()
            sys.setswitchinterval(switch)
            gc.unfreeze()
            if gc_was_enabled:
                gc.enable()
        if self._write_error is not None:
            raise self._write_error
        return self.stats


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


def _warm_up_writer() -> None:
    """Write one empty Parquet table in memory: the first real flush otherwise pays for
    pyarrow's lazy imports (hundreds of ms) in the middle of the measurement."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from results.schema import REQUESTS_SCHEMA

    pq.write_table(REQUESTS_SCHEMA.empty_table(), pa.BufferOutputStream(), compression="zstd")


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _sleep_until(deadline_ns: int) -> None:
    """Returns at or after ``deadline_ns``, never before: the event loop's timers may fire
    a little early (clock resolution, float seconds), and a send stamped before its
    intended time would break the record's invariants."""
    while (delay := deadline_ns - _now()) > 0:
        await asyncio.sleep(delay / 1e9)


def _turn_messages(spec: RequestSpec) -> tuple[Message, ...]:
    if spec.messages is not None:
        return spec.messages
    return (Message("user", spec.prompt or ""),)
