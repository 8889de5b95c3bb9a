"""SGLang: the native ``/generate`` stream, and SGLang's OpenAI-compatible surface.

Native events carry ``meta_info.completion_tokens`` (cumulative), so per-chunk token counts are
exact: each event's ``completion_tokens`` becomes ``StreamEvent.cumulative`` and the recorder
takes differences. ``meta_info.finish_reason`` is null until the last event, then an object
(``{"type": "length", ...}``; ``"abort"`` is a failure, with ``status_code`` 503 an admission
rejection: core/rejections.py). By default the text and ``output_ids``
are cumulative (every event repeats all ids so far: O(n²) bytes per request, SGLang 0.5.x);
with the server's ``--incremental-streaming-output`` (0.5.10+) both are deltas. Up to 0.5.9 its
predecessor ``--stream-output`` made only ``output_ids`` deltas: the text stayed cumulative.
Which mode a stream is in is read from ``output_ids`` (and the engine version, when known),
never guessed from the text: deltas such as ``"ha","ha","ha!"`` look like a growing prefix.
docs/engines.md has the versions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from bench_llm.adapters.base import EventKind, HttpCall, ScanState, StreamEvent, register
from bench_llm.adapters.openai import DONE, OpenAIAdapter, StreamPayloadError, _as_prompt, error_event, loads
from bench_llm.adapters.sampling import image_urls, refuse_embeddings, refuse_tools, sglang_fields, sglang_structured
from bench_llm.adapters.versions import version_at_least
from bench_llm.core.rejections import ABORT_503
from bench_llm.workloads.spec import Message, RequestSpec, merge_body

#: Per-request timings SGLang puts in ``meta_info`` when launched with ``--enable-metrics``, as
#: each release names them (seconds; the two ``*_time`` stamps are Unix seconds): 0.5.6-0.5.9
#: ``queue_time``, ``prefill_launch_delay``, ``prefill_launch_latency``; 0.5.10-0.5.11
#: ``queue_time``, ``prefill_waiting_latency``, ``prefill_launch_latency`` and the stamps
#: ``forward_entry_time``, ``prefill_finished_time``; 0.5.12 on ``queue_time`` and the stamps,
#: and later ``first_token_latency`` on the last event (the engine's own TTFT).
#: ``kv_transfer_time`` is bench's simulated engine's only (P/D). They are kept as named;
#: analysis/ttft_rules.py reads them by release (docs/engines.md, "Per-request timings").
TIMING_KEYS = (
    "queue_time", "prefill_launch_delay", "prefill_launch_latency", "prefill_waiting_latency",
    "forward_entry_time", "prefill_finished_time", "first_token_latency", "kv_transfer_time",
)  # fmt: skip


def _timings(meta: dict[str, Any]) -> dict[str, float] | None:
    if "queue_time" not in meta and "prefill_launch_latency" not in meta and "first_token_latency" not in meta:
        return None
    out = {k: float(v) for k in TIMING_KEYS if isinstance(v := meta.get(k), (int, float)) and not isinstance(v, bool)}
    return out or None


class SGLangStreamParser:
    """Turns native events (cumulative or incremental) into per-event deltas."""

    __slots__ = ("_text", "_last_tokens", "_incremental", "_text_follows_ids")

    def __init__(self, incremental: bool | None = None, text_follows_ids: bool = True) -> None:
        self._text = ""
        self._last_tokens = 0
        #: whether the text comes as deltas: None until the stream shows it (or the caller knows)
        self._incremental = incremental
        #: False up to SGLang 0.5.9, where delta output_ids came with cumulative text
        self._text_follows_ids = text_follows_ids

    #: The compiled read path's scan for this stream (loadgen/_fastpath.c, API_SGLANG): it takes
    #: the content events without a finish reason itself, keeping this parser's state (mode, text,
    #: tokens so far) while it does, and hands it back (``fast_sync``) before this parser reads
    #: any other payload; it reads the state again (``fast_state``) after.
    fast_api = 4
    fast_ok = True

    def fast_state(self) -> ScanState:
        """(mode: -1 undecided, 0 cumulative text, 1 text deltas; whether the text follows
        ``output_ids``; the tokens so far; the text so far as UTF-8, empty in mode 1)."""
        mode = -1 if self._incremental is None else int(self._incremental)
        return mode, self._text_follows_ids, self._last_tokens, b"" if mode == 1 else self._text.encode()

    def fast_sync(self, mode: int, tokens: int, text: bytes | None) -> None:
        """The state after the events the compiled scan took (``text`` None: deltas, not kept)."""
        self._incremental = None if mode < 0 else bool(mode)
        self._last_tokens = tokens
        if text is not None:
            self._text = text.decode()

    def parse_unary(self, body: bytes) -> StreamEvent:
        """A whole non-streaming ``/generate`` response: the one event a stream would end with."""
        event = self.parse(body)
        if event is None or event.kind == EventKind.DONE:
            raise StreamPayloadError(f"not a /generate response: {body[:80]!r}")
        return event

    def parse(self, payload: bytes) -> StreamEvent | None:
        if payload == b"[DONE]":
            return DONE
        payload, n_ids = _drop_output_ids(payload)
        obj = loads(payload)
        if not isinstance(obj, dict):
            raise StreamPayloadError(f"stream event is not a JSON object: {payload[:80]!r}")
        if "error" in obj or obj.get("object") == "error":
            return error_event(obj)
        meta = obj.get("meta_info") or {}
        text = obj.get("text") or ""
        completion = meta.get("completion_tokens")
        if self._incremental is None:
            ids_delta = _incremental_mode(n_ids, completion, self._last_tokens)
            self._incremental = ids_delta if ids_delta is None else ids_delta and self._text_follows_ids
        if self._incremental or not text.startswith(self._text):
            # deltas; or, in cumulative mode, a revised detokenisation (keep what came)
            delta = text
            self._text += text
        else:
            delta = text[len(self._text) :]
            self._text = text
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
            return _abort_event(finish)
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
            server_timing=_timings(meta),
        )


def _abort_event(finish: Any) -> StreamEvent:
    """A stream SGLang ended with ``finish_reason {"type": "abort", ...}``: with ``status_code``
    503 an admission rejection (its waiting queue full, ``--max-queued-requests``, or a queued
    request displaced by a higher-priority one), recorded as such; any other abort as ``abort``."""
    message = finish.get("message") if isinstance(finish, dict) else None
    status = finish.get("status_code") if isinstance(finish, dict) else None
    etype = ABORT_503 if status == 503 else "abort"
    return StreamEvent(EventKind.ERROR, error_type=etype, error_message=str(message or "request aborted"))


#: --incremental-streaming-output makes the text deltas too from this release (tokenizer_manager.py)
TEXT_DELTAS_SINCE = "0.5.10"
_IDS_KEY = b'"output_ids":'


def _drop_output_ids(payload: bytes) -> tuple[bytes, int | None]:
    """The payload with ``output_ids`` emptied, and how many ids it held (None: no such key).

    Without --incremental-streaming-output every event repeats all ids so far, so decoding them
    costs O(n²) per request on the client; only their number is needed. The key cannot occur
    inside a JSON string (its quotes would be escaped) and the array holds integers only, so
    its first ``]`` ends it."""
    at = payload.find(_IDS_KEY)
    if at < 0:
        return payload, None
    start = payload.find(b"[", at + len(_IDS_KEY))
    end = payload.find(b"]", start)
    if start < 0 or end < 0 or payload[at + len(_IDS_KEY) : start].strip():
        return payload, None  # not the shape described: leave it to the JSON decoder
    body = payload[start + 1 : end]
    n = body.count(b",") + 1 if body.strip() else 0
    return payload[: start + 1] + payload[end:], n


def _incremental_mode(n_ids: int | None, completion: Any, earlier_tokens: int) -> bool | None:
    """The stream's mode from the number of ``output_ids``: True (deltas) when fewer than the
    cumulative count, False when all of them after an earlier event already brought tokens,
    None while undecidable (first event: both modes agree; no ids sent)."""
    if n_ids is None or not isinstance(completion, int) or completion <= 0:
        return None
    if n_ids < completion:
        return True
    return False if earlier_tokens > 0 else None


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
        incremental_output: bool | None = None,
        engine_version: str | None = None,
        extra_body: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        self.model = model
        #: whether the server streams text deltas (--incremental-streaming-output), when known;
        #: None: read from each stream's output_ids
        self.incremental_output = incremental_output
        #: unknown versions are taken as 0.5.10+ (the current releases)
        self.engine_version = engine_version
        self._text_follows_ids = version_at_least(engine_version, TEXT_DELTAS_SINCE) is not False
        self.extra_body = dict(extra_body or {})
        self.force_length_fields = force_length_fields
        self.extra_sampling = dict(extra_sampling or {})
        headers = [("Content-Type", "application/json")]
        if api_key:
            headers.append(("Authorization", f"Bearer {api_key}"))
        self._headers = tuple(headers)

    def body(self, spec: RequestSpec, history: Sequence[Message] = ()) -> dict[str, Any]:
        refuse_embeddings(spec, "sglang (native /generate)", "use --engine sglang-openai (/v1/embeddings)")
        refuse_tools(spec, "sglang (native /generate)", "use --engine sglang-openai --api chat")
        sampling: dict[str, Any] = {"max_new_tokens": spec.max_output_tokens}
        if spec.fixed_output and self.force_length_fields:
            sampling["ignore_eos"] = True
            sampling["min_new_tokens"] = spec.max_output_tokens
        top: dict[str, Any] = {}
        if spec.sampling is not None:
            params, top = sglang_fields(spec.sampling)
            sampling.update(params)
        if spec.constraint is not None:
            sampling.update(sglang_structured(spec.constraint))
        sampling.update(self.extra_sampling)
        body = {"text": _as_prompt(spec, history), "sampling_params": sampling, "stream": spec.stream, **top}
        if spec.model is not None and spec.model != self.model:
            body["lora_path"] = spec.model  # a LoRA adapter loaded with --lora-paths NAME=PATH
        if spec.images:
            body["image_data"] = image_urls(spec)
        return merge_body(body, self.extra_body) if self.extra_body else body

    def build(self, spec: RequestSpec, history: Sequence[Message] = ()) -> HttpCall:
        return HttpCall("POST", "/generate", orjson.dumps(self.body(spec, history)), self._headers)

    def parser(self) -> SGLangStreamParser:
        return SGLangStreamParser(self.incremental_output, self._text_follows_ids)

    def describe(self) -> dict[str, Any]:
        return {
            "adapter": self.name,
            "api": "native",
            "path": "/generate",
            "model": self.model,
            "force_length_fields": self.force_length_fields,
            "forces_output_length": self.forces_output_length,
            "token_counts": "exact (meta_info.completion_tokens, cumulative)",
            "incremental_output": "from output_ids" if self.incremental_output is None else self.incremental_output,
            "engine_version": self.engine_version,
        }


class SGLangOpenAIAdapter(OpenAIAdapter):
    """SGLang's OpenAI-compatible routes (it accepts continuous_usage_stats, ignore_eos, min_tokens)."""

    name = "sglang-openai"
    structured_style = "sglang"

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "adapter": self.name}


register("sglang", "bench_llm.adapters.sglang:SGLangAdapter")
register("sglang-openai", "bench_llm.adapters.sglang:SGLangOpenAIAdapter")
