"""OpenAI-compatible completions and chat, as vLLM serves them.

Requests ask for ``stream_options: {include_usage, continuous_usage_stats}`` so every
chunk carries the cumulative completion-token count (exact per-chunk deltas), and
``ignore_eos`` + ``min_tokens`` so the requested output length is honoured.

With ``n`` > 1 (several sequences per request) a request asks ``include_usage`` only: vLLM
then puts on each choice's chunk that choice's *own* cumulative count (the choices
interleave) and the total only in the final usage chunk, a shape the compiled read path
(loadgen/_fastpath.c, which does not read a choice's index) would take for one count. The
final total is exact, spread over the text chunks (docs/metrics.md, token accounting).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import orjson

from bench_llm.adapters.base import EventKind, HttpCall, StreamEvent
from bench_llm.adapters.sampling import (
    StructuredStyle,
    UnsupportedRequest,
    image_urls,
    openai_fields,
    openai_structured,
)
from bench_llm.core.errors import BenchError
from bench_llm.core.rejections import ABORT_503
from bench_llm.workloads.spec import Message, RequestSpec, embedding_inputs, merge_body
from bench_llm.workloads.tools import tool_choice_field, tool_definitions

Api = Literal["completions", "chat"]

DONE = StreamEvent(EventKind.DONE)
_EMPTY = StreamEvent(EventKind.EMPTY)


class StreamPayloadError(BenchError):
    """A payload that is not valid for the protocol (recorded as ``malformed_chunk``)."""


def error_event(obj: dict[str, Any]) -> StreamEvent:
    """An in-stream error object (``{"error": ...}`` or ``{"object": "error", ...}``). One with
    ``code`` 503 is an admission rejection (``abort_503``): SGLang's OpenAI routes end a stream
    so past ``--max-queued-requests`` (``{"type": "SERVICE_UNAVAILABLE", "code": 503}``,
    entrypoints/openai/serving_completions.py), as its native route does with an abort."""
    err = obj.get("error", obj)
    if isinstance(err, dict):
        message = str(err.get("message", err))
        etype = str(err.get("type") or err.get("code") or "server_error")
        if err.get("code") == 503:
            etype = ABORT_503
    else:
        message = str(err)
        etype = str(obj.get("error_type") or "server_error")
    return StreamEvent(EventKind.ERROR, error_type=etype, error_message=message[:500])


def loads(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise StreamPayloadError(f"malformed JSON in stream chunk: {payload[:80]!r}") from exc


def unary_object(body: bytes) -> dict[str, Any]:
    """A non-streaming response body as a JSON object (``StreamPayloadError`` otherwise)."""
    obj = loads(body)
    if not isinstance(obj, dict):
        raise StreamPayloadError(f"response is not a JSON object: {body[:80]!r}")
    return obj


class OpenAIStreamParser:
    """Parses one streamed OpenAI-style response (completions or chat)."""

    __slots__ = ("_chat", "_continuous", "_first", "_others")

    def __init__(self, chat: bool) -> None:
        self._chat = chat
        # Usage on a choices chunk is cumulative only if every text chunk so far carried it
        # (vLLM continuous_usage_stats); servers that put usage only in their last text chunk
        # (transformers serve, llama.cpp) give the final count there, not a per-chunk one.
        self._continuous = True
        # With n > 1 and continuous usage, vLLM counts each choice on its own chunks: the
        # request's cumulative count is the sum over choices (choice 0's, then the others').
        self._first = 0
        self._others: dict[int, int] | None = None

    @property
    def fast_api(self) -> int:
        """The compiled read path's scan for this stream (loadgen/_fastpath.c): it keeps
        the regular token events (text, usage, no finish reason) itself, exactly as
        ``parse`` would build them, and hands every other payload to ``parse``."""
        return 2 if self._chat else 1

    @property
    def fast_ok(self) -> bool:
        """Whether the compiled scan may still read usage as a cumulative count."""
        return self._continuous

    def parse_unary(self, body: bytes) -> StreamEvent:
        """A whole non-streaming response (``stream: false``) as one event."""
        obj = unary_object(body)
        if "error" in obj or obj.get("object") == "error":
            return error_event(obj)
        usage = obj.get("usage") or {}
        if obj.get("object") == "list":  # /v1/embeddings: a vector per input, no generated tokens
            if not isinstance(obj.get("data"), list) or not obj["data"]:
                raise StreamPayloadError(f"embeddings response without data: {body[:80]!r}")
            return StreamEvent(EventKind.CONTENT, "", 0, None, None, usage.get("prompt_tokens"), 0, None, obj.get("id"))
        choice = (obj.get("choices") or [{}])[0]
        message = (choice.get("message") or {}) if self._chat else {}
        text = message.get("content") if self._chat else choice.get("text")
        details = usage.get("prompt_tokens_details") or {}
        calls = message.get("tool_calls")
        return StreamEvent(
            EventKind.CONTENT, text or "", usage.get("completion_tokens"), None, choice.get("finish_reason"),
            usage.get("prompt_tokens"), usage.get("completion_tokens"), details.get("cached_tokens"), obj.get("id"),
            tool_calls=len(calls) if isinstance(calls, list) and calls else None,
        )

    def _choices_total(self, index: Any, count: Any) -> Any:
        """The request's cumulative count once a choice other than 0 carried its own count:
        each choice's latest count, summed (``n`` > 1 with continuous usage, vLLM)."""
        others = self._others if self._others is not None else {}
        self._others = others
        if isinstance(count, int):
            if index == 0:
                self._first = count
            else:
                others[index] = count
        return self._first + sum(others.values())

    def parse(self, payload: bytes) -> StreamEvent | None:
        if payload == b"[DONE]":
            return DONE
        obj = loads(payload)
        if not isinstance(obj, dict):
            raise StreamPayloadError(f"stream chunk is not a JSON object: {payload[:80]!r}")
        if "error" in obj or obj.get("object") == "error":
            return error_event(obj)
        usage = obj.get("usage")
        choices = obj.get("choices")
        rid = obj.get("id")
        if not choices:
            if not usage:
                return _EMPTY
            details = usage.get("prompt_tokens_details") or {}
            return StreamEvent(
                EventKind.USAGE,
                prompt_tokens=usage.get("prompt_tokens"),
                completion_tokens=usage.get("completion_tokens"),
                cached_tokens=details.get("cached_tokens"),
                server_request_id=rid,
            )
        choice = choices[0]
        if choice.get("finish_reason") == "abort":
            # vLLM's FinishReason.ABORT, SGLang's graceful abort: the request did not complete
            return StreamEvent(EventKind.ERROR, error_type="abort", error_message="request aborted by the engine")
        kind = EventKind.EMPTY
        text = ""
        calls = None
        if self._chat:
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content:
                kind, text = EventKind.CONTENT, content
            elif delta.get("tool_calls"):
                kind, text = EventKind.CONTENT, ""
                calls = _tool_calls(delta["tool_calls"])
            else:
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if reasoning:
                    kind, text = EventKind.REASONING, reasoning
                elif "role" in delta:
                    kind = EventKind.ROLE
        else:
            t = choice.get("text")
            if t:
                kind, text = EventKind.CONTENT, t
        if not usage:
            if text:
                self._continuous = False
            return StreamEvent(kind, text, None, None, choice.get("finish_reason"), None, None, None, rid, tool_calls=calls)
        # the per-token path: positional fields (StreamEvent order), no throwaway dicts
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if details else None
        final = usage.get("completion_tokens")
        if self._continuous:
            index = choice.get("index")
            if index or self._others is not None:
                final = self._choices_total(index or 0, final)
            elif final is not None:
                self._first = final
            return StreamEvent(kind, text, None, final, choice.get("finish_reason"), usage.get("prompt_tokens"), None, cached,
                               rid, tool_calls=calls)
        return StreamEvent(kind, text, None, None, choice.get("finish_reason"), usage.get("prompt_tokens"), final, cached, rid,
                           tool_calls=calls)


