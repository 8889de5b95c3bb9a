"""Prompts drawn in one batch (``PromptSynth.texts``) are the strings drawn one by one."""

from __future__ import annotations

import numpy as np

from workloads.prompts import PromptSynth
from workloads.synthetic import SyntheticWorkload


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
