"""Session graphs: one job (an agent's task) as a graph of requests.

A job is a directed acyclic graph. Each node is one request: its *new* tokens (the message
it adds) and its output length. An edge ``a -> b`` says ``b`` is sent only after ``a``
finished, plus a delay (the tool call or the user's think time, fixed or drawn). A node's
prompt is the conversation of one predecessor, its *context* (that predecessor's prompt with
everything before it, and its answer), then the answers of its other predecessors (a join:
the sub-agents' results), then its own new message. ``context = "fresh"`` starts a new
conversation (a sub-agent with its own instructions), which still receives its
predecessors' answers. A multi-turn chat is the chain special case: every node continues
the previous one's conversation.

Each job has exactly one root (the task's first request, sent at the job's arrival time),
and its nodes are listed in an order where every predecessor comes first (the TOML and
JSONL formats below check it). Three sources make jobs: a TOML template (``[[graph.node]]``,
``TemplateGraph``), a JSONL file of explicit jobs (``read_graph_jsonl``) and the built-in
agentic generator (``AgenticGraph``). docs/workloads.md documents the formats.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.spec import MAX_REQUEST_TOKENS

#: Bounds every graph is held to (stated in docs/workloads.md): nodes per job, copies of one
#: template node, predecessors of one node, and the longest edge delay.
MAX_NODES = 1000
MAX_COPIES = 64
MAX_PARENTS = 64
MAX_DELAY_S = 3600.0
FRESH = "fresh"


@dataclass(frozen=True, slots=True)
class Node:
    """One request of a job. ``after``: indices of its predecessors in the job (all smaller
    than its own); ``delays_s``: one per predecessor; ``context``: the predecessor whose
    conversation it continues (None: a fresh conversation)."""

    input_tokens: int
    output_tokens: int
    after: tuple[int, ...] = ()
    delays_s: tuple[float, ...] = ()
    context: int | None = None
    prompt: str | None = None
    label: str = ""
    #: a fresh conversation's shared system prompt (a ``[prefix]`` group; -1: drawn as usual)
    system: int = -1


@dataclass(frozen=True, slots=True)
class JobGraph:
    nodes: tuple[Node, ...]
    #: the job's arrival in seconds (a replayed file's ``offset_s``); None: drawn
    offset_s: float | None = None

    def check(self, where: str) -> None:
        """Raise ``WorkloadError`` naming ``where`` unless the graph is well formed."""
        if not self.nodes:
            raise WorkloadError(f"{where}: a job needs at least one node")
        if len(self.nodes) > MAX_NODES:
            raise WorkloadError(f"{where}: {len(self.nodes)} nodes; a job holds at most {MAX_NODES}")
        for i, n in enumerate(self.nodes):
            at = f"{where}: node {n.label or i}"
            if i == 0 and n.after:
                raise WorkloadError(f"{at}: the first node is the job's root and has no predecessors")
            if i > 0 and not n.after:
                raise WorkloadError(f"{at}: only the first node (the root) may have no predecessors; "
                                    "give 'after'")
            if len(n.after) > MAX_PARENTS:
                raise WorkloadError(f"{at}: {len(n.after)} predecessors; at most {MAX_PARENTS}")
            if any(not 0 <= p < i for p in n.after) or len(set(n.after)) != len(n.after):
                raise WorkloadError(f"{at}: 'after' must name distinct earlier nodes")
            if len(n.delays_s) != len(n.after):
                raise WorkloadError(f"{at}: one delay per predecessor ({len(n.after)}), got {len(n.delays_s)}")
            if any(not (0 <= d <= MAX_DELAY_S) for d in n.delays_s):
                raise WorkloadError(f"{at}: delays must be 0..{MAX_DELAY_S:g} s")
            if n.context is not None and n.context not in n.after:
                raise WorkloadError(f"{at}: its context must be one of its predecessors")
            if not 0 <= n.input_tokens <= MAX_REQUEST_TOKENS or not 1 <= n.output_tokens <= MAX_REQUEST_TOKENS:
                raise WorkloadError(f"{at}: input tokens must be 0..{MAX_REQUEST_TOKENS:,} and output "
                                    f"tokens 1..{MAX_REQUEST_TOKENS:,}")
            if n.input_tokens == 0 and n.prompt is None and n.context is None:
                raise WorkloadError(f"{at}: a fresh conversation needs new tokens (input_tokens >= 1)")


class GraphSource(Protocol):
    """Where a workload's jobs come from."""

    def jobs(self, requests: int, rng: np.random.Generator) -> list[JobGraph]:
        """Whole jobs, in arrival order, until they hold at least ``requests`` requests
        (a file: its jobs in order, at most its own)."""
        ...

    def describe(self) -> dict[str, object]: ...


