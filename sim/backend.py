"""The engines behind the HTTP surface, driven by event times (virtual or real).

Both backends share one small interface: ``submit(req)``, ``next_event_ns()`` (the next
virtual time something happens, or None when idle) and ``advance(now_ns)`` (process every
event up to ``now_ns`` in order, calling each request's sink with the tokens due and
their intended emission times). The real-time loop (``sim.loop``) sleeps until the next
event; tests drive the same objects in virtual time (``simulate``), so what the tests
measure is what the server does.

``FixedBackend`` (``--timing fixed``): token ``i`` of a request is due at
``arrival + ttft + i·itl`` (request deadlines, the default), or (``--fixed-grid``) one
engine loop steps every ``itl`` on a global grid anchored at engine start, a request's
first token is due at the first boundary at or after ``arrival + ttft`` and each later
token at each following boundary. Either way one engine loop emits every token due at a
wake-up in one pass, so concurrent streams leave together like a batch.

``ModelBackend`` (``--timing model``): DP replicas (or prefill/decode pools) of
``sim.scheduler.Instance`` behind a router, stepping by the cost model.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from bench_llm.sim.options import ModelTiming
from bench_llm.sim.request import SimRequest, prefix_block_hashes
from bench_llm.sim.routing import prefix_aware
from bench_llm.sim.scheduler import Batch, Instance, Limits
from bench_llm.sim.spec_counts import SpecDecodeCounts
from bench_llm.sim.timing import FixedTiming


class FixedBackend:
    def __init__(self, timing: FixedTiming, origin_ns: int = 0, grid: bool = False) -> None:
        self.grid = grid
        self.ttft_ns = int(round(timing.ttft_s * 1e9))
        self.itl_ns = int(round(timing.itl_s * 1e9))
        self.per_chunk = timing.tokens_per_chunk
        self.origin = origin_ns
        self.pending: list[tuple[int, int, SimRequest]] = []
        self.active: list[SimRequest] = []
        self.next_grid: int | None = None
        self._seq = 0
        self._held: dict[SimRequest, list[int]] = {}
        self.steps = 0

    def _ceil_grid(self, t: int) -> int:
        if self.itl_ns <= 0:
            return t
        k = -(-(t - self.origin) // self.itl_ns)
        return self.origin + k * self.itl_ns

    def first_token_ns(self, arrival_ns: int) -> int:
        """Intended time of a request's first token: ``arrival + ttft`` (request
        deadlines), or the first grid point at or after it (grid mode)."""
        if not self.grid:
            return arrival_ns + self.ttft_ns
        return self._ceil_grid(arrival_ns + self.ttft_ns)

    def submit(self, req: SimRequest) -> None:
        self._seq += 1
        heapq.heappush(self.pending, (self.first_token_ns(req.arrival_ns), self._seq, req))

    def abort(self, req: SimRequest) -> None:
        req.aborted = True

    @property
    def running(self) -> int:
        return len(self.active) if self.grid else len(self.pending)

    @property
    def waiting(self) -> int:
        return len(self.pending) if self.grid else 0

    def next_event_ns(self) -> int | None:
        if not self.grid:
            return self.pending[0][0] if self.pending else None
        if self.active and self.next_grid is not None:
            if self.pending and self.pending[0][0] < self.next_grid:
                return self.pending[0][0]
            return self.next_grid
        if self.pending:
            return self.pending[0][0]
        return None

    def advance(self, now: int) -> None:
        while True:
            t = self.next_event_ns()
            if t is None or t > now:
                return
            self._step(t)

    def _step(self, g: int) -> None:
        if not self.grid:
            self._request_pass(g)
            return
        pending = self.pending
        while pending and pending[0][0] <= g:
            self.active.append(heapq.heappop(pending)[2])
        self.steps += 1
        if self.itl_ns <= 0:
            for req in self.active:
                self._emit_all(req, g)
            self.active = []
            self.next_grid = None
            return
        keep: list[SimRequest] = []
        for req in self.active:
            if req.aborted:
                continue
            if not self._emit_token(req, g):
                keep.append(req)
        self.active = keep
        self.next_grid = g + self.itl_ns if keep else None

    def _request_pass(self, t: int) -> None:
        """Request-deadline mode: emit every token due at ``t`` (one pass, arrival order)."""
        pending = self.pending
        self.steps += 1
        while pending and pending[0][0] <= t:
            due, seq, req = heapq.heappop(pending)
            if req.aborted:
                continue
            if self.itl_ns <= 0:
                self._emit_all(req, due)
                continue
            if not self._emit_token(req, due):
                heapq.heappush(pending, (due + self.itl_ns, seq, req))

    def _emit_token(self, req: SimRequest, t: int) -> bool:
        """Generate ``req``'s next token at ``t`` (sent now, or held until a chunk is full).

        Returns True when the request is finished.
        """
        req.generated += 1
        done = req.generated >= req.max_tokens
        if self.per_chunk == 1:
            req.sink.emit(req, 1, (t,), done)  # type: ignore[union-attr]
        else:
            held = self._held.setdefault(req, [])
            held.append(t)
            if len(held) >= self.per_chunk or done:
                del self._held[req]
                req.sink.emit(req, len(held), tuple(held), done)  # type: ignore[union-attr]
        if done:
            req.finished = True
        return done

    def _emit_all(self, req: SimRequest, g: int) -> None:
        while req.generated < req.max_tokens and not req.aborted:
            n = min(self.per_chunk, req.max_tokens - req.generated)
            req.generated += n
            done = req.generated >= req.max_tokens
            req.sink.emit(req, n, (g,) * n, done)  # type: ignore[union-attr]
        req.finished = True


@dataclass
class Stats:
    """Counters the /metrics surfaces read."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0
    kv_transfers: int = 0
    iteration_tokens: list[int] = field(default_factory=list)


