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
    """Cumulative speculative-decoding counts of one engine (or the sum of its instances), kept as
    verification steps by the drafts they accepted (one increment a step: the scheduler's hot path);
    vLLM's four counters derive from it."""

    k: int  # draft tokens verified per step (``spec_tokens``)
    #: verification steps (one per sequence per decode step) by the number of drafts accepted, 0..k
    by_accepted: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.by_accepted) != self.k + 1:
            self.by_accepted = [0] * (self.k + 1)

    def observe(self, accepted: int, seqs: int = 1) -> None:
        """One verification step of ``seqs`` sequences, each accepting its first ``accepted`` drafts."""
        self.by_accepted[accepted] += seqs

    @property
    def drafts(self) -> int:
        return sum(self.by_accepted)

    @property
    def draft_tokens(self) -> int:
        return self.k * self.drafts

    @property
    def accepted(self) -> int:
        return sum(n * c for n, c in enumerate(self.by_accepted))

    @property
    def accepted_per_pos(self) -> list[int]:
        """Steps whose accepted chain reached draft position i (0-based), i < k."""
        return [sum(self.by_accepted[i + 1 :]) for i in range(self.k)]

    @classmethod
    def total(cls, k: int, parts: Iterable[SpecDecodeCounts]) -> SpecDecodeCounts:
        out = cls(k)
        for p in parts:
            for n, c in enumerate(p.by_accepted):
                out.by_accepted[n] += c
        return out