class OpenAIAdapter:
    """vLLM's OpenAI-compatible server (and any server that accepts the same fields)."""

    name = "openai"
    forces_output_length = True
    exact_chunk_counts = True
    #: how a structured-output constraint is sent (adapters/sampling.py openai_structured)
    structured_style: StructuredStyle = "vllm"

    def __init__(
        self,
        model: str = "default",
        api: Api = "completions",
        base_path: str = "/v1",
        api_key: str | None = None,
        continuous_usage: bool = True,
        force_length_fields: bool = True,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if api not in ("completions", "chat"):
            raise ValueError(f"api must be 'completions' or 'chat', not {api!r}")
        self.model = model
        self.api: Api = api
        self.base_path = base_path.rstrip("/")
        self.continuous_usage = continuous_usage
        self.force_length_fields = force_length_fields
        self.extra_body = dict(extra_body or {})
        headers = [("Content-Type", "application/json")]
        if api_key:
            headers.append(("Authorization", f"Bearer {api_key}"))
        self._headers = tuple(headers)
        self.exact_chunk_counts = continuous_usage

    @property
    def path(self) -> str:
        return f"{self.base_path}/{'chat/completions' if self.api == 'chat' else 'completions'}"

    def body(self, spec: RequestSpec, history: Sequence[Message] = ()) -> dict[str, Any]:
        if spec.kind == "embeddings":
            emb: dict[str, Any] = {"model": spec.model or self.model, "input": embedding_inputs(spec)}
            return merge_body(emb, self.extra_body) if self.extra_body else emb
        body: dict[str, Any] = {"model": spec.model or self.model, "max_tokens": spec.max_output_tokens,
                                "stream": spec.stream}
        if spec.stream:
            body["stream_options"] = (
                {"include_usage": True, "continuous_usage_stats": True} if self.continuous_usage else {"include_usage": True}
            )
        if self.api == "chat":
            messages: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in (*history, *_as_messages(spec))]
            if spec.images:  # the request's own (last) message: its text, then its images
                parts = [{"type": "image_url", "image_url": {"url": url}} for url in image_urls(spec)]
                messages[-1]["content"] = [{"type": "text", "text": messages[-1]["content"]}, *parts]
            body["messages"] = messages
        elif spec.images:
            raise UnsupportedRequest(f"{self.name}: images are sent in chat messages: use --api chat")
        else:
            body["prompt"] = _as_prompt(spec, history)
        if spec.fixed_output and self.force_length_fields:
            body["ignore_eos"] = True
            body["min_tokens"] = spec.max_output_tokens
        if spec.sampling is not None:
            body.update(openai_fields(spec.sampling, self.api == "chat"))
        if spec.constraint is not None:
            body.update(openai_structured(spec.constraint, self.structured_style, self.name))
        if spec.tools:
            if self.api != "chat":
                raise UnsupportedRequest(f"{self.name}: tools are sent with chat requests: use --api chat")
            body["tools"] = tool_definitions(spec.tools)
            if spec.tool_choice is not None:
                body["tool_choice"] = tool_choice_field(spec.tool_choice)
        if self.extra_body:
            body = merge_body(body, self.extra_body)
        n = body.get("n")
        if isinstance(n, int) and n > 1 and spec.stream and "stream_options" not in self.extra_body:
            body["stream_options"] = {"include_usage": True}  # n > 1: the final total only (module docstring)
        return body

    def build(self, spec: RequestSpec, history: Sequence[Message] = ()) -> HttpCall:
        path = f"{self.base_path}/embeddings" if spec.kind == "embeddings" else self.path
        return HttpCall("POST", path, orjson.dumps(self.body(spec, history)), self._headers)

    def parser(self) -> OpenAIStreamParser:
        return OpenAIStreamParser(self.api == "chat")

    def describe(self) -> dict[str, Any]:
        return {
            "adapter": self.name,
            "api": self.api,
            "model": self.model,
            "path": self.path,
            "continuous_usage_stats": self.continuous_usage,
            "force_length_fields": self.force_length_fields,
        }


def _tool_calls(deltas: Any) -> int | None:
    """The highest tool-call index of a delta's ``tool_calls`` + 1 (the calls begun so far)."""
    if not isinstance(deltas, list):
        return None
    indexes = [d.get("index", 0) for d in deltas if isinstance(d, dict)]
    return 1 + max(i for i in indexes if isinstance(i, int)) if any(isinstance(i, int) for i in indexes) else None


def _as_messages(spec: RequestSpec) -> tuple[Message, ...]:
    if spec.messages is not None:
        return spec.messages
    return (Message("user", spec.prompt or ""),)


def _as_prompt(spec: RequestSpec, history: Sequence[Message] = ()) -> str:
    if spec.prompt is not None and not history:
        return spec.prompt
    parts = [m.content for m in history]
    parts.extend(m.content for m in _as_messages(spec))
    return "\n".join(parts)
