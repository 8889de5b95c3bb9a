"""One engine instance's scheduler, in virtual time.

What a step carries follows the engine profile's scheduling policy (``sim.policy``). With
the default (vLLM V1 style) each step takes the decodes first (one token per running
request), then prefill chunks FCFS (partial prefills first, then newly admitted requests)
up to the token budget and ``max_num_seqs``; prefill-first policies (vLLM V0, SGLang, TGI)
alternate prefill-only steps, which stall every running stream, with decode-only steps. KV blocks are allocated for the tokens a step computes; when they run
out the newest running request is preempted (recompute). Admission of a new request
keeps a small watermark of free blocks. With pipeline parallelism up to ``pp``
micro-batches are in flight, each over a disjoint set of requests.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass
from typing import Literal

from bench_llm.sim.costmodel import CostModel
from bench_llm.sim.kvcache import BlockPool
from bench_llm.sim.request import SimRequest
from bench_llm.sim.spec_counts import SpecDecodeCounts

Role = Literal["both", "prefill", "decode"]


@dataclass(frozen=True, slots=True)
class Limits:
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_blocks: int
    watermark: float = 0.01
    prefix_caching: bool = True
    #: KV reserved for output not yet generated, at admission (``EngineProfile.kv_reserve_ratio``): a
    #: new request is admitted only when the free KV, less ``reserve_ratio`` x each running request's
    #: remaining output (at most ``reserve_clip`` tokens), holds its prompt and its whole remaining
    #: output (at most ``reserve_clip``). 0: no reservation (vLLM: blocks are allocated as tokens come)
    reserve_ratio: float = 0.0
    reserve_clip: int = 1 << 30


@dataclass(slots=True)
class Batch:
    start_ns: int
    end_ns: int
    work: list[tuple[SimRequest, int]]  # (request, tokens computed this step)
    prefill_tokens: int
    decode_tokens: int


def _blocks_short(req: SimRequest, tokens: int, block_size: int) -> int:
    """KV blocks ``req`` must add to hold ``tokens`` tokens (0 or less: it holds them)."""
    return -(-tokens // block_size) - len(req.shared_blocks) - req.private_blocks


class _Plan:
    """The step being planned (a mutable accumulator, local to ``Instance.start_step``)."""

    __slots__ = ("budget", "work", "prefill", "n_dec", "dec_ctx", "width")

    def __init__(self, budget: int, width: int = 1) -> None:
        self.budget = budget
        #: budget tokens one decode takes: 1, or 1 + k with speculative decoding (it verifies k drafts)
        self.width = width
        self.work: list[tuple[SimRequest, int]] = []
        self.prefill: list[tuple[int, int]] = []  # (chunk tokens, context before the chunk)
        self.n_dec = 0
        self.dec_ctx = 0

    def add_decode(self, req: SimRequest) -> None:
        self.work.append((req, 1))
        req.in_flight = True
        self.n_dec += 1
        self.dec_ctx += req.num_computed + 1
        self.budget -= self.width

    def add_prefill(self, req: SimRequest, chunk: int) -> None:
        self.work.append((req, chunk))
        self.prefill.append((chunk, req.num_computed))
        req.in_flight = True
        self.budget -= chunk


class Instance:
    """One engine instance (a DP replica, or a prefill/decode pool member)."""

    def __init__(
        self,
        index: int,
        cost: CostModel,
        limits: Limits,
        role: Role = "both",
        pp: int = 1,
        slowdown: float = 1.0,
        jitter: float = 0.0,
        rng: random.Random | None = None,
        spec_accept: float = 0.0,
    ) -> None:
        self.index = index
        self.cost = cost
        self.limits = limits
        self.role = role
        self.pp = pp
        self.slowdown = slowdown
        self.jitter = jitter
        self.rng = rng or random.Random(index)
        self.pool = BlockPool(limits.num_blocks, limits.prefix_caching)
        self.pending: list[tuple[int, int, SimRequest]] = []  # heap by ready time
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.inflight: list[Batch] = []
        self.stage_free_ns = 0
        self.clock = 0  # virtual time of the last event this instance processed
        self.blocked = False
        self._seq = 0
        self.preemptions = 0
        self.steps = 0
        self.busy_ns = 0
        self.last_batch_tokens = 0
        self._watermark_blocks = int(limits.num_blocks * limits.watermark)
        self.policy = cost.prof.scheduling_policy()
        self.decode_steps = 0  # decode steps since the last prefill step (prefill-first policies)
        self.several = False  # a request of several sequences (n > 1) was added: ``_launch`` counts them
        #: speculative decoding: a decode computes (and holds KV for) 1 + k tokens and keeps 1 + the accepted
        #: drafts, drawn from ``rng`` (``finish_step``); ``ahead`` is that 1 + k
        self.spec_tokens = cost.spec_tokens
        self.spec_accept = spec_accept
        self.ahead = 1 + cost.spec_tokens
        #: the engine's counters (/metrics): each verification step's whole accepted chain. Where the
        #: output's end cut the chain short, its rest is drawn from ``spec_tail_rng`` (counters only), so
        #: the tokens and timings stay those of ``rng`` alone
        self.spec = SpecDecodeCounts(cost.spec_tokens)
        self.spec_tail_rng = random.Random(0x5EED0000 + index)
        #: mixed steps, both roles, no PP: a step may be planned by ``_decodes_only``
        self._mixed_alone = self.policy.mixed and role == "both" and pp == 1

    # -- queue -------------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        req.replica = self.index
        if req.seqs > 1:
            self.several = True
        self._seq += 1
        heapq.heappush(self.pending, (req.ready_ns, self._seq, req))
        self.blocked = False

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.pending)

    @property
    def load(self) -> int:
        return self.num_waiting + len(self.running)

    def _release_pending(self, t: int) -> None:
        pending = self.pending
        while pending and pending[0][0] <= t:
            req = heapq.heappop(pending)[2]
            if not req.aborted:
                self.waiting.append(req)

    # -- events ------------------------------------------------------------------------
    def next_event_ns(self) -> int | None:
        """The next step end or step start (the backend asks every instance before each event)."""
        inflight = self.inflight
        if self.pp == 1:  # one step in flight at most; none running is in one when none is in flight
            if inflight:
                return inflight[0].end_ns
            if not self.blocked and (self.waiting or self.running):
                return self.stage_free_ns if self.stage_free_ns > self.clock else self.clock
            if self.pending:
                return max(self.stage_free_ns, self.clock, self.pending[0][0])
            return None
        ev: int | None = None
        if inflight:
            ev = inflight[0].end_ns if len(inflight) == 1 else min(b.end_ns for b in inflight)
            if len(inflight) >= self.pp:
                return ev
        start: int | None = None
        if not self.blocked and (self.waiting or any(not r.in_flight for r in self.running)):
            start = self.stage_free_ns if self.stage_free_ns > self.clock else self.clock
        elif self.pending:
            start = max(self.stage_free_ns, self.clock, self.pending[0][0])
        if start is not None and (ev is None or start < ev):
            return start
        return ev

    def pop_completion(self, t: int) -> Batch | None:
        inflight = self.inflight
        if len(inflight) == 1:  # (pp = 1: at most one step in flight)
            best = inflight[0]
            if best.end_ns > t:
                return None
            inflight.clear()
        else:
            due = [b for b in inflight if b.end_ns <= t]
            if not due:
                return None
            best = min(due, key=lambda x: x.end_ns)
            inflight.remove(best)
        self.clock = max(self.clock, best.end_ns)
        self.blocked = False
        return best

    # -- KV helpers ----------------------------------------------------------------------
    def _grow(self, req: SimRequest, tokens: int, watermark: int = 0) -> bool:
        need = _blocks_short(req, tokens, self.limits.block_size)
        if need <= 0:
            return True
        if self.pool.available - need < watermark:
            return False
        if not self.pool.alloc(need):
            return False
        req.private_blocks += need
        return True

    def free(self, req: SimRequest) -> None:
        if req.shared_blocks:
            self.pool.release_all(req.shared_blocks)
            req.shared_blocks = []
        self.pool.free_private(req.private_blocks)
        req.private_blocks = 0

    def _register_full_blocks(self, req: SimRequest) -> None:
        """Turn the request's newly filled prompt blocks into cached ones (``BlockPool.register``,
        inlined: this runs after every prefill chunk)."""
        hashes = req.block_hashes
        pool = self.pool
        if not hashes or not pool.prefix_caching:
            return
        full = min(req.num_computed // self.limits.block_size, len(hashes))
        shared = req.shared_blocks
        n = len(shared)
        private = req.private_blocks
        refs = pool.refs
        while n < full and private > 0:
            h = hashes[n]
            if h in refs:
                break
            refs[h] = 1
            private -= 1
            shared.append(h)
            n += 1
        req.private_blocks = private

    def _preempt(self, victim: SimRequest) -> None:
        self.free(victim)
        victim.num_computed = 0
        victim.prefill_target = victim.prompt_len + victim.generated
        victim.cache_checked = False
        victim.preemptions += 1
        self.preemptions += 1
        self.running.remove(victim)
        self.waiting.appendleft(victim)

    def _admit_prefix(self, req: SimRequest) -> None:
        """First look-up of the prefix cache for a newly admitted request."""
        if req.cache_checked:
            return
        req.cache_checked = True
        if req.prefilled_remote or req.num_computed:
            return
        bs = self.limits.block_size
        limit = (req.prefill_target - 1) // bs
        hit = self.pool.lookup(req.block_hashes, limit)
        if req.generated == 0:
            self.pool.queries += req.prompt_len
            self.pool.hits += hit * bs
        for h in req.block_hashes[:hit]:
            self.pool.acquire(h)
        req.shared_blocks = list(req.block_hashes[:hit])
        req.num_computed = hit * bs
        if req.generated == 0:
            req.cached_tokens = hit * bs

    # -- one step --------------------------------------------------------------------------
    def start_step(self, t: int) -> Batch | None:
        """Plan and cost one step (micro-batch) starting at virtual time ``t``."""
        if self.clock < t:
            self.clock = t
        pending = self.pending
        if pending and pending[0][0] <= t:
            self._release_pending(t)
        if self._mixed_alone:
            decodes = self._decodes_only()
            if decodes is not None:
                return self._launch(decodes, t)
        plan = _Plan(self.limits.max_num_batched_tokens, self.ahead)
        pol = self.policy
        if pol.mixed or self.role != "both":
            if self.role != "prefill":
                self._plan_decodes(plan)
            self._plan_prefills(plan, t, whole=False)
        else:
            in_pf = sum(1 for r in self.running if r.in_prefill and not r.in_flight and not r.aborted)
            if pol.prefill_turn(len(self.waiting), len(self.running), in_pf, self.decode_steps):
                self._plan_prefills(plan, t, whole=not pol.chunked)
            if not plan.work:  # a decode step (or nothing could be admitted: decode instead of idling)
                self._plan_decodes(plan)
            self.decode_steps = 0 if plan.prefill else self.decode_steps + 1
        if not plan.work:
            self.blocked = True
            return None
        return self._launch(plan, t)

    def _decodes_only(self) -> _Plan | None:
        """The step ``_plan_decodes`` and ``_plan_prefills`` plan when it can only be the next
        decode of every running request (none in prefill, aborted or in flight, the new blocks
        their next tokens need all free or evictable, within the token budget, and no admission
        possible: nothing waiting or ``max_num_seqs`` running), found in one pass; None
        otherwise. Most steps of a loaded engine are these (mixed policy, one role, no PP:
        ``_mixed_alone``). The blocks are allocated request by request in ``running`` order,
        as ``_plan_decodes`` allocates them (none can fail: their sum is available)."""
        running = self.running
        n = len(running)
        lim = self.limits
        ahead = self.ahead
        if not n or n * ahead > lim.max_num_batched_tokens or (self.waiting and n < lim.max_num_seqs):
            return None
        bs = lim.block_size
        dec_ctx = 0
        growing: list[tuple[SimRequest, int]] | None = None
        for req in running:
            nc = req.num_computed
            if nc < req.prefill_target or req.aborted or req.in_flight:
                return None
            need = _blocks_short(req, nc + ahead, bs)
            if need > 0:
                if growing is None:
                    growing = [(req, need)]
                else:
                    growing.append((req, need))
            dec_ctx += nc + 1
        if growing is not None:
            pool = self.pool
            if sum(k for _, k in growing) > pool.available:
                return None  # (the general path preempts)
            for req, need in growing:
                pool.alloc(need)
                req.private_blocks += need
        plan = _Plan(lim.max_num_batched_tokens - n * ahead, ahead)
        for req in running:
            req.in_flight = True
        plan.work = [(req, 1) for req in running]
        plan.n_dec = n
        plan.dec_ctx = dec_ctx
        return plan

    def _plan_decodes(self, plan: "_Plan") -> None:
        """One token for every running request in decode (preempting the newest when KV runs out).

        With pipeline parallelism a micro-batch takes at most 1/pp of the running requests (vLLM's
        virtual engines each schedule their own share), so the pp stages all have work.

        This runs once per request per generated token, so the common case (the request's blocks
        already hold its next token) is inlined: it is ``_grow``'s no-op and ``add_decode``."""
        i = 0
        running = self.running
        share = -(-len(running) // self.pp) if self.pp > 1 else len(running)
        bs = self.limits.block_size
        ahead = self.ahead
        work = plan.work
        budget = plan.budget
        n_dec = plan.n_dec
        dec_ctx = plan.dec_ctx
        n = len(running)  # changes only when the general path preempts
        while i < n and budget >= ahead and n_dec < share:
            req = running[i]
            i += 1
            nc = req.num_computed
            if req.in_flight or nc < req.prefill_target or req.aborted:
                continue
            if _blocks_short(req, nc + ahead, bs) > 0:
                # a new block is needed: the general path (may preempt)
                plan.budget, plan.n_dec, plan.dec_ctx = budget, n_dec, dec_ctx
                i = self._decode_growing(plan, req, i)
                budget, n_dec, dec_ctx = plan.budget, plan.n_dec, plan.dec_ctx
                n = len(running)
                continue
            work.append((req, 1))
            req.in_flight = True
            n_dec += 1
            dec_ctx += nc + 1
            budget -= ahead
        plan.budget, plan.n_dec, plan.dec_ctx = budget, n_dec, dec_ctx

    def _decode_growing(self, plan: "_Plan", req: SimRequest, i: int) -> int:
        """``_plan_decodes`` for a request that needs a new KV block (``i``: the index after it);
        returns the index to continue from."""
        while not self._grow(req, req.num_computed + self.ahead):
            victim = next((r for r in reversed(self.running) if not r.in_flight and r is not req), None)
            if victim is None:
                break
            if self.running.index(victim) < i:
                i -= 1
            self._preempt(victim)
        else:
            plan.add_decode(req)
            return i
        # could not grow even after preempting everything else: preempt itself
        self._preempt(req)
        return i - 1

    def _chunk(self, plan: "_Plan", req: SimRequest, whole: bool) -> int:
        """Tokens of ``req``'s prompt this step computes (0: leave it for a later step)."""
        remaining = req.prefill_target - req.num_computed
        if remaining <= plan.budget:
            return remaining
        if whole:  # a prompt is never split: it goes alone when it exceeds the budget
            return 0 if plan.work else remaining
        return plan.budget

    def _plan_prefills(self, plan: "_Plan", t: int, whole: bool) -> None:
        """Partial prefills of running requests, then new admissions FCFS, within the budget."""
        lim = self.limits
        # partial prefills (preempting the newest when blocks run out, so two half-prefilled
        # prompts can never hold each other's blocks forever)
        running = self.running
        i = 0
        n = len(running)  # changes only when a preemption below removes a request
        while i < n and plan.budget > 0:
            req = running[i]
            i += 1
            if req.in_flight or req.num_computed >= req.prefill_target or req.aborted:
                continue  # (every decoding request: this scan runs once per step, keep it lean)
            chunk = self._chunk(plan, req, whole)
            if not chunk:
                break
            grown = self._grow(req, req.num_computed + chunk)
            while not grown:
                victim = next((r for r in reversed(running) if not r.in_flight and r is not req), None)
                if victim is None or running.index(victim) < i - 1:
                    break  # never preempt an older request for a newer one's prefill
                self._preempt(victim)
                n = len(running)
                grown = self._grow(req, req.num_computed + chunk)
            if grown:
                plan.add_prefill(req, chunk)
        # admit waiting requests
        reserved = self._reserved_blocks() if lim.reserve_ratio > 0 and self.waiting else 0
        while self.waiting and plan.budget > 0 and len(self.running) < lim.max_num_seqs:
            req = self.waiting[0]
            if req.aborted:
                self.waiting.popleft()
                continue
            self._admit_prefix(req)
            if lim.reserve_ratio > 0:
                need = self._reservation(req)
                if self.running and self.pool.available - reserved < need:
                    self._unadmit_prefix(req)
                    break  # (an idle engine admits the request whatever its reservation, as the engines do)
                reserved += need
            if req.prefilled_remote and not req.in_prefill:
                if not self._grow(req, req.num_computed + self.ahead, self._watermark_blocks):
                    break
                self.waiting.popleft()
                self.running.append(req)
                req.admitted_ns = req.admitted_ns or t
                plan.add_decode(req)
                continue
            chunk = self._chunk(plan, req, whole)
            if not chunk or not self._grow(req, req.num_computed + chunk, self._watermark_blocks):
                self._unadmit_prefix(req)
                break
            self.waiting.popleft()
            self.running.append(req)
            if req.admitted_ns is None:
                req.admitted_ns = t
            plan.add_prefill(req, chunk)

    def _unadmit_prefix(self, req: SimRequest) -> None:
        """Undo ``_admit_prefix`` for a request left waiting: a waiting request holds no blocks (vLLM's
        scheduler looks its prefix up again at each try and takes the blocks only when it is admitted).
        Without it, requests preempted under KV pressure and put back at the queue's head each kept
        their prompt's cached blocks while waiting, until the waiting ones held the whole KV cache and
        nothing could run (a deadlock at 70B TP1, 8192/1024, C64 with prefix caching)."""
        if not req.cache_checked or req.prefilled_remote or not req.shared_blocks or req.private_blocks:
            return
        hit = len(req.shared_blocks)
        self.free(req)  # its shared blocks (it holds no private one yet)
        req.num_computed = 0
        req.cache_checked = False
        if req.generated == 0:
            req.cached_tokens = 0
            self.pool.queries -= req.prompt_len
            self.pool.hits -= hit * self.limits.block_size

    def _reservation(self, req: SimRequest) -> int:
        """KV blocks a request about to be admitted must find free: its prompt's blocks not yet held
        and its remaining output (clipped), in full."""
        lim = self.limits
        out = min(req.max_tokens - req.generated, lim.reserve_clip)
        return max(0, _blocks_short(req, req.prefill_target + out, lim.block_size))

    def _reserved_blocks(self) -> int:
        """KV blocks held back for the running requests' remaining output (``Limits.reserve_ratio``)."""
        lim = self.limits
        tokens = 0.0
        for r in self.running:
            tokens += min(r.max_tokens - r.generated, lim.reserve_clip)
        return int(tokens * lim.reserve_ratio) // lim.block_size

    def _launch(self, plan: "_Plan", t: int) -> Batch:
        n_dec, dec_ctx = plan.n_dec, plan.dec_ctx
        if self.several:  # n > 1: each decode of such a request is a token of each of its sequences
            for req, k in plan.work:
                if req.seqs > 1 and k == 1 and req.num_computed >= req.prefill_target:
                    n_dec += req.seqs - 1
                    dec_ctx += (req.seqs - 1) * (req.num_computed + 1)
        latency_s, occupancy_s, _ = self.cost.times(plan.prefill, n_dec, dec_ctx)
        factor = self.slowdown
        if self.jitter > 0:
            factor *= min(1.5, max(0.5, self.rng.gauss(1.0, self.jitter)))
        end = t + int(latency_s * factor * 1e9)
        busy = int(occupancy_s * factor * 1e9)
        self.stage_free_ns = t + busy
        pf = 0
        for chunk, _ctx in plan.prefill:
            pf += chunk
        b = Batch(t, end, plan.work, pf, n_dec)
        self.inflight.append(b)
        self.steps += 1
        self.busy_ns += busy
        self.last_batch_tokens = pf + n_dec
        return b

    def finish_step(self, b: Batch) -> list[SimRequest]:
        """Apply a finished step; returns the requests it gave a token to, or, on a prefill
        instance (``role == "prefill"``), the requests whose prefill it completed."""
        out: list[SimRequest] = []
        append = out.append
        end = b.end_ns
        running = self.running
        prefill_role = self.role == "prefill"
        for req, n in b.work:
            req.in_flight = False
            if req.aborted:
                if req in running:
                    running.remove(req)
                self.free(req)
                continue
            target = req.prefill_target
            was_prefill = req.num_computed < target
            req.num_computed += n
            if was_prefill:
                self._register_full_blocks(req)
                if req.num_computed < target:
                    continue  # more chunks to go
                if prefill_role:
                    req.prefill_done_ns = end
                    running.remove(req)
                    self.free(req)
                    append(req)
                    continue
            if self.spec_tokens:
                kept = 1 if was_prefill else self._accepted_tokens(req)
                req.num_computed += kept - 1
                req.generated += kept
                req.step_tokens = kept
            else:
                req.generated += 1
            if req.prefill_done_ns is None:
                req.prefill_done_ns = end
            if req.generated >= req.max_tokens:
                req.finished = True
                running.remove(req)
                self.free(req)
            append(req)
        return out

    def _accepted_tokens(self, req: SimRequest) -> int:
        """Tokens a speculative decode keeps: its own, then each draft in turn while they are accepted
        (the first rejected one ends the chain), no more than the output has left; counted in ``spec``
        with the whole chain the engine verified (``sim.spec_counts``)."""
        kept = 1
        k = self.spec_tokens
        room = min(k + 1, req.max_tokens - req.generated)
        random_ = self.rng.random
        while kept < room and random_() < self.spec_accept:
            kept += 1
        chain = kept - 1
        if kept == room <= k:  # cut by the output's end, not by a rejection: the engine verified on
            tail = self.spec_tail_rng.random
            while chain < k and tail() < self.spec_accept:
                chain += 1
        self.spec.by_accepted[chain] += req.seqs  # (``SpecDecodeCounts.observe``, inlined)
        return kept

    def abort(self, req: SimRequest) -> None:
        req.aborted = True
        if req.in_flight:
            return
        if req in self.running:
            self.running.remove(req)
            self.free(req)
        elif req in self.waiting:
            self.waiting.remove(req)
            self.free(req)
        self.blocked = False
