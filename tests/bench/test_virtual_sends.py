"""``schedule_sends`` keeps prompts' lengths and block hashes for the next load that sends
the same prompts: the sends are those computed afresh."""

from __future__ import annotations

from bench_llm.bench import virtual
from bench_llm.bench.virtual import schedule_sends
from bench_llm.sim.backend import ModelBackend
from bench_llm.sim.options import ModelTiming
from bench_llm.workloads.synthetic import SyntheticWorkload


def _schedule(rate: float):  # type: ignore[no-untyped-def]
    return SyntheticWorkload(requests=50, input_tokens=70, output_tokens=4, rate=rate, seed=3, salt=1).schedule()


def test_known_prompts_give_the_sends_computed_afresh() -> None:
    be = ModelBackend(ModelTiming(preset="llama-3.1-8b"))
    virtual._KNOWN.table((-1, False))  # forget what earlier tests sent
    first = schedule_sends(_schedule(5.0), be)
    assert virtual._KNOWN.key == (be.block_size, be.prefix_caching) and len(virtual._KNOWN.by_text) == 50
    again = schedule_sends(_schedule(9.0), be)  # same prompts, other arrival times
    virtual._KNOWN.table((-1, False))  # forget
    fresh = schedule_sends(_schedule(9.0), be)
    assert again == fresh and [s.block_hashes for s in again] == [s.block_hashes for s in first]
    assert all(s.prompt_len == 70 and len(s.block_hashes) == 70 // be.block_size for s in fresh)
    assert [s.at_ns for s in again] != [s.at_ns for s in first]


def test_another_block_size_is_not_served_from_the_kept_hashes() -> None:
    small = ModelBackend(ModelTiming(preset="llama-3.1-8b"))
    schedule_sends(_schedule(5.0), small)
    small.block_size = small.block_size * 2
    assert all(len(s.block_hashes) == 70 // small.block_size for s in schedule_sends(_schedule(5.0), small))
