"""The request spec and the schedule: the contract between workloads and loadgen.

A schedule is computed completely before a run starts (so it can be stored with the
run and replayed byte for byte); loadgen only decides *when* each spec actually went
out, never *what* it contains.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Phase = Literal["warmup", "measure"]
LoadMode = Literal["open", "closed"]
#: What a request asks for: generated text (completions/chat) or embeddings of its inputs.
RequestKind = Literal["generate", "embeddings"]

DEFAULT_IMAGE_SIZE = "512x512"

#: Most tokens one request's prompt or output may ask for: above the longest context any
#: engine serves (2M), and bounded so a mistyped size is refused in one line instead of a
#: prompt built for minutes in gigabytes of memory.
MAX_REQUEST_TOKENS = 1 << 21


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message."""

    role: str
    content: str


@dataclass(frozen=True, slots=True)
class Constraint:
    """A structured-output constraint on a request's answer: exactly one of a JSON schema
    (kept as canonical JSON text, so the constraint is hashable), a regular expression the
    whole answer must match, or a list of choices the answer must equal one of."""

    json_schema: str | None = None
    regex: str | None = None
    choice: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        given = [n for n in ("json_schema", "regex", "choice") if getattr(self, n)]
        if len(given) != 1:
            raise ValueError(f"a structured-output constraint needs exactly one of json_schema, regex, choice "
                             f"(given: {', '.join(given) or 'none'})")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"regex {self.regex!r}: {exc}") from None
        if self.json_schema is not None and not isinstance(json.loads(self.json_schema), dict):
            raise ValueError("json_schema must be a JSON object")

    @property
    def kind(self) -> str:
        return "json_schema" if self.json_schema is not None else "regex" if self.regex is not None else "choice"

    def schema(self) -> dict[str, Any]:
        """The JSON schema as an object (``{}`` for the other kinds)."""
        return json.loads(self.json_schema) if self.json_schema is not None else {}

    def as_regex(self) -> str:
        """A regex or a choice as one regex (engines without a choice field get this)."""
        if self.regex is not None:
            return self.regex
        return "(" + "|".join(re.escape(c) for c in self.choice) + ")"

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "json_schema": self.schema() or None, "regex": self.regex,
                "choice": list(self.choice) or None}


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling parameters sent with a request (``None``/empty: the engine's default).

    ``stop`` sequences end a request before ``max_output_tokens`` when the engine meets
    them, so a request with any stop sequence is never forced to its full length.
    ``logprobs`` is the number of top log-probabilities per output token (0: only the
    sampled token's).
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    n: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """The first invalid value, in words, or ``None``."""
        if self.temperature is not None and self.temperature < 0:
            return f"temperature must be >= 0, not {self.temperature}"
        if self.top_p is not None and not 0 < self.top_p <= 1:
            return f"top_p must be in (0, 1], not {self.top_p}"
        if self.top_k is not None and self.top_k < 1:
            return f"top_k must be >= 1, not {self.top_k}"
        if self.n is not None and self.n < 1:
            return f"n must be >= 1, not {self.n}"
        if self.logprobs is not None and self.logprobs < 0:
            return f"logprobs must be >= 0, not {self.logprobs}"
        if any(not s for s in self.stop):
            return "stop sequences must be non-empty strings"
        return None

    def fields(self) -> dict[str, object]:
        """The parameters that are set, by name (for run metadata and messages)."""
        out: dict[str, object] = {k: getattr(self, k) for k in ("temperature", "top_p", "top_k", "seed", "n", "logprobs")}
        out["stop"] = list(self.stop) if self.stop else None
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class RequestOptions(Sampling):
    """What every request of a run asks for beyond its prompt and length: TOML ``[request]``
    and the matching ``bench run`` options (docs/workloads.md, Request options): the
    sampling fields, and

    ``natural_stop`` lets the engine end a request at its end-of-sequence token instead of
    forcing ``max_output_tokens``; stop sequences imply it. ``extra_body`` is merged into
    every request body last (nested objects key by key), for fields bench has no option for.
    """

    natural_stop: bool | None = None
    #: False: ask for the whole answer in one response (E2E only: no TTFT, TPOT or ITL)
    stream: bool | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    #: structured output (docs/workloads.md): at most one of a JSON schema, a regex, choices
    json_schema: dict[str, Any] | None = None
    regex: str | None = None
    choice: tuple[str, ...] = ()
    #: "embeddings": every request asks for the embeddings of ``batch`` inputs (POST /v1/embeddings)
    kind: RequestKind | None = None
    #: embeddings: inputs per request; several sizes: each request draws one (seeded, uniform)
    batch: tuple[int, ...] = ()
    #: many models / LoRA adapters: each request's model drawn from this weighted mix (seeded)
    models: dict[str, float] = field(default_factory=dict)
    #: tool calls: chat requests carry this many tool definitions (workloads/tools.py)
    tools: int | None = None
    #: "auto", "required", "none" or a tool's name (the engine's default when unset)
    tool_choice: str | None = None
    #: images in chat: this many locally made PNGs of ``image_size`` ("WxH", default 512x512) per request
    images: int | None = None
    image_size: str | None = None

    def __post_init__(self) -> None:
        Sampling.__post_init__(self)
        self.constraint()  # at most one structured-output field, each valid
        if any(b < 1 for b in self.batch):
            raise ValueError(f"batch sizes must be >= 1, not {list(self.batch)}")
        if self.batch and self.kind != "embeddings":
            raise ValueError("batch is the number of inputs of an embeddings request: set kind = \"embeddings\"")
        if self.kind == "embeddings" and self.constraint() is not None:
            raise ValueError("embeddings requests have no generated answer to constrain")
        if any(not name for name in self.models) or any(not w > 0 for w in self.models.values()):
            raise ValueError("models: each model (or adapter) needs a name and a weight > 0")
        if self.tools is not None and self.tools < 0:
            raise ValueError(f"tools must be >= 0, not {self.tools}")
        if self.tool_choice is not None and not self.tools:
            raise ValueError("tool_choice needs tools (the number of tool definitions sent)")
        if self.images is not None and not 0 <= self.images <= 64:
            raise ValueError(f"images must be 0..64 per request, not {self.images}")
        if self.image_size is not None:
            from bench_llm.workloads.images import parse_size

            parse_size(self.image_size)

    def constraint(self) -> Constraint | None:
        """The structured-output constraint asked for (``None``: none)."""
        if self.json_schema is None and self.regex is None and not self.choice:
            return None
        schema = None if self.json_schema is None else json.dumps(self.json_schema, sort_keys=True, separators=(",", ":"))
        return Constraint(schema, self.regex, self.choice)

    def sampling(self) -> Sampling | None:
        """The sampling fields alone (``None`` when none is set)."""
        s = Sampling(**{k: getattr(self, k) for k in Sampling.__slots__})
        return s if s.fields() else None

    @property
    def forced(self) -> bool:
        """Whether requests are held to their full output length (ignore_eos + min_tokens)."""
        return not self.natural_stop and not self.stop and self.constraint() is None

    def over(self, base: RequestOptions) -> RequestOptions:
        """These options where set, ``base``'s elsewhere (the CLI over a workload file)."""
        values: dict[str, Any] = {}
        for name in RequestOptions.__dataclass_fields__:
            mine, theirs = getattr(self, name), getattr(base, name)
            values[name] = theirs if mine is None or mine == () or mine == {} else mine
        if self.constraint() is not None:  # the command line's constraint replaces the file's whole
            values.update(json_schema=self.json_schema, regex=self.regex, choice=self.choice)
        values["extra_body"] = merge_body(base.extra_body, self.extra_body)
        return RequestOptions(**values)

    def describe(self) -> dict[str, Any]:
        s = self.sampling()
        out: dict[str, Any] = {"sampling": s.fields() if s else {}, "forced_length": self.forced,
                               "stream": self.stream is not False}
        if self.extra_body:
            out["extra_body_keys"] = sorted(self.extra_body)  # values may hold secrets: keys only
        constraint = self.constraint()
        if constraint is not None:
            out["structured"] = constraint.describe()
        if self.kind == "embeddings":
            out["kind"] = "embeddings"
            out["batch"] = list(self.batch or (1,))
        if self.models:
            out["models"] = dict(self.models)
        if self.tools:
            out["tools"] = {"definitions": self.tools, "tool_choice": self.tool_choice}
        if self.images:
            out["images"] = {"per_request": self.images, "size": self.image_size or DEFAULT_IMAGE_SIZE}
        return out

    def image_sizes(self) -> tuple[tuple[int, int], ...]:
        """The sizes of the images each request carries."""
        from bench_llm.workloads.images import parse_size

        return (parse_size(self.image_size or DEFAULT_IMAGE_SIZE),) * (self.images or 0)

    def draw(self, seed: int, request_id: str) -> tuple[int, str | None]:
        """(embedding inputs, model) of one request: the same seed and id give the same draw."""
        rng = random.Random(f"{seed}:{request_id}")
        batch = rng.choice(self.batch) if self.batch else 1
        model = rng.choices(list(self.models), weights=list(self.models.values()))[0] if self.models else None
        return batch, model


def merge_body(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in: nested objects key by key, anything else replaced."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_body(out[key], value)
        else:
            out[key] = value
    return out


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send.

    Exactly one of ``prompt`` (completions-style APIs) and ``messages`` (chat APIs) is
    normally set; adapters that need the other form convert (a prompt becomes one user
    message, messages are joined into a prompt).

    ``send_offset_ns`` is the intended send time relative to the start of the measured
    schedule (open loop). In closed loop it is ``None``: a request goes out as soon as a
    slot is free. For multi-turn sessions, turn ``k+1`` is sent ``think_time_ns`` after
    turn ``k``'s answer completed, with the real history (earlier prompts and the
    answers actually received) prepended by loadgen.
    """

    request_id: str
    input_tokens: int
    max_output_tokens: int
    prompt: str | None = None
    messages: tuple[Message, ...] | None = None
    send_offset_ns: int | None = None
    session_id: str | None = None
    turn: int = 0
    think_time_ns: int = 0
    prefix_group: str | None = None
    phase: Phase = "measure"
    # How the prompt's token count was obtained: "tokenizer", "server_tokenize",
    # "approx" (a documented characters-per-token approximation).
    input_tokens_source: str = "approx"
    # Force exactly max_output_tokens (ignore_eos + min_tokens where the engine allows).
    fixed_output: bool = True
    # Why this request is not sent (it cannot fit the engine's context; workloads/context.py):
    # loadgen records it as a failed row without sending it.
    refused: str | None = None
    # The workload's class of this request in a mix (its component label: 'short', 'long' …).
    length_class: str | None = None
    sampling: Sampling | None = None
    # False: one JSON response instead of a stream (no per-token times)
    stream: bool = True
    #: structured output: the answer must fit this (docs/workloads.md, Structured output)
    constraint: Constraint | None = None
    kind: RequestKind = "generate"
    #: embeddings: the number of inputs sent (``embedding_inputs``)
    batch: int = 1
    #: the model (or LoRA adapter) asked for; None: the run's model
    model: str | None = None
    #: chat: tool definitions sent (workloads/tools.py) and the tool_choice
    tools: int = 0
    tool_choice: str | None = None
    #: chat: (width, height) of each image sent with the prompt (workloads/images.py)
    images: tuple[tuple[int, int], ...] = ()
    #: a session graph's node (workloads/graph.py): the requests of its job that must finish
    #: before it is sent, and the delay after each (tool call, think time). Its intended send
    #: time is the latest of (predecessor's end + delay). ``()``: a root, or not a graph node.
    after: tuple[str, ...] = ()
    after_delay_ns: tuple[int, ...] = ()
    #: the predecessor whose conversation this node continues (its history and answer come
    #: first in the prompt, then the other predecessors' answers); None: a fresh conversation
    context_from: str | None = None

    def __post_init__(self) -> None:
        if len(self.after) != len(self.after_delay_ns):
            raise ValueError(f"request {self.request_id}: one delay per predecessor")
        if self.context_from is not None and self.context_from not in self.after:
            raise ValueError(f"request {self.request_id}: its context must be one of its predecessors")
        if self.max_output_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_output_tokens must be >= 1")
        if self.input_tokens < 0:
            raise ValueError(f"request {self.request_id}: input_tokens must be >= 0")
        if self.prompt is None and self.messages is None:
            raise ValueError(f"request {self.request_id}: needs a prompt or messages")


@dataclass(frozen=True, slots=True)
class Schedule:
    """Everything loadgen needs to run a workload, fixed before the run.

    ``mode`` "open": each measured spec is sent at ``t0 + send_offset_ns``.
    ``mode`` "closed": ``concurrency`` requests are kept in flight until all specs are
    sent (or ``duration_s`` passes). Warm-up specs (phase "warmup") run first, before
    ``t0``, and are recorded but excluded from metrics.
    """

    name: str
    seed: int
    mode: LoadMode
    requests: tuple[RequestSpec, ...]
    concurrency: int | None = None
    rate: float | None = None
    arrival: str = ""
    duration_s: float | None = None
    description: dict[str, object] = field(default_factory=dict)
    #: the options every request was built with (sampling, length forcing, extra body)
    request: RequestOptions = field(default_factory=RequestOptions)

    def __post_init__(self) -> None:
        if self.mode == "closed" and (self.concurrency is None or self.concurrency < 1):
            raise ValueError("closed-loop schedule needs concurrency >= 1")
        if self.mode == "open":
            for spec in self.requests:
                if spec.phase == "measure" and spec.session_id is None and spec.send_offset_ns is None:
                    raise ValueError(f"open-loop request {spec.request_id} has no send offset")

    def with_request(self, options: RequestOptions) -> Schedule:
        """This schedule with ``options`` applied to every request (a request's own sampling
        fields, e.g. from a dataset row, win over the options')."""
        base = options.sampling()
        constraint = options.constraint()
        embeddings = options.kind == "embeddings"
        images = options.image_sizes()
        specs = []
        for spec in self.requests:
            sampling = _sampling_over(spec.sampling, base)
            own = constraint or spec.constraint  # the options win: they include the file's and the CLI's
            # a constrained answer ends where its structure does: never forced past it
            forced = spec.fixed_output and options.forced and not (sampling and sampling.stop) and own is None
            stream = spec.stream and options.stream is not False and not embeddings
            batch, model = options.draw(self.seed, spec.request_id)
            specs.append(replace(spec, sampling=sampling, fixed_output=forced, stream=stream, constraint=own,
                                 kind="embeddings" if embeddings else spec.kind, batch=batch if embeddings else spec.batch,
                                 model=spec.model or model, tools=options.tools or spec.tools,
                                 tool_choice=options.tool_choice or spec.tool_choice, images=images or spec.images))
        desc = {**self.description, "request": options.describe()}
        return replace(self, requests=tuple(specs), request=options, description=desc)

    @property
    def warmup(self) -> tuple[RequestSpec, ...]:
        return tuple(s for s in self.requests if s.phase == "warmup")

    @property
    def measured(self) -> tuple[RequestSpec, ...]:
        return tuple(s for s in self.requests if s.phase == "measure")


def _sampling_over(own: Sampling | None, base: Sampling | None) -> Sampling | None:
    if own is None or base is None:
        return own or base
    values = {k: getattr(own, k) if getattr(own, k) not in (None, ()) else getattr(base, k) for k in Sampling.__slots__}
    return Sampling(**values)


def embedding_inputs(spec: RequestSpec) -> list[str]:
    """The inputs of an embeddings request: its prompt (or messages joined), once per batch
    slot; from the second on each starts with its index, so no two inputs are identical."""
    text = spec.prompt if spec.prompt is not None else "\n".join(m.content for m in spec.messages or ())
    return [text if i == 0 else f"{i} {text}" for i in range(spec.batch)]
