"""Issue 16 item 6: prompts of the length asked for, and said when they are not."""

from __future__ import annotations

import numpy as np

from workloads.prompts import _CountingSynth


def _bpe_like(text: str) -> int:
    """Words of up to four characters are one token, longer ones two (as a small BPE vocabulary
    splits them); words split at spaces, so counts add up."""
    return sum(1 if len(w) <= 4 else 2 for w in text.split())


def test_word_adjusting_hits_exact_lengths_with_multi_token_words() -> None:
    synth = _CountingSynth(_bpe_like)  # what --tokenize-url does, with the server's count
    rng = np.random.default_rng(0)
    for n in range(20, 400, 9):
        assert _bpe_like(synth.text(n, rng)) == n
    assert synth.misses == 0
    prefix = synth.text(100, rng)
    assert _bpe_like(synth.text(50, rng, prefix)) == 150


def test_an_unreachable_length_keeps_the_closest_try() -> None:
    synth = _CountingSynth(lambda t: 2 * len(t.split()))  # every word two tokens: odd lengths cannot be hit
    rng = np.random.default_rng(1)
    for n in (21, 57, 129):
        got = 2 * len(synth.text(n, rng).split())
        assert abs(got - n) == 1, (n, got)
    assert synth.misses == 3
