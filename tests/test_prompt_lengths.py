"""Issue 16 item 6: prompts of the length asked for, and said when they are not."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.format import format_summary
from analysis.summary import prompt_length_accounting
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


def _rows(got: list[int | None], want: int = 128, turns: list[int | None] | None = None) -> pd.DataFrame:
    return pd.DataFrame({"prompt_tokens": pd.array(got, dtype="Int32"), "input_tokens_target": want,
                         "turn": pd.array(turns or [None] * len(got), dtype="Int32")})  # fmt: skip


def test_prompt_lengths_compared_and_warned() -> None:
    exact = prompt_length_accounting(_rows([128] * 10))
    assert exact["compared"] == 10 and exact["exact_share"] == 1.0 and exact["ratio_p50"] == 1.0
    assert exact["warning"] is None
    # what real vLLM did with --input-tokens 128 and the word approximation: 171-214, p50 192
    off = prompt_length_accounting(_rows([171, 192, 192, 214, 180, 200, 128, None]))
    assert off["compared"] == 7 and off["exact_share"] == pytest.approx(1 / 7)
    assert off["ratio_p50"] == pytest.approx(1.5)
    assert off["warning"] and "not the length asked for" in off["warning"]
    # a later turn holds the conversation so far: not compared
    turns = prompt_length_accounting(_rows([128, 900], turns=[0, 1]))
    assert turns["compared"] == 1 and turns["warning"] is None


def test_summary_text_prints_the_prompt_line_and_warning() -> None:
    s = {
        "requests": {"measured": 1, "ok": 1, "failed": 0, "errors": {}, "warmup_excluded": 0, "cancelled_at_end": 0},
        "throughput": {"requests_per_s": 1.0, "output_tokens_per_s": 1.0, "total_tokens_per_s": 1.0},
        "window_s": 1.0, "percentiles": [50], "latency": {}, "client": {},
        "tokens": {"sources": {}, "chunk_vs_server_mismatches": 0, "shorter_than_requested": 0,
                   "prompt": prompt_length_accounting(_rows([192, 192, 171]))},
    }  # fmt: skip
    text = format_summary(s)
    assert "prompt tokens, server vs requested (n=3): 0% exact, p50 ratio 1.50" in text
    assert "WARNING: prompts are not the length asked for" in text
