"""The request spec and the schedule: the contract between workloads and loadgen.

A schedule is computed completely before a run starts (so it can be stored with the
run and replayed byte for byte); loadgen only decides *when* each spec actually went
out, never *what* it contains.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Phase = Literal["warmup", "measure"]
LoadMode = Literal["open", "closed"]

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

    def __post_init__(self) -> None:
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

    def __post_init__(self) -> None:
        if self.mode == "closed" and (self.concurrency is None or self.concurrency < 1):
            raise ValueError("closed-loop schedule needs concurrency >= 1")
        if self.mode == "open":
            for spec in self.requests:
                if spec.phase == "measure" and spec.session_id is None and spec.send_offset_ns is None:
                    raise ValueError(f"open-loop request {spec.request_id} has no send offset")

    @property
    def warmup(self) -> tuple[RequestSpec, ...]:
        return tuple(s for s in self.requests if s.phase == "warmup")

    @property
    def measured(self) -> tuple[RequestSpec, ...]:
        return tuple(s for s in self.requests if s.phase == "measure")
