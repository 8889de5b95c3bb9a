"""A deterministic tokenizer shared by the simulated engine and prompt synthesis.

A token is a run of non-space characters with the whitespace before it, so
``" the"`` is one token. Prompts made of N space-separated words are exactly N tokens.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"\s*\S+")

#: Output vocabulary: short common words, so synthetic text looks like text.
VOCAB: tuple[str, ...] = tuple(
    " " + w
    for w in (
        "the of and to in is that for it as was with be by on not he this are or his from at which but have "
        "an they you were her she there one all we their been has would when if more can will no so what "
        "out up into some could them other than then now only its time over also new these two may first "
        "any like our after most made most even through much where way well down should because each just "
        "those people how too little state good very make world still own see men work long get here "
        "between both life being under never day same another know while last might us great old year off "
        "come since against go came right used take three"
    ).split()
)


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def tokenize(text: str) -> list[int]:
    """Token ids: a stable hash of each token's text into a 32k vocabulary."""
    out = []
    for piece in _TOKEN.findall(text):
        h = 2166136261
        for b in piece.strip().encode():
            h = ((h ^ b) * 16777619) & 0xFFFFFFFF
        out.append(h % 32000)
    return out


def output_token(request_seed: int, index: int) -> str:
    """The ``index``-th generated token of a request: deterministic text."""
    return VOCAB[(request_seed * 2654435761 + index * 40503) % len(VOCAB)]