class ModelBackend:
    """DP replicas (or P/D pools) of scheduler instances behind a router."""

    def __init__(self, timing: ModelTiming) -> None:
        self.timing = timing
        cm = timing.cost_model()
        cm.check_fits()
        self.cost = cm
        seqs, budget, prefix = timing.limits()
        prof = timing.engine_profile
        self.block_size = prof.block_size
        self.prefix_caching = prefix
        limits = Limits(seqs, budget, prof.block_size, cm.kv_blocks(), prof.watermark, prefix, prof.kv_reserve_ratio,
                        prof.kv_reserve_clip)
        self.request_overhead_ns = int(prof.request_overhead_ms * 1e6)
        self.frontend_serial_ns = int(prof.frontend_serial_ms * 1e6)
        self._frontend_free_ns = 0  # when the front end's serial part is free for the next request
        rng = random.Random(timing.seed)
        jitter = timing.jitter or prof.jitter_sigma
        self.instances: list[Instance] = []
        self.prefill_pool: list[Instance] = []
        self.decode_pool: list[Instance] = []
        if timing.disaggregated:
            pf = timing.prefill_pool_timing()
            cm_pf = pf.cost_model() if pf is not timing else cm
            if cm_pf is not cm:
                cm_pf.check_fits()
            limits_pf = replace(limits, num_blocks=cm_pf.kv_blocks(),
                                max_num_seqs=timing.prefill_max_num_seqs or limits.max_num_seqs,
                                max_num_batched_tokens=timing.prefill_max_num_batched_tokens
                                or limits.max_num_batched_tokens)
            for i in range(timing.disagg_prefill * pf.dp):
                inst = Instance(len(self.instances), cm_pf, limits_pf, "prefill", timing.pp, timing.slowdown, jitter,
                                random.Random(rng.random()), timing.spec_accept)
                self.instances.append(inst)
                self.prefill_pool.append(inst)
            for i in range(timing.disagg_decode * timing.dp):
                inst = Instance(len(self.instances), cm, limits, "decode", timing.pp, timing.slowdown, jitter,
                                random.Random(rng.random()), timing.spec_accept)
                self.instances.append(inst)
                self.decode_pool.append(inst)
        else:
            for i in range(timing.dp):
                inst = Instance(i, cm, limits, "both", timing.pp, timing.slowdown, jitter, random.Random(rng.random()), timing.spec_accept)
                self.instances.append(inst)
            self.prefill_pool = list(self.instances)
        self.max_model_len = min(timing.model.max_model_len, cm.kv_tokens())
        #: DP attention + EP on a MoE model: the DP ranks step in lock-step
        self.lockstep = (timing.model.is_moe and timing.ep > 1 and timing.dp > 1 and timing.pp == 1
                         and not timing.disaggregated)
        self._rr = 0
        self.stats = Stats()
        #: called as observer(req, event, t_ns) for token/prefilled events (metrics)
        self.observer: Callable[[SimRequest, str, int], None] | None = None

    # -- intake --------------------------------------------------------------------------
    def hashes_for(self, token_ids: list[int]) -> tuple[int, ...]:
        return prefix_block_hashes(token_ids, self.block_size) if self.prefix_caching else ()

    def submit(self, req: SimRequest) -> None:
        # the serial part of the overhead queues behind the requests that came before (a lone request
        # is ready at arrival + request overhead, as ever)
        start = max(req.arrival_ns, self._frontend_free_ns)
        self._frontend_free_ns = start + self.frontend_serial_ns
        req.ready_ns = max(req.ready_ns, start + self.request_overhead_ns)
        self.stats.prompt_tokens += req.prompt_len
        self._route(req, self.prefill_pool).add(req)

    def _route(self, req: SimRequest, pool: list[Instance]) -> Instance:
        if len(pool) == 1:
            return pool[0]
        mode = self.timing.router
        if mode == "round-robin" and pool is self.prefill_pool:
            inst = pool[self._rr % len(pool)]
            self._rr += 1
            return inst
        if mode == "kv-aware":
            return min(pool, key=lambda i: (i.pool.usage, i.load, i.index))
        if mode == "prefix-aware" and req.block_hashes:  # with sgl-router's load guard (sim/routing.py)
            return prefix_aware(pool, req.block_hashes, self.block_size, req.prompt_len)
        return min(pool, key=lambda i: (i.load, i.index))

    def abort(self, req: SimRequest) -> None:
        if 0 <= req.replica < len(self.instances):
            self.instances[req.replica].abort(req)
        else:
            req.aborted = True

    # -- state ---------------------------------------------------------------------------
    @property
    def running(self) -> int:
        return sum(len(i.running) for i in self.instances)

    @property
    def waiting(self) -> int:
        return sum(i.num_waiting for i in self.instances)

    @property
    def kv_usage(self) -> float:
        return max((i.pool.usage for i in self.instances), default=0.0)

    @property
    def prefix_queries(self) -> int:
        return sum(i.pool.queries for i in self.instances)

    @property
    def prefix_hits(self) -> int:
        return sum(i.pool.hits for i in self.instances)

    @property
    def preemptions(self) -> int:
        return sum(i.preemptions for i in self.instances)

    @property
    def spec_decode(self) -> SpecDecodeCounts | None:
        """Speculative decoding's counts over every instance; None when it is off."""
        k = self.timing.spec_tokens
        return SpecDecodeCounts.total(k, (i.spec for i in self.instances)) if k else None

    # -- events --------------------------------------------------------------------------
    def next_event_ns(self) -> int | None:
        best: int | None = None
        for inst in self.instances:
            t = inst.next_event_ns()
            if t is not None and (best is None or t < best):
                best = t
        return best

    def advance(self, now: int) -> None:
        if self.timing.pp == 1 and not self.lockstep:
            if len(self.instances) == 1:
                self._advance_one(self.instances[0], now)
            else:
                self._advance_flat(now)
            return
        self._advance_events(now)

    def _advance_events(self, now: int) -> None:
        """``advance``, event by event through every instance's ``next_event_ns``."""
        while True:
            best: int | None = None
            which: Instance | None = None
            for inst in self.instances:
                t = inst.next_event_ns()
                if t is not None and (best is None or t < best):
                    best, which = t, inst
            if best is None or best > now or which is None:
                return
            b = which.pop_completion(best)
            if b is None:
                if self.lockstep:
                    self._start_together(best)
                else:
                    which.start_step(best)
                continue
            self._complete(which, b)

    def _complete(self, inst: Instance, b: Batch) -> None:
        """A step ``inst`` has finished (popped from its in-flight list): applied, its tokens out."""
        if b.prefill_tokens + b.decode_tokens:
            self.stats.iteration_tokens.append(b.prefill_tokens + b.decode_tokens)
            if len(self.stats.iteration_tokens) > 4096:
                del self.stats.iteration_tokens[:2048]
        done = inst.finish_step(b)
        if inst.role == "prefill":
            for req in done:
                self._hand_off(req, b.end_ns)
        else:
            self._emit_tokens(done, b.end_ns)

    def _advance_flat(self, now: int) -> None:
        """``advance`` for several instances without pipeline parallelism or lock-step: the
        same events in the same order, with a busy instance's ``next_event_ns`` (its step's
        end) and ``pop_completion`` inlined (one step in flight at most per instance)."""
        instances = self.instances
        while True:
            best = -1
            which: Instance | None = None
            for inst in instances:
                inflight = inst.inflight
                if inflight:
                    t = inflight[0].end_ns
                else:
                    start = inst.next_event_ns()
                    if start is None:
                        continue
                    t = start
                if which is None or t < best:
                    best, which = t, inst
            if which is None or best > now:
                return
            inflight = which.inflight
            if not inflight:
                which.start_step(best)
                continue
            b = inflight[0]  # (its end is ``best``: due)
            inflight.clear()
            if which.clock < best:
                which.clock = best
            which.blocked = False
            self._complete(which, b)

    def _advance_one(self, inst: Instance, now: int) -> None:
        """``advance`` for one instance without pipeline parallelism (one step in flight at
        most): the same events in the same order, with ``pop_completion`` inlined (this loop
        runs twice per engine step); an idle instance's next start is ``next_event_ns``."""
        inflight = inst.inflight
        while True:
            if inflight:
                b = inflight[0]
                end = b.end_ns
                if end > now:
                    return
                inflight.clear()
                if inst.clock < end:
                    inst.clock = end
                inst.blocked = False
                self._complete(inst, b)
                continue
            t = inst.next_event_ns()
            if t is None or t > now:
                return
            inst.start_step(t)

    def _emit_tokens(self, reqs: list[SimRequest], end: int) -> None:
        """A finished step's tokens (``step_tokens`` per request: 1, or with speculative decoding its own
        token and the accepted drafts, leaving together as one chunk) at ``end`` to their sinks; runs once
        per generated token, so it is kept lean."""
        stats = self.stats
        observer = self.observer
        at = (end,)
        for req in reqs:
            n = req.step_tokens
            stats.generation_tokens += n
            if req.first_token_ns is None:
                req.first_token_ns = end
            req.last_token_ns = end
            finished = req.finished
            if finished:
                stats.finished += 1
            if observer is not None:
                for _ in range(n):
                    observer(req, "token", end)
            times = req.token_times
            if times is not None:
                if n > 1:  # the sink below is handed the last token alone
                    times.extend(at * (n if not finished else n - 1))
                elif not finished:
                    times.append(end)
                if not finished:
                    continue
                n = 1
            if req.sink is not None:
                req.sink.emit(req, n, at * n, finished)

    def _start_together(self, t: int) -> None:
        """MoE with DP attention + EP: every DP rank steps together (idle ranks run a dummy
        step) because each MoE layer's all-to-all joins them; the slowest rank sets the step."""
        batches = []
        for inst in self.instances:
            if not inst.inflight:
                b = inst.start_step(t)
                if b is not None:
                    batches.append(b)
        if not batches:
            return
        end = max(b.end_ns for b in batches)
        for b in batches:
            b.end_ns = end
        for inst in self.instances:
            inst.stage_free_ns = max(inst.stage_free_ns, end)
            inst.blocked = False

    def _hand_off(self, req: SimRequest, t: int) -> None:
        """Prefill finished on a prefill instance: move the KV to a decode instance."""
        t_kv = self.cost.kv_transfer_s(
            req.prompt_len, self.timing.kv_link_gb_s, self.timing.kv_setup_ms, self.timing.kv_link_efficiency
        )
        self.stats.kv_transfers += 1
        req.prefilled_remote = True
        req.num_computed = req.prompt_len
        req.prefill_target = req.prompt_len
        req.cache_checked = True
        handoff_ns = int(self.timing.engine_profile.disagg_handoff_ms * 1e6)
        req.ready_ns = t + int(t_kv * 1e9 * self.timing.slowdown) + handoff_ns
        if self.observer is not None:
            self.observer(req, "prefilled", t)
        self._route(req, self.decode_pool).add(req)


