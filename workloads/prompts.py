"""Prompt synthesis to a target token count.

Without a tokenizer, prompts are built from words that the simulated engine's
tokenizer counts as exactly one token each ("approx" for other engines: about one
token per short English word; the achieved count is recorded from the server).
"""

from __future__ import annotations

import numpy as np

from sim.tokenizer import VOCAB


def synth_prompt(n_tokens: int, rng: np.random.Generator, prefix: str = "") -> str:
    """A prompt of ``n_tokens`` one-token words (after an optional shared ``prefix``)."""
    if n_tokens <= 0:
        return prefix
    idx = rng.integers(0, len(VOCAB), size=n_tokens)
    body = "".join(VOCAB[i] for i in idx)
    return (prefix + body) if prefix else body.lstrip()
