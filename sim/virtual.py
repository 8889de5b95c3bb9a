"""A client's schedule run through the modelled engine in virtual time.

The same scheduler and cost model the HTTP server paces in real time (``sim.backend``),
driven by a simulated client instead of sockets: open-loop sends at their intended times,
closed-loop slots that take the next request the instant theirs ends, multi-turn sessions
whose next turn follows the previous answer after its think time, a warm-up phase first,
and the runner's drain deadline (requests still running then are cancelled). Nothing
reads the wall clock and every container is ordered, so the outcome depends on the
inputs alone: the same sends give the same token times, on any machine, under any load.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench_llm.sim.backend import ModelBackend
from bench_llm.sim.request import SimRequest

#: Outcome states.
OK, CANCELLED, REJECTED, UNSENT = "ok", "cancelled", "rejected", "unsent"


@dataclass(frozen=True, slots=True)
class Send:
    """One request as the client sends it. Times are virtual nanoseconds.

    ``at_ns``: open loop, the intended send time relative to the measured phase's start
    (None: closed loop, or a later turn of a session). ``after``: the index of the session
    turn this one follows, ``think_ns`` after that turn's answer ended (a session graph's
    node: its first predecessor; ``joins`` its others).
    """

    prompt_len: int
    max_tokens: int
    block_hashes: tuple[int, ...] = ()
    warmup: bool = False
    at_ns: int | None = None
    after: int | None = None
    think_ns: int = 0
    #: refused on arrival (the engine answers 400: prompt + output beyond its context)
    reject: bool = False
    #: a session graph's other predecessors, as (send index, delay ns): the send goes when the
    #: last of ``after`` and these ended, at the latest (end + delay)
    joins: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """How the sends are driven (the load runner's settings, ``loadgen.runner.RunOptions``)."""

    #: closed loop: requests kept in flight in the measured phase (None: open loop)
    concurrency: int | None = None
    warmup_concurrency: int = 4
    #: stop sending this long after the measured phase's start (None: when all are sent)
    duration_ns: int | None = None
    #: after sending stops, how long requests may still run before they are cancelled
    drain_ns: int | None = None
    #: call ``on_tick(t)`` at every multiple of this interval after the measured start
    tick_ns: int | None = None


@dataclass(slots=True)
class Outcome:
    """What happened to one send. ``token_ns``: the time of every token emitted."""

    state: str = UNSENT
    intended_ns: int = 0
    token_ns: list[int] = field(default_factory=list)
    end_ns: int | None = None
    cached_tokens: int = 0
    replica: int = -1
    queue_ns: int | None = None


@dataclass(frozen=True, slots=True)
class Result:
    outcomes: list[Outcome]
    #: start of the measured phase (the end of the warm-up)
    t0_ns: int
    end_ns: int


class _Sink:
    """A request's tokens into its Outcome; its end into the client."""

    __slots__ = ("out", "client", "index")

    def __init__(self, out: Outcome, client: "_Client", index: int) -> None:
        self.out = out
        self.client = client
        self.index = index

    def emit(self, req: SimRequest, n: int, intended_ns: tuple[int, ...], finished: bool) -> None:
        out = self.out
        out.token_ns += intended_ns
        if finished:
            out.state = OK
            out.end_ns = intended_ns[-1]
            out.cached_tokens = req.cached_tokens
            out.replica = req.replica
            if req.admitted_ns is not None:
                out.queue_ns = req.admitted_ns - req.arrival_ns
            self.client.ended(self.index, intended_ns[-1])


class _Client:
    """The simulated load generator: a heap of due sends, closed-loop slots, sessions."""

    def __init__(self, backend: ModelBackend, sends: Sequence[Send], outcomes: list[Outcome]) -> None:
        self.backend = backend
        self.sends = sends
        self.outcomes = outcomes
        self.due: list[tuple[int, int, int]] = []  # (time, order, send index)
        self.order = 0
        #: per send, the sends that follow it, with the delay after it
        self.followers: dict[int, list[tuple[int, int]]] = {}
        self.waiting: dict[int, int] = {}  # predecessors a send still waits for
        self.ready: dict[int, int] = {}  # the latest (end + delay) of its ended predecessors
        self.root: dict[int, int] = {}  # the unit (session or job) a later send belongs to
        self.left: dict[int, int] = {}  # per unit: its sends under way (sent or due)
        for i, s in enumerate(sends):
            if s.after is not None:
                for p, d in ((s.after, s.think_ns), *s.joins):
                    self.followers.setdefault(p, []).append((i, d))
                self.waiting[i] = 1 + len(s.joins)
        for i, s in enumerate(sends):  # predecessors come first
            if s.after is not None:
                self.root[i] = self.root.get(s.after, s.after)
        self.dead: set[int] = set()  # a predecessor failed: never sent
        self.units: deque[int] = deque()  # closed loop: sends waiting for a free slot
        self.closed = False
        self.open_until: int | None = None  # sends due after this time are not sent
        self.in_flight: dict[int, SimRequest] = {}
        self.phase_left = 0  # requests of the current phase not ended yet

    def push(self, t: int, index: int) -> None:
        heapq.heappush(self.due, (t, self.order, index))
        self.order += 1

    def ended(self, index: int, t: int, ok: bool = True) -> None:
        self.in_flight.pop(index, None)
        self.phase_left -= 1
        unit = self.root.get(index, index)
        left = self.left.pop(unit, 1) - 1
        for nxt, delay in self.followers.get(index, ()):
            if not ok:  # a failed turn ends its session; a failed node, its descendants
                self.dead.add(nxt)
            self.ready[nxt] = max(self.ready.get(nxt, 0), t + delay)
            self.waiting[nxt] -= 1
            if self.waiting[nxt] == 0 and nxt not in self.dead:
                self.phase_left += 1
                left += 1
                self.push(self.ready.pop(nxt), nxt)
        if left > 0:
            self.left[unit] = left
        elif self.closed and self.units:  # the unit ended: its slot takes the next one
            self.phase_left += 1
            self.push(t, self.units.popleft())

    def send(self, t: int, index: int) -> None:
        s = self.sends[index]
        out = self.outcomes[index]
        if self.open_until is not None and t >= self.open_until:
            self.phase_left -= 1
            return
        out.intended_ns = t
        if s.reject:
            out.state = REJECTED
            out.end_ns = t
            self.ended(index, t, ok=False)
            return
        out.state = CANCELLED  # until its last token arrives
        req = SimRequest(f"v{index}", t, s.prompt_len, s.max_tokens, _Sink(out, self, index), s.block_hashes)
        req.token_times = out.token_ns  # the sink is called for the last token only
        self.in_flight[index] = req
        self.backend.submit(req)

    def cancel_all(self, t: int) -> None:
        for index in sorted(self.in_flight):
            self.backend.abort(self.in_flight[index])
            self.outcomes[index].end_ns = t
        self.in_flight.clear()
        self.due.clear()
        self.units.clear()
        self.phase_left = 0


def run(
    backend: ModelBackend,
    sends: Sequence[Send],
    plan: Plan = Plan(),
    on_tick: Callable[[int], None] | None = None,
) -> Result:
    """Drive ``sends`` through ``backend``: the warm-up sends first (closed loop at
    ``plan.warmup_concurrency``), then the measured ones from ``t0`` (the warm-up's end)."""
    outcomes = [Outcome() for _ in sends]
    client = _Client(backend, sends, outcomes)
    warm = [i for i, s in enumerate(sends) if s.warmup and s.after is None]
    t = 0
    if warm:
        _closed_start(client, warm, min(len(warm), plan.warmup_concurrency), 0)
        t = _loop(client, backend, None, None, None)
    t0 = t
    measured = [i for i, s in enumerate(sends) if not s.warmup and s.after is None]
    if plan.duration_ns is not None:
        client.open_until = t0 + plan.duration_ns
    if plan.concurrency is not None:
        _closed_start(client, measured, plan.concurrency, t0)
    else:
        client.closed = False
        client.phase_left = len(measured)
        for i in sorted(measured, key=lambda i: (sends[i].at_ns or 0, i)):
            client.push(t0 + (sends[i].at_ns or 0), i)
    horizon = _horizon(client, plan, t0)
    end = _loop(client, backend, horizon, (t0, plan.tick_ns) if plan.tick_ns else None, on_tick)
    return Result(outcomes, t0, end)


def _closed_start(client: _Client, units: list[int], concurrency: int, t: int) -> None:
    client.closed = True
    client.units = deque(units)
    client.phase_left = 0
    for _ in range(min(concurrency, len(units))):
        client.phase_left += 1
        client.push(t, client.units.popleft())


def _horizon(client: _Client, plan: Plan, t0: int) -> int | None:
    """When requests still running are cancelled (the runner's drain deadline)."""
    if plan.drain_ns is None:
        return None
    if plan.concurrency is not None or (plan.duration_ns is None and client.followers):
        # (open loop with sessions or graphs and no duration: the runner awaits every request,
        # later turns included, as loadgen.dispatch's drain does)
        return None if plan.duration_ns is None else t0 + plan.duration_ns + plan.drain_ns
    last = max((t for t, _, _ in client.due), default=t0)
    if client.open_until is not None:
        last = min(last, client.open_until)
    return last + plan.drain_ns


def _loop(
    client: _Client,
    backend: ModelBackend,
    horizon: int | None,
    ticks: tuple[int, int] | None,
    on_tick: Callable[[int], None] | None,
) -> int:
    """Run until every request of the phase ended (or the horizon); returns the end time.

    When no completion can add a send (open loop, no sessions) the engine runs up to the
    next send in one call; otherwise event by event, so a send a completion causes goes in
    at that completion's time.
    """
    due = client.due
    reactive = client.closed or bool(client.followers)
    limit = _FAR if horizon is None else horizon
    next_tick = ticks[0] if ticks is not None and on_tick is not None else _FAR
    t = 0
    while client.phase_left > 0:
        send_t = due[0][0] if due else None
        target = _FAR if send_t is None else send_t
        if reactive:
            ev = backend.next_event_ns()
            if ev is None and send_t is None:
                break  # nothing can happen any more (cannot occur with a live engine)
            if ev is not None and ev < target:
                target = ev
        while next_tick <= min(target, limit) and ticks is not None and on_tick is not None:
            if send_t is None and backend.next_event_ns() is None:
                break
            backend.advance(next_tick)
            on_tick(next_tick)
            next_tick += ticks[1]
        if target > limit:
            backend.advance(limit)
            if client.phase_left > 0:
                client.cancel_all(limit)
                return limit
            break
        if send_t is not None and target == send_t:
            backend.advance(send_t - 1)
            t = send_t
            client.send(t, heapq.heappop(due)[2])
        else:
            backend.advance(target)
            if target < _FAR:
                t = target
    return max(t, max((o.end_ns or 0 for o in client.outcomes), default=0))


#: Later than any virtual time a run reaches (~146 years).
_FAR = 1 << 62