def take_jobs(make: Callable[[], JobGraph], requests: int) -> list[JobGraph]:
    out: list[JobGraph] = []
    total = 0
    while total < requests:
        job = make()
        out.append(job)
        total += len(job.nodes)
    return out


# -- delays ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DelayConfig:
    """An edge delay in seconds: ``fixed`` (value), ``exponential`` (mean), ``uniform`` (low,
    high) or ``lognormal`` (mu, sigma of ln seconds); ``max`` caps a draw."""

    kind: Literal["fixed", "exponential", "uniform", "lognormal"]
    value: float | None = None
    mean: float | None = None
    low: float | None = None
    high: float | None = None
    mu: float | None = None
    sigma: float | None = None
    max: float = MAX_DELAY_S

    def check(self, where: str) -> None:
        need = {"fixed": ("value",), "exponential": ("mean",), "uniform": ("low", "high"),
                "lognormal": ("mu", "sigma")}[self.kind]
        for name in need:
            v = getattr(self, name)
            if v is None or not math.isfinite(v):
                raise WorkloadError(f"{where}: kind {self.kind!r} needs a finite {name!r}")
        if self.kind == "fixed" and not 0 <= (self.value or 0) <= MAX_DELAY_S:
            raise WorkloadError(f"{where}.value: must be 0..{MAX_DELAY_S:g} s")
        if self.kind == "exponential" and not 0 <= (self.mean or 0) <= MAX_DELAY_S:
            raise WorkloadError(f"{where}.mean: must be 0..{MAX_DELAY_S:g} s")
        if self.kind == "uniform" and not 0 <= (self.low or 0) <= (self.high or 0) <= MAX_DELAY_S:
            raise WorkloadError(f"{where}: need 0 <= low <= high <= {MAX_DELAY_S:g} s")
        if self.kind == "lognormal" and not (self.sigma or 0) >= 0:
            raise WorkloadError(f"{where}.sigma: must be >= 0")
        if not 0 <= self.max <= MAX_DELAY_S:
            raise WorkloadError(f"{where}.max: must be 0..{MAX_DELAY_S:g} s")

    def sample(self, rng: np.random.Generator) -> float:
        if self.kind == "fixed":
            v = float(self.value or 0.0)
        elif self.kind == "exponential":
            v = float(rng.exponential(self.mean)) if self.mean else 0.0
        elif self.kind == "uniform":
            v = float(rng.uniform(float(self.low or 0.0), float(self.high or 0.0)))
        else:
            v = float(rng.lognormal(float(self.mu or 0.0), float(self.sigma or 0.0)))
        return min(max(v, 0.0), self.max)

    def describe(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


# -- the TOML template -----------------------------------------------------------------------


@dataclass(frozen=True)
class _TemplateNode:
    label: str
    copies: int
    inp: Any  # a LengthDist, or None with a fixed count
    out: Any
    n_in: int | None
    n_out: int | None
    prompt: str | None
    after: tuple[int, ...]
    delay: DelayConfig | None
    delay_s: float
    context: int | None  # template index; None fresh


class TemplateGraph:
    """Jobs made from a TOML template: the same nodes and edges every job, lengths and delays
    drawn per job."""

    def __init__(self, nodes: Sequence[Any], where: str, build_dist: Callable[[Any, str], Any]) -> None:
        """``nodes``: ``[[graph.node]]`` tables (``workloads.definition.NodeConfig``);
        ``build_dist(config, where)``: a length distribution from one of their ``input``/``output``."""
        if not nodes:
            raise WorkloadError(f"{where}: [[graph.node]] needs at least one node")
        ids: dict[str, int] = {}
        out: list[_TemplateNode] = []
        for i, nc in enumerate(nodes):
            at = f"{where}.node[{i}]"
            if not nc.id or nc.id == FRESH:
                raise WorkloadError(f"{at}.id: a non-empty name other than {FRESH!r}")
            if nc.id in ids:
                raise WorkloadError(f"{at}.id: {nc.id!r} is used twice")
            if not 1 <= nc.copies <= MAX_COPIES:
                raise WorkloadError(f"{at}.copies: must be 1..{MAX_COPIES}")
            for p in nc.after:
                if p not in ids:
                    raise WorkloadError(f"{at}.after: {p!r} is not an earlier node (list every node after its "
                                        "predecessors)")
            if i == 0 and (nc.after or nc.copies != 1):
                raise WorkloadError(f"{at}: the first node is the job's root: no 'after', one copy")
            if i > 0 and not nc.after:
                raise WorkloadError(f"{at}.after: only the first node (the root) may have no predecessors")
            if nc.delay is not None and nc.delay_s is not None:
                raise WorkloadError(f"{at}: give delay_s or delay, not both")
            if nc.delay is not None:
                nc.delay.check(f"{at}.delay")
            if nc.delay_s is not None and not 0 <= nc.delay_s <= MAX_DELAY_S:
                raise WorkloadError(f"{at}.delay_s: must be 0..{MAX_DELAY_S:g} s")
            if nc.context is None:
                ctx = ids[nc.after[0]] if nc.after else None
            elif nc.context == FRESH:
                ctx = None
            elif nc.context in nc.after:
                ctx = ids[nc.context]
            else:
                raise WorkloadError(f"{at}.context: {nc.context!r} is not one of its predecessors (or \"fresh\")")
            has_len = nc.input is not None or nc.input_tokens is not None or nc.prompt is not None
            if not has_len or (nc.output is None and nc.output_tokens is None):
                raise WorkloadError(f"{at}: needs input (or input_tokens, or prompt) and output (or output_tokens)")
            if nc.input is not None and nc.input_tokens is not None:
                raise WorkloadError(f"{at}: give input or input_tokens, not both")
            if nc.output is not None and nc.output_tokens is not None:
                raise WorkloadError(f"{at}: give output or output_tokens, not both")
            for name in ("input_tokens", "output_tokens"):
                v = getattr(nc, name)
                lo = 1 if name == "output_tokens" or ctx is None else 0
                if v is not None and not lo <= v <= MAX_REQUEST_TOKENS:
                    raise WorkloadError(f"{at}.{name}: must be {lo}..{MAX_REQUEST_TOKENS:,}")
            out.append(_TemplateNode(
                nc.id, nc.copies,
                build_dist(nc.input, f"{at}.input") if nc.input is not None else None,
                build_dist(nc.output, f"{at}.output") if nc.output is not None else None,
                nc.input_tokens, nc.output_tokens, nc.prompt,
                tuple(ids[p] for p in nc.after), nc.delay, float(nc.delay_s or 0.0), ctx,
            ))
            ids[nc.id] = i
        self.template = tuple(out)
        self.where = where
        size = sum(t.copies for t in out)
        if size > MAX_NODES:
            raise WorkloadError(f"{where}: {size} requests per job; a job holds at most {MAX_NODES}")

    def _one(self, rng: np.random.Generator) -> JobGraph:
        first: list[int] = []  # per template node, the job index of its first copy
        nodes: list[Node] = []
        for t in self.template:
            first.append(len(nodes))
            for c in range(t.copies):
                after: list[int] = []
                ctx = None
                for p in t.after:
                    pt = self.template[p]
                    pairs = pt.copies == t.copies and t.copies > 1
                    mine = [first[p] + c] if pairs else [first[p] + k for k in range(pt.copies)]
                    after.extend(mine)
                    if p == t.context:
                        ctx = mine[0]
                delays = tuple(t.delay.sample(rng) if t.delay is not None else t.delay_s for _ in after)
                n_in = t.n_in if t.n_in is not None else (int(t.inp.sample(1, rng)[0]) if t.inp is not None else 0)
                n_out = t.n_out if t.n_out is not None else int(t.out.sample(1, rng)[0])
                if t.prompt is not None and t.inp is None and t.n_in is None:
                    n_in = len(t.prompt.split())
                label = t.label if t.copies == 1 else f"{t.label}.{c}"
                nodes.append(Node(n_in, n_out, tuple(after), delays, ctx, t.prompt, label))
        return JobGraph(tuple(nodes))

    def jobs(self, requests: int, rng: np.random.Generator) -> list[JobGraph]:
        return take_jobs(lambda: self._one(rng), requests)

    def describe(self) -> dict[str, object]:
        return {"kind": "template", "nodes": [
            {"id": t.label, "copies": t.copies, "after": [self.template[p].label for p in t.after],
             "context": self.template[t.context].label if t.context is not None else FRESH,
             "delay": t.delay.describe() if t.delay is not None else {"kind": "fixed", "value": t.delay_s}}
            for t in self.template]}


# -- the JSONL file of explicit jobs ---------------------------------------------------------

_JSONL_FIELDS = {"job", "node", "input_tokens", "output_tokens", "prompt", "after", "delay_s", "context",
                 "offset_s"}


def is_graph_jsonl(path: Path) -> bool:
    """Whether ``path``'s first non-blank line is a JSON object with a ``job`` field."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    obj = json.loads(line)
                    return isinstance(obj, dict) and "job" in obj
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return False


def _field(obj: dict[str, object], name: str, kind: type, at: str, default: object = None) -> object:
    v = obj.get(name, default)
    if v is None:
        return default
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise WorkloadError(f"{at}: field {name!r}: expected {'a number' if kind is float else kind.__name__}, "
                            f"got {v!r}")
    return v


def read_graph_jsonl(path: Path) -> list[JobGraph]:
    """The jobs of a graph JSONL file (one node a line, a job's lines together, its root first).

    Fields: ``job`` (id), ``node`` (id, unique in its job), ``input_tokens`` (new tokens; or
    ``prompt``), ``output_tokens``, ``after`` (earlier node ids), ``delay_s`` (one number, or
    one per predecessor), ``context`` (a predecessor's id or "fresh"; default the first
    predecessor), ``offset_s`` (the root's arrival, on every root or none). Errors name the
    file, the line and the field.
    """
    jobs: list[JobGraph] = []
    current: str | None = None
    seen_jobs: set[str] = set()
    ids: dict[str, int] = {}
    nodes: list[Node] = []
    offset: float | None = None
    offsets_given: bool | None = None
    name = path.name

    def close() -> None:
        if current is not None:
            job = JobGraph(tuple(nodes), offset)
            job.check(f"{name}: job {current!r}")
            jobs.append(job)

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{name}: cannot read ({exc})") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        at = f"{name}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise WorkloadError(f"{at}: not valid JSON (truncated or malformed line)") from None
        if not isinstance(obj, dict):
            raise WorkloadError(f"{at}: expected a JSON object")
        unknown = sorted(set(obj) - _JSONL_FIELDS)
        if unknown:
            raise WorkloadError(f"{at}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_JSONL_FIELDS))})")
        job = obj.get("job")
        if not isinstance(job, (str, int)) or isinstance(job, bool):
            raise WorkloadError(f"{at}: field 'job': expected a job id (string or integer)")
        job = str(job)
        if job != current:
            if job in seen_jobs:
                raise WorkloadError(f"{at}: field 'job': job {job!r} continues after other jobs' lines "
                                    "(keep a job's lines together)")
            close()
            current, ids, nodes, offset = job, {}, [], None
            seen_jobs.add(job)
        node_id = obj.get("node", str(len(nodes)))
        if not isinstance(node_id, (str, int)) or isinstance(node_id, bool):
            raise WorkloadError(f"{at}: field 'node': expected a node id")
        node_id = str(node_id)
        if node_id in ids:
            raise WorkloadError(f"{at}: field 'node': {node_id!r} appears twice in job {job!r}")
        prompt = _field(obj, "prompt", str, at)
        n_in = _field(obj, "input_tokens", int, at)
        if n_in is None:
            if prompt is None:
                raise WorkloadError(f"{at}: field 'input_tokens': needed unless 'prompt' is given")
            n_in = len(str(prompt).split())
        n_out = _field(obj, "output_tokens", int, at)
        if n_out is None:
            raise WorkloadError(f"{at}: field 'output_tokens': required")
        after_raw = obj.get("after", [])
        if not isinstance(after_raw, list) or not all(isinstance(a, (str, int)) for a in after_raw):
            raise WorkloadError(f"{at}: field 'after': expected a list of node ids")
        after: list[int] = []
        for a in after_raw:
            if str(a) not in ids:
                raise WorkloadError(f"{at}: field 'after': {str(a)!r} is not an earlier node of job {job!r}")
            after.append(ids[str(a)])
        d = obj.get("delay_s", 0.0)
        if isinstance(d, list):
            if len(d) != len(after) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in d):
                raise WorkloadError(f"{at}: field 'delay_s': one number per predecessor ({len(after)})")
            delays = tuple(float(x) for x in d)
        elif isinstance(d, (int, float)) and not isinstance(d, bool):
            delays = tuple(float(d) for _ in after)
        else:
            raise WorkloadError(f"{at}: field 'delay_s': expected a number of seconds or a list of them")
        if any(not (0 <= x <= MAX_DELAY_S) or x != x for x in delays):
            raise WorkloadError(f"{at}: field 'delay_s': must be 0..{MAX_DELAY_S:g} s")
        ctx_raw = obj.get("context")
        if ctx_raw is None:
            ctx = after[0] if after else None
        elif ctx_raw == FRESH:
            ctx = None
        elif str(ctx_raw) in ids and ids[str(ctx_raw)] in after:
            ctx = ids[str(ctx_raw)]
        else:
            raise WorkloadError(f"{at}: field 'context': {ctx_raw!r} is not one of its predecessors (or \"fresh\")")
        off_raw = _field(obj, "offset_s", float, at)
        off = None if off_raw is None else float(off_raw)  # type: ignore[arg-type]
        if not after:
            if offsets_given is not None and offsets_given != (off is not None):
                raise WorkloadError(f"{at}: field 'offset_s': give it on every job's root or on none")
            offsets_given = off is not None
            if off is not None and not (off >= 0 and math.isfinite(off)):
                raise WorkloadError(f"{at}: field 'offset_s': must be a finite number >= 0")
            offset = off
        elif off is not None:
            raise WorkloadError(f"{at}: field 'offset_s': only a job's root (no 'after') has an arrival time")
        ids[node_id] = len(nodes)
        nodes.append(Node(int(n_in), int(n_out), tuple(after), delays, ctx,  # type: ignore[call-overload]
                          str(prompt) if prompt is not None else None, node_id))
    close()
    if not jobs:
        raise WorkloadError(f"{name}: empty file, no jobs")
    return jobs


@dataclass(frozen=True)
class FileGraphs:
    """The jobs of a graph JSONL file, in file order, until they hold ``requests`` requests."""

    path: str
    graphs: tuple[JobGraph, ...] = field(repr=False, default=())
    #: "graph-jsonl" (bench's own) or "weka" (workloads/weka.py)
    format: str = "graph-jsonl"

    def jobs(self, requests: int, rng: np.random.Generator) -> list[JobGraph]:
        out: list[JobGraph] = []
        total = 0
        for g in self.graphs:
            if total >= requests:
                break
            out.append(g)
            total += len(g.nodes)
        return out

    @property
    def has_offsets(self) -> bool:
        return bool(self.graphs) and self.graphs[0].offset_s is not None

    def describe(self) -> dict[str, object]:
        return {"kind": "file", "format": self.format, "path": self.path, "jobs": len(self.graphs),
                "requests": sum(len(g.nodes) for g in self.graphs)}


# -- the built-in agentic workload ----------------------------------------------------------


@dataclass(frozen=True)
class AgenticGraph:
    """An agent's job, drawn afresh per job: a root (the task, behind the harness's shared
    system prompt), then ``steps`` orchestrator turns, each after a tool call's gap, each
    adding the tool's output to the growing conversation; after the first turn, with
    probability ``fanout_p``, ``subagents`` sub-agents start in parallel, each a fresh
    conversation (behind the sub-agents' shared system prompt) of ``sub_turns`` turns with
    their own tool gaps; the next orchestrator turn waits for all of them (a join) and
    receives their final answers.

    The figures are stated, not fitted: no agentic trace is available to fit here (the
    Mooncake FAST'25 tool&agent trace is not among the shared traces). Output lengths are
    lognormal with mean 182 tokens, the mean output of that trace (FAST'25, Table 2);
    tool outputs lognormal with median 800 tokens (mean 1,200), so an orchestrator's
    context reaches about 9k tokens by its last turn, near that trace's mean input of 8,596.
    """

    task: tuple[int, int] = (300, 1500)  # new tokens of the root (uniform)
    steps: tuple[int, int] = (3, 6)  # orchestrator turns after the root (uniform)
    tool_mu: float = math.log(800.0)  # tool output tokens: lognormal (median 800)
    tool_sigma: float = 0.9
    tool_max: int = 8000
    out_mu: float = math.log(132.0)  # output tokens: lognormal, mean 182
    out_sigma: float = 0.8
    out_max: int = 2048
    gap_mu: float = 0.0  # tool-call gap, seconds: lognormal (median 1 s, mean 1.4 s)
    gap_sigma: float = 0.8
    gap_max_s: float = 30.0
    fanout_p: float = 0.5
    subagents: tuple[int, int] = (2, 4)
    sub_turns: tuple[int, int] = (2, 4)
    sub_task: tuple[int, int] = (100, 400)  # a sub-agent's instructions (new tokens of its first turn)

    def _len(self, mu: float, sigma: float, hi: int, rng: np.random.Generator) -> int:
        return int(min(hi, max(1, round(float(rng.lognormal(mu, sigma))))))

    def _gap(self, rng: np.random.Generator) -> float:
        return min(self.gap_max_s, float(rng.lognormal(self.gap_mu, self.gap_sigma)))

    def _out(self, rng: np.random.Generator) -> int:
        return self._len(self.out_mu, self.out_sigma, self.out_max, rng)

    def _tool(self, rng: np.random.Generator) -> int:
        return self._len(self.tool_mu, self.tool_sigma, self.tool_max, rng)

    def one(self, rng: np.random.Generator) -> JobGraph:
        nodes = [Node(int(rng.integers(self.task[0], self.task[1] + 1)), self._out(rng), label="task", system=0)]
        last = 0
        steps = int(rng.integers(self.steps[0], self.steps[1] + 1))
        fan = bool(rng.random() < self.fanout_p)
        leaves: list[int] = []
        for s in range(steps):
            after, delays = [last], [self._gap(rng)]
            if s == 1 and fan:  # the sub-agents started after turn 0 join here
                after += leaves
                delays += [0.0] * len(leaves)
            nodes.append(Node(self._tool(rng), self._out(rng), tuple(after), tuple(delays), last, label=f"step{s}"))
            last = len(nodes) - 1
            if s == 0 and fan:
                for a in range(int(rng.integers(self.subagents[0], self.subagents[1] + 1))):
                    prev = last
                    for t in range(int(rng.integers(self.sub_turns[0], self.sub_turns[1] + 1))):
                        if t == 0:  # a fresh conversation: its instructions, and the orchestrator's call
                            n = Node(int(rng.integers(self.sub_task[0], self.sub_task[1] + 1)), self._out(rng),
                                     (prev,), (0.0,), None, label=f"sub{a}.0", system=1)
                        else:
                            n = Node(self._tool(rng), self._out(rng), (prev,), (self._gap(rng),), prev,
                                     label=f"sub{a}.{t}")
                        nodes.append(n)
                        prev = len(nodes) - 1
                    leaves.append(prev)
        if fan and steps < 2:  # (steps >= 3 by default; kept correct for any bounds)
            nodes.append(Node(self._tool(rng), self._out(rng), (last, *leaves), (0.0,) * (1 + len(leaves)), last,
                              label="join"))
        return JobGraph(tuple(nodes))

    def jobs(self, requests: int, rng: np.random.Generator) -> list[JobGraph]:
        return take_jobs(lambda: self.one(rng), requests)

    def describe(self) -> dict[str, object]:
        d: dict[str, object] = {"kind": "agentic"}
        d.update({k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()})
        return d
