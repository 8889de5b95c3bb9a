"""The scheduler's and backend's fast paths give the general paths' steps, bit for bit:
decode steps whose requests need new KV blocks (``Instance._decodes_only``), memoised
decode-only step times (``CostModel.times``), several instances without PP
(``ModelBackend._advance_flat``)."""

from __future__ import annotations

import random

from bench_llm.sim.backend import ModelBackend
from bench_llm.sim.costmodel import CostModel, Parallel
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.presets import GPUS, MODELS, PROFILES
from bench_llm.sim.request import SimRequest
from bench_llm.sim.scheduler import Instance, Limits


def _trace(fast: bool, num_blocks: int) -> list[tuple[object, ...]]:
    """Every step of 60 requests (prompts 20-70 tokens, 3-40 outputs, block size 16) on one
    instance, with the one-pass decode planner on or off."""
    cm = CostModel(MODELS["llama-3.1-8b"], GPUS["h100"], PROFILES["vllm"], Parallel(), "bf16")
    inst = Instance(0, cm, Limits(max_num_seqs=6, max_num_batched_tokens=256, block_size=16, num_blocks=num_blocks))
    inst._mixed_alone = fast
    rng = random.Random(4)
    for i in range(60):
        inst.add(SimRequest(f"r{i}", i * 2_000_000, rng.randint(20, 70), rng.randint(3, 40)))
    out: list[tuple[object, ...]] = []
    t = 0
    for _ in range(5000):
        b = inst.start_step(t)
        if b is None:
            nxt = inst.next_event_ns()
            if nxt is None:
                break
            t = max(t + 1, nxt)
            continue
        done = inst.finish_step(b)
        out.append((b.start_ns, b.end_ns, b.prefill_tokens, b.decode_tokens, [(r.rid, k) for r, k in b.work],
                    [r.rid for r in done], inst.pool.free, len(inst.pool.evictable), inst.preemptions,
                    [(r.rid, r.private_blocks, len(r.shared_blocks)) for r in inst.running]))
        t = b.end_ns
    return out


def test_one_pass_decode_steps_equal_the_general_planners_also_when_blocks_grow_or_run_out() -> None:
    for blocks in (400, 30, 14):  # plenty; tight (preemptions); very tight
        fast, general = _trace(True, blocks), _trace(False, blocks)
        assert fast == general
        assert sum(1 for s in fast if s[2] == 0) > 50  # decode-only steps were taken
    assert any(s[8] for s in _trace(True, 14))  # the tight pool did preempt


def test_decode_only_step_times_are_kept_and_equal_the_formula() -> None:
    cm = CostModel(MODELS["llama-3.1-70b"], GPUS["h100"], PROFILES["vllm"], Parallel(tp=2), "bf16")
    a = cm.times([], 8, 1100)
    assert a == cm._times([], 8, 1100)
    assert cm.times([], 8, 1100) is a  # kept
    assert cm.times([], 8, 1101) != a
    with_prefill = cm.times([(128, 0)], 7, 1000)
    assert with_prefill == cm._times([(128, 0)], 7, 1000)


def test_several_instances_step_as_the_general_event_loop_steps_them() -> None:
    timing = ModelTiming(preset="llama-3.1-8b", gpu="h100", dp=3, max_num_seqs=4)

    def tokens(flat: bool) -> tuple[list[list[int]], list[tuple[str, str, int]]]:
        be = ModelBackend(timing)
        if not flat:
            be.advance = be._advance_events  # type: ignore[method-assign]
        events: list[tuple[str, str, int]] = []
        be.observer = lambda req, ev, t: events.append((req.rid, ev, t))
        # bursts of three alike requests: the instances' steps end at the same times (ties)
        reqs = [SimRequest(f"r{i}", i // 3 * 9_000_000, 50 + i // 3 % 7 * 10, 5 + i // 3 % 9) for i in range(60)]
        for r in reqs:
            r.token_times = []
        for r in reqs:
            be.advance(r.arrival_ns)
            be.submit(r)
        be.advance(1 << 62)
        return [[*r.token_times, r.last_token_ns or 0, r.replica] for r in reqs], events

    flat, general = tokens(True), tokens(False)
    assert flat == general  # the same token times, and the tokens emitted in the same order
    assert len({row[-1] for row in flat[0]}) == 3  # all three instances served
    times = [t for _, _, t in flat[1]]
    assert len(times) > len(set(times))  # ties were broken (as the general loop breaks them)
