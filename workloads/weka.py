"""Agentic coding traces in the Weka KV-cache-tester format, as session graphs.

The format (the ``semianalysisai/cc-traces-weka-*`` datasets of Claude Code sessions, which
inference-perf and AIPerf replay): one JSON object per trace (a ``.json`` file, or one per line
of a ``.jsonl`` file)::

    {"id": "...", "models": ["..."], "block_size": 64, "tool_tokens": 0, "system_tokens": 0,
     "requests": [
       {"t": 0.0, "type": "s", "model": "...", "in": 12000, "out": 300, "hash_ids": [...],
        "api_time": 4.2, "think_time": 0.0, "ttft": 0.9},
       {"t": 6.1, "type": "subagent", "agent_id": "...", "subagent_type": "...", "duration_ms": 30000,
        "requests": [{"t": 0.5, "type": "n", "in": 3000, "out": 200, ...}, ...]},
       ...]}

``t`` is seconds from the trace's start (a sub-agent's requests may count from the sub-agent's
own ``t``); ``in`` is the whole prompt, ``out`` the answer's tokens, ``api_time`` how long the
call took. One trace becomes one job (``workloads/graph.py``):

* the main requests (types ``n`` and ``s``) form the orchestrator's chain; each follows the one
  before after the recorded gap (its ``t`` − the previous one's ``t + api_time``, else its
  ``think_time``, at least 0);
* a request whose prompt grew by at least the previous prompt and answer, and whose
  ``hash_ids`` start with the previous prompt's full blocks (where both have them), continues
  that conversation, its new tokens the growth; any other prompt (the history was compacted or
  rewritten) starts a fresh conversation of its whole length; in both cases less the answers
  of its other predecessors, which the replay puts into the prompt (so the whole prompt is
  the recorded length when answers are the recorded lengths);
* a sub-agent starts after the main request before it (a fresh conversation: its requests in
  time order, chained the same way); the next main request waits for every sub-agent started
  since the previous one (a join), after the recorded gap from each one's end.

What is kept: lengths, the graph, the gaps, and (through the continuation rule) where the
recorded prefix was reused. What is not: the block ids as text (the prompt text is bench's own;
a block shared by two unrelated conversations is not shared here), the models, and the
recorded time-to-first-token figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.graph import MAX_DELAY_S, JobGraph, Node


def is_weka(path: Path) -> bool:
    """Whether ``path`` holds Weka traces: its first object has ``requests`` and ``block_size``."""
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(1 << 16)
    except (OSError, UnicodeDecodeError):
        return False
    start = head.lstrip()[:1]
    if start != "{":
        return False
    first = head.lstrip().split("\n", 1)[0]
    for text in (first, head):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            continue
        return isinstance(obj, dict) and "requests" in obj and "block_size" in obj
    return '"block_size"' in head and '"requests"' in head


def _num(obj: dict[str, Any], name: str, at: str, required: bool = True) -> float | None:
    v = obj.get(name)
    if v is None:
        if required:
            raise WorkloadError(f"{at}: field {name!r}: required")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
        raise WorkloadError(f"{at}: field {name!r}: expected a number >= 0, got {v!r}")
    return float(v)


def _length(obj: dict[str, Any], name: str, at: str) -> int:
    v = obj.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise WorkloadError(f"{at}: field {name!r}: expected an integer >= 0, got {v!r}")
    return v


def _extends(before: list[Any], after: list[Any]) -> bool:
    """Whether a prompt with block ids ``after`` continues one with ``before``: every full block
    of the earlier prompt (all but its last, which may have been partial) starts the later one.
    Without ids on both sides, the lengths alone decide."""
    if not before or not after:
        return True
    full = len(before) - 1
    return after[:full] == before[:full]


class _Chain:
    """Builds one conversation chain's nodes (the main agent's, or one sub-agent's)."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.last: int | None = None
        self.last_in = 0
        self.last_out = 0
        self.last_end = 0.0
        self.timed = False  # the last request recorded its api_time (so its end is known)
        self.last_hashes: list[Any] = []

    def add(self, req: dict[str, Any], t: float, at: str, label: str,
            extra: tuple[tuple[int, float], ...] = (), first_after: tuple[int, float] | None = None) -> int:
        n_in, n_out = _length(req, "in", at), max(1, _length(req, "out", at))
        hashes = req.get("hash_ids") or []
        if not isinstance(hashes, list):
            raise WorkloadError(f"{at}: field 'hash_ids': expected a list of block ids")
        api = _num(req, "api_time", at, required=False)
        think = _num(req, "think_time", at, required=False)
        after: list[int] = []
        delays: list[float] = []
        context = None
        new = n_in
        if self.last is not None:
            gap = t - self.last_end if self.timed else (think or 0.0)
            after.append(self.last)
            delays.append(min(MAX_DELAY_S, max(0.0, gap)))
            grown = n_in - self.last_in - self.last_out
            if grown >= 0 and _extends(self.last_hashes, hashes):
                context, new = self.last, grown
        elif first_after is not None:
            after.append(first_after[0])
            delays.append(min(MAX_DELAY_S, max(0.0, t - first_after[1])))
        for p, end in extra:
            after.append(p)
            delays.append(min(MAX_DELAY_S, max(0.0, t - end)))
        # the other predecessors' answers come into the prompt (docs/workloads.md): the recorded
        # prompt already holds them, so the new tokens are what is left
        answers = sum(self.nodes[p].output_tokens for p in after if p != context)
        new = max(0 if context is not None else 1, new - answers)
        self.nodes.append(Node(new, n_out, tuple(after), tuple(delays), context, None, label))
        self.last = len(self.nodes) - 1
        self.last_in, self.last_out = n_in, n_out
        self.last_end = t + (api or 0.0)
        self.timed = api is not None
        self.last_hashes = hashes
        return self.last


