"""Hugging Face TGI: ``POST /generate_stream``.

Every event carries exactly one generated token (prefill is not streamed), so each event
counts one token (``StreamEvent.tokens = 1``). ``parameters.details = true`` makes the last
event carry ``details{finish_reason, generated_tokens, input_length}``. There is no
``[DONE]``: the stream simply ends after the event with ``generated_text`` (so
``requires_done = False``). Errors arrive as ``{"error": ..., "error_type": ...}`` events
after HTTP 200, validation and admission ("overloaded", past ``--max-concurrent-requests``)
included. The end-of-sequence token comes as ``special: true``: a token without text.
TGI has no ``ignore_eos``/``min_new_tokens``: output length cannot be forced, and runs
record that (``forces_output_length: false``); from 3.0 it generates in 1024-token segments
and may end past ``max_new_tokens`` (docs/engines.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from bench_llm.adapters.base import EventKind, HttpCall, StreamEvent, register
from bench_llm.adapters.openai import StreamPayloadError, _as_prompt, error_event, loads, unary_object
from bench_llm.adapters.sampling import refuse_embeddings, refuse_tools, tgi_fields, tgi_structured
from bench_llm.workloads.spec import Message, RequestSpec, merge_body

_EMPTY = StreamEvent(EventKind.EMPTY)


class TGIStreamParser:
    __slots__ = ()

    #: The compiled read path's scan for this stream (loadgen/_fastpath.c, API_TGI): it keeps
    #: the token events (one token each, no final fields) itself, exactly as ``parse`` would
    #: build them, and hands every other payload to ``parse``; nothing changes its meaning.
    fast_api = 3
    fast_ok = True

    def parse_unary(self, body: bytes) -> StreamEvent:
        """A whole ``POST /generate`` response: ``generated_text`` and ``details``."""
        obj = unary_object(body)
        if "error" in obj:
            return error_event(obj)
        details = obj.get("details") or {}
        generated = details.get("generated_tokens")
        return StreamEvent(
            EventKind.CONTENT, str(obj.get("generated_text") or ""), generated,
            finish_reason=details.get("finish_reason") or "unknown", completion_tokens=generated,
        )

    def parse(self, payload: bytes) -> StreamEvent | None:
        obj = loads(payload)
        if not isinstance(obj, dict):
            raise StreamPayloadError(f"stream event is not a JSON object: {payload[:80]!r}")
        if "error" in obj:
            return error_event(obj)
        token = obj.get("token")
        if not isinstance(token, dict):
            return _EMPTY
        details = obj.get("details") or None
        final = obj.get("generated_text") is not None or details is not None
        finish_reason = None
        completion = prompt = None
        if details:
            finish_reason = details.get("finish_reason") or "unknown"
            completion = details.get("generated_tokens")
            prompt = details.get("input_length")
        elif final:
            finish_reason = "unknown"  # details were not requested or not sent
        return StreamEvent(
            EventKind.CONTENT,
            text="" if token.get("special") else (token.get("text") or ""),
            tokens=1,
            finish_reason=finish_reason,
            prompt_tokens=prompt,
            completion_tokens=completion,
        )


class TGIAdapter:
    name = "tgi"
    forces_output_length = False
    exact_chunk_counts = True
    requires_done = False

    def __init__(
        self,
        model: str = "default",
        api_key: str | None = None,
        extra_parameters: dict[str, Any] | None = None,
        extra_body: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        self.model = model
        self.extra_body = dict(extra_body or {})
        self.extra_parameters = dict(extra_parameters or {})
        headers = [("Content-Type", "application/json")]
        if api_key:
            headers.append(("Authorization", f"Bearer {api_key}"))
        self._headers = tuple(headers)

    def body(self, spec: RequestSpec, history: Sequence[Message] = ()) -> dict[str, Any]:
        refuse_embeddings(spec, "tgi", "TEI serves them: use --engine openai against TEI's /v1/embeddings")
        refuse_tools(spec, "tgi (/generate_stream)", "use --engine openai --api chat (TGI's /v1/chat/completions)",
                     images=True)
        params: dict[str, Any] = {"max_new_tokens": spec.max_output_tokens, "details": True}
        if spec.sampling is not None:
            params.update(tgi_fields(spec.sampling))
        if spec.constraint is not None:
            params.update(tgi_structured(spec.constraint))
        if spec.model is not None and spec.model != self.model:
            params["adapter_id"] = spec.model  # TGI multi-LoRA (--lora-adapters)
        params.update(self.extra_parameters)
        body: dict[str, Any] = {"inputs": _as_prompt(spec, history), "parameters": params}
        if spec.stream:
            body["stream"] = True
        return merge_body(body, self.extra_body) if self.extra_body else body

    def build(self, spec: RequestSpec, history: Sequence[Message] = ()) -> HttpCall:
        path = "/generate_stream" if spec.stream else "/generate"
        return HttpCall("POST", path, orjson.dumps(self.body(spec, history)), self._headers)

    def parser(self) -> TGIStreamParser:
        return TGIStreamParser()

    def describe(self) -> dict[str, Any]:
        return {
            "adapter": self.name,
            "path": "/generate_stream",
            "model": self.model,
            "forces_output_length": False,
            "note": "TGI cannot force the output length (no ignore_eos/min_new_tokens): "
            "requests may end early at the end-of-sequence token",
            "token_counts": "exact (one token per event)",
        }


register("tgi", "bench_llm.adapters.tgi:TGIAdapter")
