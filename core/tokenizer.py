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


def prompt_token_ids(n: int, request_seed: int, prefix_id: int | None = None, prefix_len: int = 0) -> list[int]:
    """Synthetic token ids for an ``n``-token prompt; prompts with the same ``prefix_id``
    share their first ``prefix_len`` ids (used by virtual-time tests of the prefix cache)."""
    shared = min(prefix_len, n) if prefix_id is not None else 0
    head = [(prefix_id * 7919 + j * 104729) % 32000 for j in range(shared)] if prefix_id is not None else []
    tail = [(request_seed * 2654435761 + j * 40503 + 17) % 32000 for j in range(n - shared)]
    return head + tail