def trace_graph(obj: Any, at: str) -> JobGraph:
    """One Weka trace as a job."""
    if not isinstance(obj, dict):
        raise WorkloadError(f"{at}: expected a JSON object (one trace)")
    reqs = obj.get("requests")
    if not isinstance(reqs, list) or not reqs:
        raise WorkloadError(f"{at}: field 'requests': expected a non-empty list")
    nodes: list[Node] = []
    main = _Chain(nodes)
    pending: list[tuple[int, float]] = []  # sub-agents to join: (last node, end time)
    for i, r in enumerate(reqs):
        where = f"{at}: requests[{i}]"
        if not isinstance(r, dict):
            raise WorkloadError(f"{where}: expected an object")
        kind = r.get("type")
        t = _num(r, "t", where)
        assert t is not None
        if kind in ("n", "s"):
            main.add(r, t, where, f"main{i}", tuple(pending))
            pending = []
        elif kind == "subagent":
            if main.last is None:
                raise WorkloadError(f"{where}: a sub-agent before the first main request (nothing to start it)")
            subs = r.get("requests") or []
            if not isinstance(subs, list):
                raise WorkloadError(f"{where}: field 'requests': expected a list")
            timed = []
            for k, s in enumerate(subs):
                sw = f"{where}.requests[{k}]"
                if not isinstance(s, dict):
                    raise WorkloadError(f"{sw}: expected an object")
                st = _num(s, "t", sw)
                assert st is not None
                timed.append((st + t if st + 1e-6 < t else st, k, s, sw))  # relative to the sub-agent's start
            timed.sort(key=lambda x: (x[0], x[1]))
            chain = _Chain(nodes)
            for st, k, s, sw in timed:
                first = (main.last, main.last_end if main.timed else t) if chain.last is None else None
                chain.add(s, st, sw, f"sub{i}.{k}", first_after=first)
            if chain.last is not None:
                pending.append((chain.last, chain.last_end))
        else:
            raise WorkloadError(f"{where}: field 'type': expected \"n\", \"s\" or \"subagent\", got {kind!r}")
    if main.last is None:
        raise WorkloadError(f"{at}: no main request (type \"n\" or \"s\")")
    # (sub-agents after the last main request join nothing: the job ends when they do)
    job = JobGraph(tuple(nodes))
    job.check(at)
    return job


def read_weka(path: Path) -> list[JobGraph]:
    """Every trace of a ``.json`` file (one trace) or ``.jsonl`` file (one trace a line)."""
    name = path.name
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{name}: cannot read ({exc})") from None
    jobs: list[JobGraph] = []
    if path.suffix.lower() == ".json":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{name}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        for k, trace in enumerate(obj if isinstance(obj, list) else [obj]):
            jobs.append(trace_graph(trace, f"{name}" if not isinstance(obj, list) else f"{name}: trace {k}"))
    else:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise WorkloadError(f"{name}:{lineno}: not valid JSON (truncated or malformed line)") from None
            jobs.append(trace_graph(obj, f"{name}:{lineno}"))
    if not jobs:
        raise WorkloadError(f"{name}: empty file, no traces")
    return jobs
