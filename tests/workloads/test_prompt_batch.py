"""Prompts drawn in one batch (``PromptSynth.texts``) are the strings drawn one by one."""

from __future__ import annotations

import numpy as np

from bench_llm.workloads.prompts import PromptSynth
from bench_llm.workloads.synthetic import SyntheticWorkload


def test_texts_equal_one_text_call_per_prompt() -> None:
    synth = PromptSynth()
    for count, n_tokens in ((1, 1), (3, 7), (50, 128), (5, 1000)):
        one_by_one = np.random.default_rng([9, count])
        batched = np.random.default_rng([9, count])
        expected = [synth.text(n_tokens, one_by_one) for _ in range(count)]
        assert synth.texts(count, n_tokens, batched) == expected
        # and the generator is left where the one-by-one draws leave it
        assert batched.integers(0, 1 << 30, 4).tolist() == one_by_one.integers(0, 1 << 30, 4).tolist()


def test_a_synth_with_its_own_text_is_called_per_prompt() -> None:
    class Counting(PromptSynth):
        calls = 0

        def text(self, n_tokens: int, rng: np.random.Generator, prefix: str = "") -> str:
            Counting.calls += 1
            return "x" * n_tokens

    assert Counting().texts(4, 3, np.random.default_rng(0)) == ["xxx"] * 4
    assert Counting.calls == 4


def test_synthetic_schedule_prompts_as_drawn_one_by_one() -> None:
    class OneByOne(PromptSynth):  # its own text(): texts() falls back to a call per prompt
        def text(self, n_tokens: int, rng: np.random.Generator, prefix: str = "") -> str:
            return super().text(n_tokens, rng, prefix)

    for salt in (None, 77):
        w = SyntheticWorkload(requests=30, input_tokens=16, output_tokens=4, rate=3.0, warmup=2, seed=5, salt=salt)
        batched, single = w.schedule(), w.schedule(OneByOne())
        assert [r.prompt for r in batched.requests] == [r.prompt for r in single.requests]
        assert [r.send_offset_ns for r in batched.requests] == [r.send_offset_ns for r in single.requests]
        assert len({r.prompt for r in batched.requests}) == 32


def test_a_repeated_draw_is_kept_and_leaves_the_generator_where_a_fresh_draw_does() -> None:
    from bench_llm.workloads import prompts

    synth = PromptSynth()
    first = synth.texts(20, 16, np.random.default_rng([3, 5]))
    key = prompts._texts_key(20, 16, np.random.default_rng([3, 5]))
    assert key in prompts._TEXTS  # kept
    again = np.random.default_rng([3, 5])
    assert synth.texts(20, 16, again) == first
    fresh = np.random.default_rng([3, 5])
    fresh.integers(0, 10, size=20 * 16)  # the draw, uncached
    assert again.integers(0, 1 << 30, 4).tolist() == fresh.integers(0, 1 << 30, 4).tolist()
    # another state is another draw
    assert synth.texts(20, 16, np.random.default_rng([3, 6])) != first


def test_kept_draws_stay_within_their_word_bound(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from bench_llm.core.memo import SizedMemo
    from bench_llm.workloads import prompts

    monkeypatch.setattr(prompts, "_TEXTS", SizedMemo(100))
    synth = PromptSynth()
    for seed in range(5):
        synth.texts(4, 10, np.random.default_rng(seed))  # 40 words each
    assert sum(k[0] * k[1] for k in prompts._TEXTS) <= 100
    assert len(prompts._TEXTS) == 2  # the two newest
    assert prompts._TEXTS.size == sum(k[0] * k[1] for k in prompts._TEXTS)  # the running count
    synth.texts(20, 10, np.random.default_rng(9))  # 200 words: beyond the bound, not kept
    assert len(prompts._TEXTS) == 2
