"""SGLang: the native ``/generate`` stream, and SGLang's OpenAI-compatible surface.

Native events carry the **cumulative** text and ``meta_info.completion_tokens`` (cumulative),
so per-chunk token counts are exact: each event's ``completion_tokens`` becomes
``StreamEvent.cumulative`` and the recorder takes differences. ``meta_info.finish_reason`` is
null until the last event, then an object (``{"type": "length", ...}``). With the server flag
``--stream-output`` the text is incremental instead; both are handled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from adapters.base import EventKind, HttpCall, StreamEvent, register
from adapters.openai import DONE, OpenAIAdapter, StreamPayloadError, _as_prompt, error_event, loads
from adapters.sampling import sglang_fields
from workloads.spec import Message, RequestSpec, merge_body


class SGLangStreamParser:
    """Turns cumulative native events into per-event deltas."""

    __slots__ = ("_text", "_last_tokens")

    def __init__(self) -> None:
        self._text = ""
        self._last_tokens = 0

    def parse_unary(self, body: bytes) -> StreamEvent:
        """A whole non-streaming ``/generate`` response: the one event a stream would end with."""
        event = self.parse(body)
        if event is None or event.kind == EventKind.DONE:
            raise StreamPayloadError(f"not a /generate response: {body[:80]!r}")
        return event

    def parse(self, payload: bytes) -> StreamEvent | None:
        if payload == b"[DONE]":
            return DONE
        obj = loads(payload)
        if not isinstance(obj, dict):
            raise StreamPayloadError(f"stream event is not a JSON object: {payload[:80]!r}")
        if "error" in obj or obj.get("object") == "error":
            return error_event(obj)
        meta = obj.get("meta_info") or {}
        text = obj.get("text") or ""
        if text.startswith(self._text):
            delta = text[len(self._text) :]
            self._text = text
        else:  # incremental text (--stream-output), or a revised detokenisation
            delta = text
            self._text += text
        completion = meta.get("completion_tokens")
        finish = meta.get("finish_reason")
        if isinstance(finish, dict):
            finish_reason: str | None = str(finish.get("type") or "stop")
        elif finish is not None:
            finish_reason = str(finish)
        else:
            finish_reason = None
        grew = completion is not None and completion > self._last_tokens
        if completion is not None:
            self._last_tokens = max(self._last_tokens, completion)
        if finish_reason == "abort":
            message = finish.get("message") if isinstance(finish, dict) else None
            return StreamEvent(EventKind.ERROR, error_type="abort", error_message=str(message or "request aborted"))
        kind = EventKind.CONTENT if (grew or delta) else EventKind.EMPTY
        return StreamEvent(
            kind,
            text=delta,
            cumulative=completion,
            finish_reason=finish_reason,
            prompt_tokens=meta.get("prompt_tokens"),
            completion_tokens=completion if finish_reason is not None else None,
            cached_tokens=meta.get("cached_tokens"),
            server_request_id=meta.get("id"),
        )


class SGLangAdapter:
    """SGLang's native ``POST /generate`` with ``stream: true``."""

    name = "sglang"
    forces_output_length = True
    exact_chunk_counts = True
    requires_done = True

    def __init__(
        self,
        model: str = "default",
        api_key: str | None = None,
        force_length_fields: bool = True,
        extra_sampling: dict[str, Any] | None = None,
        extra_body: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        self.model = model
        self.extra_body = dict(extra_body or {})
        self.force_length_fields = force_length_fields
        self.extra_sampling = dict(extra_sampling or {})
        headers = [("Content-Type", "application/json")]
        if api_key:
            headers.append(("Authorization", f"Bearer {api_key}"))
        self._headers = tuple(headers)

    def body(self, spec: RequestSpec, history: Sequence[Message] = ()) -> dict[str, Any]:
        sampling: dict[str, Any] = {"max_new_tokens": spec.max_output_tokens}
        if spec.fixed_output and self.force_length_fields:
            sampling["ignore_eos"] = True
            sampling["min_new_tokens"] = spec.max_output_tokens
        top: dict[str, Any] = {}
        if spec.sampling is not None:
            params, top = sglang_fields(spec.sampling)
            sampling.update(params)
        sampling.update(self.extra_sampling)
        body = {"text": _as_prompt(spec, history), "sampling_params": sampling, "stream": spec.stream, **top}
        return merge_body(body, self.extra_body) if self.extra_body else body

    def build(self, spec: RequestSpec, history: Sequence[Message] = ()) -> HttpCall:
        return HttpCall("POST", "/generate", orjson.dumps(self.body(spec, history)), self._headers)

    def parser(self) -> SGLangStreamParser:
        return SGLangStreamParser()

    def describe(self) -> dict[str, Any]:
        return {
            "adapter": self.name,
            "api": "native",
            "path": "/generate",
            "model": self.model,
            "force_length_fields": self.force_length_fields,
            "forces_output_length": self.forces_output_length,
            "token_counts": "exact (meta_info.completion_tokens, cumulative)",
        }


class SGLangOpenAIAdapter(OpenAIAdapter):
    """SGLang's OpenAI-compatible routes (it accepts continuous_usage_stats, ignore_eos, min_tokens)."""

    name = "sglang-openai"

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "adapter": self.name}


register("sglang", "adapters.sglang:SGLangAdapter")
register("sglang-openai", "adapters.sglang:SGLangOpenAIAdapter")