# -- virtual time ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Arrival:
    t_s: float
    prompt_len: int
    output_len: int
    prefix_id: int | None = None  # requests with the same prefix_id share their first prefix_len tokens
    prefix_len: int = 0


@dataclass
class Outcome:
    arrival_ns: int
    prompt_len: int
    token_ns: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    replica: int = -1
    queue_ns: int | None = None

    @property
    def ttft_s(self) -> float:
        return (self.token_ns[0] - self.arrival_ns) / 1e9

    @property
    def itls_s(self) -> list[float]:
        return [(b - a) / 1e9 for a, b in zip(self.token_ns, self.token_ns[1:])]

    @property
    def tpot_s(self) -> float:
        n = len(self.token_ns)
        return (self.token_ns[-1] - self.token_ns[0]) / 1e9 / (n - 1) if n > 1 else 0.0

    @property
    def e2e_s(self) -> float:
        return (self.token_ns[-1] - self.arrival_ns) / 1e9


class _Collect:
    def __init__(self, out: Outcome) -> None:
        self.out = out

    def emit(self, req: SimRequest, n: int, intended_ns: tuple[int, ...], finished: bool) -> None:
        self.out.token_ns.extend(intended_ns)
        if finished:
            self.out.cached_tokens = req.cached_tokens
            self.out.replica = req.replica
            if req.admitted_ns is not None:
                self.out.queue_ns = req.admitted_ns - req.arrival_ns


