"""What speculative decoding verified, counted as vLLM counts it (the /metrics pages read it).

vLLM 0.32 (``v1/core/sched/scheduler.py`` ``update_from_output``, ``v1/spec_decode/metrics.py``):
each step that verifies a sequence's drafts adds one *draft* (a verification step), the drafts
it scheduled (``k``: vLLM does not shorten them near ``max_tokens``) and the drafts the
rejection sampler accepted in a row, *before* the stop check trims the output to its length;
accepted position ``i`` (0-based) counts the steps whose chain reached it. A prefill step
verifies none. One ``SpecDecodeCounts`` per scheduler instance; the backend sums them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class SpecDecodeCounts:
    """Cumulative speculative-decoding counts of one engine (or the sum of its instances)."""

    k: int  # draft tokens verified per step (``spec_tokens``)
    drafts: int = 0  # verification steps (one per sequence per decode step)
    draft_tokens: int = 0
    accepted: int = 0  # draft tokens accepted
    #: steps whose accepted chain reached draft position i (0-based), i < k
    accepted_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.accepted_per_pos) != self.k:
            self.accepted_per_pos = [0] * self.k

    def observe(self, accepted: int, seqs: int = 1) -> None:
        """One verification step of ``seqs`` sequences, each accepting its first ``accepted`` drafts."""
        self.drafts += seqs
        self.draft_tokens += self.k * seqs
        self.accepted += accepted * seqs
        per_pos = self.accepted_per_pos
        for i in range(accepted):
            per_pos[i] += seqs

    @classmethod
    def total(cls, k: int, parts: Iterable[SpecDecodeCounts]) -> SpecDecodeCounts:
        out = cls(k)
        for p in parts:
            out.drafts += p.drafts
            out.draft_tokens += p.draft_tokens
            out.accepted += p.accepted
            for i, n in enumerate(p.accepted_per_pos):
                out.accepted_per_pos[i] += n
        return out
