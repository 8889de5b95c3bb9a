"""Workload definitions: the TOML file format (frozen dataclasses) and its resolution.

A workload file (all sections optional, unknown keys rejected with their dotted path)::

    name = "chat-with-system-prompt"
    description = "..."
    arrival = "gamma:cv=2"          # default when --arrival is not given
    rate = 4.0                      # default when neither --rate nor --concurrency is given
    # concurrency = 16

    [lengths]
    like = "chat"                   # a built-in's length tables ...
    # ... or explicit distributions:
    # input = { kind = "lognormal", mu = 6.6, sigma = 1.0, max = 8192 }
    # output = { kind = "fixed", value = 128 }
    # ... or a mix:
    # [[lengths.mix]]
    # weight = 0.9
    # like = "chat"
    # [[lengths.mix]]
    # weight = 0.1
    # input = { kind = "uniform", low = 8192, high = 32768 }
    # output = { kind = "fixed", value = 256 }

    [prefix]                        # shared-prefix groups
    groups = 4
    tokens = 1024
    fractions = [0.4, 0.2, 0.1, 0.1]   # of requests per group; the rest have none

    [sessions]                      # multi-turn conversations
    turns_min = 2
    turns_max = 6
    think_time_s = 5.0              # mean; think = "exponential" or "fixed"

    [trace]                         # replay a trace file instead of [lengths]
    path = "conversation_trace.jsonl"
    time_scale = 1.0

    [prompt]
    tokenizer = "/models/llama/"    # local HF tokenizer folder, or
    # tokenize_url = "http://127.0.0.1:8000"

    [request]                       # what every request asks for (docs/workloads.md)
    temperature = 0.7
    top_p = 0.9
    stop = ["###"]                  # stop sequences: requests may end early ("stop")
    # top_k, seed, n, logprobs, natural_stop = true, extra_body = { ... }
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

from bench_llm.workloads.distributions import (
    ConditionalPair,
    Empirical,
    Fixed,
    IndependentPair,
    LengthDist,
    LogNormal,
    Mixture,
    Normal,
    PairDist,
    Uniform,
)
from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.graph import AgenticGraph, DelayConfig, GraphSource, TemplateGraph
from bench_llm.workloads.graph_files import read_graph_file
from bench_llm.workloads.spec import RequestOptions


@dataclass(frozen=True)
class DistConfig:
    """One length distribution; which fields apply depends on ``kind``."""

    kind: Literal["fixed", "uniform", "normal", "lognormal", "empirical"]
    value: int | None = None
    low: int | None = None
    high: int | None = None
    mean: float | None = None
    std: float | None = None
    mu: float | None = None
    sigma: float | None = None
    min: int = 1
    max: int | None = None
    probs: tuple[float, ...] = ()
    values: tuple[float, ...] = ()

    def build(self, where: str) -> LengthDist:
        def need(*names: str) -> None:
            for n in names:
                if getattr(self, n) is None:
                    raise WorkloadError(f"{where}: kind {self.kind!r} needs {n!r}")

        if self.kind == "fixed":
            need("value")
            return Fixed(int(self.value))  # type: ignore[arg-type]
        if self.kind == "uniform":
            need("low", "high")
            return Uniform(int(self.low), int(self.high))  # type: ignore[arg-type]
        if self.kind == "normal":
            need("mean", "std")
            return Normal(float(self.mean), float(self.std), self.min, self.max)  # type: ignore[arg-type]
        if self.kind == "lognormal":
            need("mu", "sigma")
            return LogNormal(float(self.mu), float(self.sigma), self.min, self.max)  # type: ignore[arg-type]
        try:
            return Empirical(tuple(self.probs), tuple(self.values))
        except WorkloadError as exc:
            raise WorkloadError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class MixComponent:
    weight: float
    like: str | None = None
    input: DistConfig | None = None
    output: DistConfig | None = None
    label: str = ""


@dataclass(frozen=True)
class LengthsConfig:
    like: str | None = None
    input: DistConfig | None = None
    output: DistConfig | None = None
    mix: tuple[MixComponent, ...] = ()


@dataclass(frozen=True)
class PrefixConfig:
    """``groups`` prefixes of ``tokens`` tokens; group g is used by ``fractions[g]`` of requests.

    By default the prefix comes in front of the sampled input (a system prompt before
    the user's message: input = tokens + sampled). With ``included = true`` the prefix
    is the first ``tokens`` of the sampled input (inputs shorter are raised to
    tokens + 1), as in traces whose lengths already count the shared part.
    """

    groups: int = 1
    tokens: int = 512
    fractions: tuple[float, ...] = ()
    included: bool = False

    def validate(self, where: str = "prefix") -> None:
        if self.groups < 1 or self.tokens < 1:
            raise WorkloadError(f"{where}: groups and tokens must be >= 1")
        if self.fractions:
            if len(self.fractions) != self.groups:
                raise WorkloadError(f"{where}.fractions: give one fraction per group ({self.groups})")
            if any(f < 0 for f in self.fractions) or sum(self.fractions) > 1 + 1e-9:
                raise WorkloadError(f"{where}.fractions: each must be >= 0 and they must sum to <= 1")

    def shares(self) -> tuple[float, ...]:
        return self.fractions or tuple(1.0 / self.groups for _ in range(self.groups))


@dataclass(frozen=True)
class SessionConfig:
    """Multi-turn sessions: each has turns_min..turns_max turns (uniform)."""

    turns_min: int = 2
    turns_max: int = 4
    think_time_s: float = 0.0
    think: Literal["exponential", "fixed"] = "exponential"
    #: length of each later turn's new user message (default: the workload's input lengths)
    followup_input: DistConfig | None = None

    def validate(self, where: str = "sessions") -> None:
        if not 1 <= self.turns_min <= self.turns_max:
            raise WorkloadError(f"{where}: need 1 <= turns_min <= turns_max")
        if self.think_time_s < 0:
            raise WorkloadError(f"{where}.think_time_s: must be >= 0")

    @property
    def mean_turns(self) -> float:
        return (self.turns_min + self.turns_max) / 2.0


@dataclass(frozen=True)
class NodeConfig:
    """One ``[[graph.node]]`` (workloads/graph.py): lengths as in ``[lengths]`` (``input`` and
    ``output`` distributions, or fixed ``input_tokens``/``output_tokens``, or ``prompt`` text),
    its predecessors by id (``after``), the delay after each (``delay_s`` fixed, or ``delay`` a
    distribution), its context (a predecessor's id, or "fresh"; default its first predecessor)
    and ``copies`` (parallel sub-agents: the node repeated; between two nodes with the same
    copies > 1 the edges go copy to copy, otherwise every copy waits for every copy)."""

    id: str
    input: DistConfig | None = None
    output: DistConfig | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    prompt: str | None = None
    after: tuple[str, ...] = ()
    delay_s: float | None = None
    delay: DelayConfig | None = None
    context: str | None = None
    copies: int = 1


@dataclass(frozen=True)
class GraphConfig:
    """``[graph]``: every job is one instance of this graph (``[[graph.node]]``, the root first),
    or ``path`` names a graph JSONL file of explicit jobs (relative to the TOML file)."""

    node: tuple[NodeConfig, ...] = ()
    path: str | None = None


@dataclass(frozen=True)
class TraceConfig:
    path: str
    format: Literal["azure", "burstgpt", "mooncake", "lengths", "bench", "dataset"] | None = None
    time_scale: float = 1.0
    #: spread requests sharing a quantised timestamp over this many seconds (Mooncake: 3)
    bucket_s: float | None = None
    #: skip this many rows first (replay a slice)
    start: int = 0
    model: str | None = None  # BurstGPT filter
    log_type: str | None = None  # BurstGPT filter
    #: dataset rows without an output length (no reply, no output_tokens) ask for this many
    output_tokens: int | None = None


@dataclass(frozen=True)
class PromptConfig:
    tokenizer: str | None = None
    tokenize_url: str | None = None
    model: str | None = None


@dataclass(frozen=True)
class WorkloadFile:
    name: str = ""
    description: str = ""
    arrival: str | None = None
    rate: float | None = None
    concurrency: int | None = None
    lengths: LengthsConfig | None = None
    prefix: PrefixConfig | None = None
    sessions: SessionConfig | None = None
    trace: TraceConfig | None = None
    prompt: PromptConfig | None = None
    request: RequestOptions | None = None
    graph: GraphConfig | None = None


@dataclass(frozen=True)
class WorkloadDef:
    """A resolved workload: what to sample (or replay) and how to structure it."""

    name: str
    description: str = ""
    lengths: PairDist | None = None
    trace: TraceConfig | None = None
    prefix: PrefixConfig | None = None
    sessions: SessionConfig | None = None
    prompt: PromptConfig = PromptConfig()
    arrival: str | None = None
    rate: float | None = None
    concurrency: int | None = None
    source: dict[str, object] = field(default_factory=dict)
    request: RequestOptions = field(default_factory=RequestOptions)
    #: jobs as session graphs (workloads/graph.py); ``--rate`` is then jobs per second
    graph: GraphSource | None = None


# -- built-in tables -------------------------------------------------------------------------
FITTED = ("chat", "code", "long-context", "sharegpt", "arxiv-summarization")


@lru_cache(maxsize=None)
def fitted_document(name: str) -> dict[str, object]:
    """The shipped JSON of a fitted built-in (tables, summary, source, licence)."""
    try:
        text = resources.files("bench_llm.workloads.builtin").joinpath(f"{name}.json").read_text()
    except FileNotFoundError:
        raise WorkloadError(f"built-in table {name!r} is missing from this install") from None
    return json.loads(text)  # type: ignore[no-any-return]


def fitted_pair(name: str) -> PairDist:
    doc = fitted_document(name)["lengths"]
    assert isinstance(doc, dict)
    inp = Empirical(tuple(doc["input"]["probs"]), tuple(doc["input"]["values"]))
    out = Empirical(tuple(doc["output"]["probs"]), tuple(doc["output"]["values"]))
    if doc["kind"] == "joint":
        j = doc["joint"]
        return ConditionalPair(
            inp, out, tuple(j["bin_edges"]), tuple(j["rank_probs"]), tuple(tuple(v) for v in j["rank_values"])
        )
    return IndependentPair(inp, out)


def _builtin_defs() -> dict[str, WorkloadDef]:
    defs: dict[str, WorkloadDef] = {}
    for name in FITTED:
        doc = fitted_document(name)
        defs[name] = WorkloadDef(
            name=name,
            description=str(doc["description"]),
            lengths=fitted_pair(name),
            # Every Mooncake conversation request starts with the same 512-token block.
            prefix=PrefixConfig(groups=1, tokens=512, fractions=(1.0,), included=True) if name == "long-context" else None,
            source={"source": doc["source"], "licence": doc["licence"]},
        )
    defs["fixed"] = WorkloadDef(
        name="fixed",
        description="Every request 512 input and 128 output tokens (a calibration baseline).",
        lengths=IndependentPair(Fixed(512), Fixed(128)),
    )
    chat = fitted_pair("chat")
    assert isinstance(chat, IndependentPair)
    defs["long-short-mix"] = WorkloadDef(
        name="long-short-mix",
        description="90 % chat requests (Azure 2023 conversation lengths) and 10 % long prompts "
        "(uniform 8k-32k input tokens, chat output lengths): the case for a separate long-prompt pool.",
        lengths=Mixture(
            (0.9, 0.1),
            (chat, IndependentPair(Uniform(8192, 32768), chat.output)),
            ("short", "long"),
        ),
        source={"short": fitted_document("chat")["source"], "licence": fitted_document("chat")["licence"]},
    )
    defs["shared-prefix"] = WorkloadDef(
        name="shared-prefix",
        description="Chat lengths behind 4 shared 1,024-token system prompts (40/30/20/10 % of requests): "
        "the prefix-cache and cache-aware routing case.",
        lengths=IndependentPair(chat.input, chat.output),
        prefix=PrefixConfig(groups=4, tokens=1024, fractions=(0.4, 0.3, 0.2, 0.1)),
        source={"source": fitted_document("chat")["source"], "licence": fitted_document("chat")["licence"]},
    )
    defs["multi-turn"] = WorkloadDef(
        name="multi-turn",
        description="Chat sessions of 2-6 turns (ShareGPT-like follow-ups of 20-200 tokens) with 2 s mean think "
        "time; each turn carries the real history.",
        lengths=IndependentPair(chat.input, chat.output),
        sessions=SessionConfig(turns_min=2, turns_max=6, think_time_s=2.0, followup_input=DistConfig("uniform", low=20, high=200)),
        source={"source": fitted_document("chat")["source"], "licence": fitted_document("chat")["licence"]},
    )
    defs["agentic"] = WorkloadDef(
        name="agentic",
        description="Agent jobs: a task behind a shared 2,000-token system prompt, 3-6 orchestrator turns after "
        "tool-call gaps (lognormal, median 1 s) each adding a tool output (median 800 tokens) to the growing "
        "context; half the jobs fan out 2-4 sub-agents (fresh conversations of 2-4 turns) that the next turn "
        "joins. --rate is jobs per second.",
        lengths=IndependentPair(LogNormal(6.68, 0.9, 1, 8000), LogNormal(4.88, 0.8, 1, 2048)),  # warm-up only
        prefix=PrefixConfig(groups=2, tokens=2000, fractions=(1.0, 0.0)),
        graph=AgenticGraph(),
        source={"figures": "stated (workloads/graph.py AgenticGraph): mean output 182 tokens and a last-turn "
                "context near 8.6k tokens, the Mooncake FAST'25 tool&agent trace's published means (Table 2); "
                "not fitted to a trace"},
    )
    return defs


@lru_cache(maxsize=1)
def builtins() -> dict[str, WorkloadDef]:
    return _builtin_defs()


def resolve_lengths(cfg: LengthsConfig, where: str = "lengths") -> PairDist:
    def like(name: str, at: str) -> PairDist:
        if name not in builtins():
            raise WorkloadError(f"{at}.like: unknown built-in {name!r} (known: {', '.join(builtins())})")
        pair = builtins()[name].lengths
        assert pair is not None
        return pair

    def pair(like_name: str | None, inp: DistConfig | None, out: DistConfig | None, at: str) -> PairDist:
        if like_name is not None:
            if inp is not None or out is not None:
                raise WorkloadError(f"{at}: give 'like' or input/output, not both")
            return like(like_name, at)
        if inp is None or out is None:
            raise WorkloadError(f"{at}: needs 'like' (a built-in) or both 'input' and 'output'")
        return IndependentPair(inp.build(f"{at}.input"), out.build(f"{at}.output"))

    if cfg.mix:
        if cfg.like or cfg.input or cfg.output:
            raise WorkloadError(f"{where}: give 'mix' or like/input/output, not both")
        comps = tuple(pair(c.like, c.input, c.output, f"{where}.mix[{i}]") for i, c in enumerate(cfg.mix))
        labels = tuple(c.label or c.like or f"c{i}" for i, c in enumerate(cfg.mix))
        return Mixture(tuple(c.weight for c in cfg.mix), comps, labels)  # type: ignore[arg-type]
    return pair(cfg.like, cfg.input, cfg.output, where)


def load_workload_file(path: Path) -> WorkloadDef:
    from bench_llm.core.config import ConfigError, from_mapping, load_toml

    try:
        wf = from_mapping(WorkloadFile, load_toml(path), "", str(path))
    except ConfigError as exc:
        raise WorkloadError(str(exc)) from None
    except ValueError as exc:  # a RequestOptions value out of range
        raise WorkloadError(f"{path}: request: {exc}") from None
    where = str(path)
    graph = _graph_of(wf.graph, path) if wf.graph is not None else None
    if graph is not None and (wf.trace is not None or wf.sessions is not None):
        raise WorkloadError(f"{where}: [graph] makes its own jobs: give no [trace] or [sessions] with it")
    if wf.lengths is None and wf.trace is None and graph is None:
        raise WorkloadError(f"{where}: needs a [lengths] or a [trace] section (or a [graph])")
    if wf.lengths is not None and wf.trace is not None:
        raise WorkloadError(f"{where}: give [lengths] or [trace], not both")
    trace = wf.trace
    if trace is not None and not Path(trace.path).is_absolute():
        trace = TraceConfig(**{**trace.__dict__, "path": str((path.parent / trace.path))})
    if wf.prefix is not None:
        wf.prefix.validate(f"{where}: prefix")
    if wf.sessions is not None:
        wf.sessions.validate(f"{where}: sessions")
    return WorkloadDef(
        name=wf.name or path.stem,
        description=wf.description,
        lengths=resolve_lengths(wf.lengths, f"{where}: lengths") if wf.lengths is not None else None,
        trace=trace,
        prefix=wf.prefix,
        sessions=wf.sessions,
        prompt=wf.prompt or PromptConfig(),
        arrival=wf.arrival,
        rate=wf.rate,
        concurrency=wf.concurrency,
        source={"file": str(path)},
        request=wf.request or RequestOptions(),
        graph=graph,
    )


def _graph_of(gc: GraphConfig, path: Path) -> GraphSource:
    where = f"{path}: graph"
    if (gc.path is None) == (not gc.node):
        raise WorkloadError(f"{where}: give [[graph.node]] tables or path (a graph JSONL file), one of them")
    if gc.path is not None:
        file = Path(gc.path) if Path(gc.path).is_absolute() else path.parent / gc.path
        if not file.is_file():
            raise WorkloadError(f"{where}.path: {file}: no such file")
        return read_graph_file(file)
    return TemplateGraph(gc.node, where, lambda cfg, at: cfg.build(at))