def simulate(
    backend: ModelBackend | FixedBackend, arrivals: Iterable[Arrival], horizon_s: float | None = None
) -> list[Outcome]:
    """Run ``arrivals`` through ``backend`` in virtual time; one Outcome per request."""
    from bench_llm.core.tokenizer import prompt_token_ids

    items = sorted(arrivals, key=lambda a: a.t_s)
    outs: list[Outcome] = []
    i = 0
    limit = None if horizon_s is None else int(horizon_s * 1e9)
    while True:
        next_arrival = int(items[i].t_s * 1e9) if i < len(items) else None
        ev = backend.next_event_ns()
        if next_arrival is None and ev is None:
            break
        if next_arrival is not None and (ev is None or next_arrival <= ev):
            a = items[i]
            i += 1
            out = Outcome(next_arrival, a.prompt_len)
            outs.append(out)
            hashes: tuple[int, ...] = ()
            if isinstance(backend, ModelBackend) and backend.prefix_caching:
                hashes = backend.hashes_for(prompt_token_ids(a.prompt_len, i, a.prefix_id, a.prefix_len))
            req = SimRequest(f"r{i}", next_arrival, a.prompt_len, a.output_len, _Collect(out), hashes)
            backend.advance(next_arrival - 1)
            backend.submit(req)
            continue
        assert ev is not None
        if limit is not None and ev > limit:
            break
        backend.advance(ev)
    return outs
