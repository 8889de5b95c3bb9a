"""The per-request record: one row of the requests table."""

from __future__ import annotations

from dataclasses import dataclass

#: ``token_source`` of a non-streaming request: its output tokens are the response's usage,
#: and it has no per-token times (no TTFT, TPOT or ITL; E2E only).
SOURCE_NON_STREAMING = "response_usage"


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """Everything measured for one request. Timestamps are ``perf_counter_ns`` values.

    ``intended_send_ns`` is when the schedule wanted the request to go (open loop) or
    when its closed-loop slot became free; ``send_ns`` is when the request bytes were
    handed to the socket; ``first_byte_ns`` when the response headers arrived.
    ``chunk_ns``/``chunk_tokens`` hold every stream payload with the number of tokens
    it carried (0 for role-only, empty and usage-only frames).
    """

    request_id: str
    phase: str
    worker_id: int
    intended_send_ns: int
    send_ns: int | None
    first_byte_ns: int | None
    first_token_ns: int | None
    first_content_ns: int | None
    end_ns: int | None
    chunk_ns: list[int]
    chunk_tokens: list[int]
    output_tokens: int
    token_source: str
    input_tokens_target: int
    input_tokens_source: str
    max_output_tokens: int
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    http_status: int | None
    finish_reason: str | None
    ok: bool
    error_type: str | None
    error_message: str | None
    server_request_id: str | None
    session_id: str | None = None
    turn: int = 0
    prefix_group: str | None = None
    output_text: str | None = None
    #: the engine's per-request timings as JSON (seconds, under the engine's own names)
    server_timing_json: str | None = None
    #: the request's class in a mixed workload ('short', 'long' …)
    length_class: str | None = None
    #: output tokens that came as reasoning ("thinking") before or between the answer's;
    #: None when unknown (a non-streaming response)
    reasoning_tokens: int | None = None
    #: "embeddings" for an embeddings request; None for generated text
    kind: str | None = None
    #: the model or LoRA adapter asked for, when the workload mixes several; None: the run's model
    model: str | None = None
    #: whether the answer fit the request's structured-output constraint; None: no constraint,
    #: or the request failed
    structured_ok: bool | None = None
    #: embeddings: the number of inputs in the request
    inputs: int | None = None
    #: chat with tools: the tool calls the answer made (0: none); None: no tools sent
    tool_calls: int | None = None
    #: when the first tool-call token arrived (streaming only)
    first_tool_call_ns: int | None = None
    #: chat: the images sent with the prompt (their tokens are in the server's prompt_tokens)
    images: int | None = None
    #: sequences generated for the request (sampling ``n``); None: one. With n > 1 the output
    #: tokens are all the sequences' (docs/metrics.md: TPOT per sequence, no ITL)
    n: int | None = None
    #: a stream that broke its protocol: ``count_backwards`` (a cumulative usage count went
    #: down), ``event_after_end`` (events after the end-of-stream marker; never counted); None: none
    protocol_anomaly: str | None = None
