"""Dispatch: the schedule into requests in flight.

Open loop (each request at its intended send time) or closed loop (N slots, each sending
its next request when its last one ended), sessions turn after turn. ``Dispatcher``
builds each call with the adapter, hands it to the transport with a recorder, and gives
every ended request to ``Recording`` (``finish``, or ``defer`` to keep bookkeeping off a
freed slot's next send). It learns once, from the transport contract, whether the
transport can send a freed slot's next request from inside the read that freed it.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any

from bench_llm.adapters.base import Adapter, HttpCall
from bench_llm.loadgen.options import RunOptions, RunStats
from bench_llm.loadgen.recorder import DigestQueue, RequestRecorder
from bench_llm.loadgen.recording import Recording
from bench_llm.loadgen.transport import EagerTransport, StreamError, Transport
from bench_llm.results.record import RequestRecord
from bench_llm.workloads.spec import Message, RequestSpec, Schedule

_now = time.perf_counter_ns


class _Started:
    """A request a freed closed-loop slot already sent (``Dispatcher._next_from``)."""

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


class Dispatcher:
    """Sends a schedule's requests (``closed``, ``open``); ``cancel_in_flight`` ends them."""

    def __init__(
        self,
        schedule: Schedule,
        adapter: Adapter,
        transport: Transport,
        recording: Recording,
        stats: RunStats,
        options: RunOptions,
        stop: asyncio.Event,
    ) -> None:
        self.adapter = adapter
        self.transport = transport
        # What the transport can do beyond ``send``, learned once from the contract.
        self._eager: EagerTransport[Any] | None = transport if isinstance(transport, EagerTransport) else None
        self.recording = recording
        self.stats = stats
        self.options = options
        self.stop = stop
        #: Where recorders queue their undigested reads (set by the runner in its loop).
        self.digest_queue: DigestQueue | None = None
        self._tasks: set[asyncio.Task[int | None]] = set()
        sessions: dict[str, list[RequestSpec]] = defaultdict(list)
        for spec in schedule.measured:
            if spec.session_id is not None:
                sessions[spec.session_id].append(spec)
        self._sessions = {k: sorted(v, key=lambda s: s.turn) for k, v in sessions.items()}
        #: sessions that are graphs (workloads/graph.py): their nodes wait for predecessors
        self._graphs = {k for k, v in self._sessions.items() if any(s.after for s in v)}

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
        if started is not None:
            recorder, call = started.recorder, started.call
        else:
            recorder = self._recorder(spec, intended_ns)
            if call is None:
                call = self.adapter.build(spec, history)
            self._count_sent()
        error, cancelled = await self._transfer(recorder, call, started, next_from)
        # A complete response ended with its last bytes; a failed one when it failed.
        last = recorder.last_data_ns
        end = last if error is None and last is not None else _now()
        if spec.session_id is None and not cancelled:
            self.recording.defer(recorder, end, error)
            return None, "", end
        record = self.recording.finish(recorder, end, error)
        if cancelled:
            raise asyncio.CancelledError
        return record, recorder.answer_text, end

    async def _transfer(
        self, recorder: RequestRecorder, call: HttpCall, started: _Started | None, next_from: Callable[[], None] | None
    ) -> tuple[StreamError | None, bool]:
        """The exchange through the transport: (its error, whether it was cancelled)."""
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
            return exc.with_traceback(None), False
        except asyncio.CancelledError:
            return StreamError("cancelled", "cancelled before completion (run stopped)"), True
        except Exception as exc:  # never lose a request to an unexpected client error
            return StreamError("client_error", f"{type(exc).__name__}: {exc}"), False
        finally:
            self.stats.in_flight -= 1
        return None, False

    def _recorder(self, spec: RequestSpec, intended_ns: int) -> RequestRecorder:
        return RequestRecorder(
            spec,
            self.adapter.parser(),
            self.options.worker_id,
            intended_ns,
            keep_text=spec.session_id is not None or self.options.save_text or spec.constraint is not None,
            queue=self.digest_queue,
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
        self.recording.finish(started.recorder, _now(), StreamError("cancelled", "cancelled before completion (run stopped)"))

    # -- sessions ----------------------------------------------------------------------
    async def _run_session_from(self, spec: RequestSpec, intended_ns: int, call: HttpCall | None) -> int | None:
        """Send ``spec``; if it opens a session, send the later turns after each answer.

        Returns when the last response ended (``end_ns``): a closed-loop slot is free from
        that moment, so the next request's intended send time is that instant and any
        client overhead before it reaches the socket shows as schedule lag.
        """
        if spec.session_id in self._graphs:
            return await self._run_graph(self._sessions[spec.session_id], intended_ns, call)
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

    async def _run_graph(self, nodes: Sequence[RequestSpec], start_ns: int, call: HttpCall | None) -> int | None:
        """One job of a session graph: its root at ``start_ns``, every other node when all its
        predecessors ended, at the latest (end + the edge's delay): that instant is the node's
        intended send time. A node's history is its context predecessor's conversation, then
        its other predecessors' answers. A failed node's descendants are recorded as skipped.
        Returns when the job's last request ended (a closed-loop slot is free from then)."""
        ended: dict[str, asyncio.Future[int | None]] = {}  # end ns, or None: failed or not sent
        talks: dict[str, tuple[Message, ...]] = {}  # each node's conversation (prompt history, answer)
        answers: dict[str, str] = {}
        loop = asyncio.get_running_loop()
        for n in nodes:
            ended[n.request_id] = loop.create_future()

        async def node(spec: RequestSpec) -> int | None:
            fut = ended[spec.request_id]
            try:
                if not spec.after:
                    intended = start_ns
                else:
                    ends = [await ended[p] for p in spec.after]
                    if any(e is None for e in ends):
                        failed = [p for p, e in zip(spec.after, ends) if e is None]
                        why = (f"predecessor {failed[0]} of job {spec.session_id} failed or was not sent, "
                               f"so {spec.request_id} is not sent")
                        if not self.stop.is_set():
                            self._record_unsent(spec, _now(), "skipped_turn", why)
                        fut.set_result(None)
                        return None
                    intended = max(e + d for e, d in zip(ends, spec.after_delay_ns))  # type: ignore[operator]
                    await _sleep_until(intended)
                    if self.stop.is_set() or self._past_duration():
                        fut.set_result(None)
                        return None
                if spec.refused is not None:
                    self._record_unsent(spec, intended, "exceeds_context", spec.refused)
                    fut.set_result(None)
                    return None
                history = list(talks[spec.context_from]) if spec.context_from is not None else []
                history += [Message("user", answers[p]) for p in spec.after if p != spec.context_from]
                record, answer, end = await self._execute(
                    spec, intended, call if not spec.after else None, tuple(history))
                ok = record is not None and record.ok
                if ok:
                    answers[spec.request_id] = answer
                    talks[spec.request_id] = (*history, *_turn_messages(spec), Message("assistant", answer))
                fut.set_result(end if ok else None)
                return end
            finally:
                if not fut.done():
                    fut.set_result(None)

        results = await asyncio.gather(*(node(n) for n in nodes))
        ends = [e for e in results if e is not None]
        return max(ends) if ends else None

    def _record_unsent(self, spec: RequestSpec, intended_ns: int, error_type: str, message: str) -> None:
        """A failed row for a request that is not sent (no send, byte or token stamp)."""
        self.recording.finish(self._recorder(spec, intended_ns), intended_ns, StreamError(error_type, message))

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

    # -- the loops -----------------------------------------------------------------------
    async def closed(self, specs: Sequence[RequestSpec], concurrency: int, respect_duration: bool) -> None:
        """``concurrency`` slots, each sending its next request when its last one ended."""
        units = [s for s in specs if s.session_id is None or s.turn == min(t.turn for t in self._sessions[s.session_id])]
        it = iter(units)

        if respect_duration:
            await _sleep_until(self.stats.t0_ns)  # the measured phase starts at t0

        slots = asyncio.gather(*(self._slot(it, respect_duration) for _ in range(max(1, concurrency))))
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

    async def _slot(self, it: Iterator[RequestSpec], respect_duration: bool) -> None:
        """One closed-loop slot: takes specs from ``it`` until none is left (or the run stops)."""
        sends_at_once = self._eager is not None
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

    async def open(self, specs: Sequence[RequestSpec]) -> None:
        """Each request (or session) at its intended send time from t0."""
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

    async def cancel_in_flight(self, *also: asyncio.Future[Any]) -> None:
        """Cancel every request task (and ``also``), and wait until they ended."""
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*also, *self._tasks, return_exceptions=True)


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
