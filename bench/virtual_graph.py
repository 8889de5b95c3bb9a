"""Session graphs (workloads/graph.py) as the virtual-time client sends them.

Kept apart from ``bench.virtual``: each graph node's predecessors by send index, with the
delay after each, and its prompt's history built as the load generator builds it
(``loadgen.dispatch``): its context predecessor's conversation, then its other
predecessors' answers, then its own message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench_llm.workloads.spec import RequestSpec, Schedule


@dataclass(frozen=True, slots=True)
class GraphLink:
    after: int  # first predecessor's send index
    delay_ns: int
    joins: tuple[tuple[int, int], ...]  # the other predecessors: (send index, delay ns)
    context: int | None  # the predecessor whose conversation continues; None: fresh
    others: tuple[int, ...]  # predecessors whose answers are appended

    def history(self, history: dict[int, list[str]], specs: Sequence[RequestSpec],
                answer: Callable[[str, int], str]) -> list[str]:
        """The texts before this node's own message (``history[i]``: node i's conversation)."""
        out = list(history.get(self.context, ())) if self.context is not None else []
        for p in self.others:
            out.append(answer(specs[p].request_id, specs[p].max_output_tokens))
        return out


def graph_links(schedule: Schedule) -> dict[int, GraphLink]:
    """Per send index of a graph node that has predecessors, its links (empty: no graph)."""
    specs = schedule.requests
    if not any(s.after for s in specs):
        return {}
    index = {s.request_id: i for i, s in enumerate(specs)}
    out: dict[int, GraphLink] = {}
    for i, s in enumerate(specs):
        if not s.after:
            continue
        parents = [index[p] for p in s.after]
        ctx = index[s.context_from] if s.context_from is not None else None
        out[i] = GraphLink(parents[0], s.after_delay_ns[0], tuple(zip(parents[1:], s.after_delay_ns[1:])), ctx,
                           tuple(p for p in parents if p != ctx))
    return out
