"""The adapter contract: an HTTP call to make, and events parsed from its stream."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple, Protocol, TypeGuard

from bench_llm.workloads.spec import Constraint, Message, RequestSpec, Sampling


class EventKind(IntEnum):
    """What one stream payload carried."""

    CONTENT = 0  # answer text / tokens
    REASONING = 1  # reasoning ("thinking") tokens, before or between content
    ROLE = 2  # role-only opening frame: never a token
    EMPTY = 3  # a frame with neither text nor a token count (held-back bytes, keep-alive JSON)
    USAGE = 4  # usage-only frame (``choices: []``)
    ERROR = 5  # an error reported inside the stream
    DONE = 6  # explicit end-of-stream marker (``[DONE]``)


@dataclass(frozen=True, slots=True)
class HttpCall:
    """One HTTP request, fully serialised before the send time comes."""

    method: str
    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)


class StreamEvent(NamedTuple):
    """One parsed stream payload (immutable).

    A NamedTuple rather than a frozen dataclass: one is built per streamed chunk on the
    client's hot path, and a tuple is built in a third of the time.

    Token accounting, in order of trust:
    ``cumulative``: the server's cumulative completion-token count after this payload
    (vLLM ``continuous_usage_stats``, SGLang ``meta_info.completion_tokens``).
    ``tokens``: the exact number of tokens this payload carries when the protocol says so
    (TGI: one token per event). Neither set: the recorder falls back to the final usage
    spread over the chunks, or to one token per non-empty chunk, and says so.
    """

    kind: EventKind
    text: str = ""
    tokens: int | None = None
    cumulative: int | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    server_request_id: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    #: the engine's per-request timings in seconds, as it names them (SGLang meta_info, whose
    #: keys differ by release: adapters/sglang.py TIMING_KEYS; docs/metrics.md)
    server_timing: dict[str, float] | None = None
    #: chat tool calls this payload carries part of: the highest tool-call index + 1 (a
    #: non-streaming answer: its number of tool calls); None: none
    tool_calls: int | None = None


class StreamParser(Protocol):
    """Per-request parser (may keep state, e.g. SGLang's cumulative text)."""

    def parse(self, payload: bytes) -> StreamEvent | None:
        """Parse one SSE ``data`` payload; ``None`` for payloads that carry nothing."""
        ...


#: The state a compiled scan keeps for a stateful parser while it takes events itself:
#: (mode: -1 undecided, 0 cumulative text, 1 text deltas; whether the text follows the
#: token ids; the tokens so far; the text so far as UTF-8).
ScanState = tuple[int, bool, int, bytes]


class ScanStateParser(StreamParser, Protocol):
    """A parser whose per-stream state the compiled read path keeps while it takes the
    regular events (SGLang's cumulative text): it hands the state over before the scan takes
    events and takes it back before it parses any other payload itself."""

    def fast_state(self) -> ScanState: ...
    def fast_sync(self, mode: int, tokens: int, text: bytes | None) -> None: ...


def keeps_scan_state(parser: StreamParser) -> TypeGuard[ScanStateParser]:
    """Whether ``parser`` hands its stream state to the compiled scan (a plain attribute
    check: a runtime Protocol isinstance costs tens of µs, too much on the read path)."""
    return callable(getattr(parser, "fast_state", None)) and callable(getattr(parser, "fast_sync", None))


class Adapter(Protocol):
    """Speaks one engine API."""

    name: str
    #: True when the protocol can force the output length (ignore_eos/min_tokens).
    forces_output_length: bool
    #: True when per-chunk token counts are exact whenever the server cooperates.
    exact_chunk_counts: bool

    def build(self, spec: RequestSpec, history: Sequence[Message] = ()) -> HttpCall:
        """The call for ``spec``; ``history`` holds earlier turns of its session."""
        ...

    def parser(self) -> StreamParser:
        ...

    def describe(self) -> dict[str, Any]:
        """Settings recorded in the run metadata (never secrets)."""
        ...


_REGISTRY: dict[str, str] = {
    "openai": "bench_llm.adapters.openai:OpenAIAdapter",
    "vllm": "bench_llm.adapters.openai:OpenAIAdapter",
}


def register(name: str, target: str) -> None:
    """Register ``module:Class`` under ``name`` (lazy import)."""
    _REGISTRY[name] = target


def adapter_names() -> list[str]:
    _load_plugins()
    return sorted(_REGISTRY)


def _load_plugins() -> None:
    # Adapters in their own modules register themselves on import.
    for module in ("bench_llm.adapters.sglang", "bench_llm.adapters.tgi", "bench_llm.adapters.generic"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def check_requests(adapter: Adapter, specs: Sequence[RequestSpec]) -> None:
    """Build one call per distinct sampling, constraint, kind, tools and images of ``specs``: ``ValueError``
    naming what the engine cannot express, before any request is sent."""
    seen: set[tuple[Sampling | None, Constraint | None, str, int, bool]] = set()
    for spec in specs:
        key = (spec.sampling, spec.constraint, spec.kind, spec.tools, bool(spec.images))
        if key not in seen:
            seen.add(key)
            adapter.build(spec)


def get_adapter(name: str, **options: Any) -> Adapter:
    """Instantiate the adapter registered as ``name`` with ``options``."""
    _load_plugins()
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown adapter {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None
    module_name, _, cls_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    adapter: Adapter = cls(**options)
    return adapter
