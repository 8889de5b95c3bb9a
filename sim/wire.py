"""Stream payloads of each engine flavour, byte for byte (reference engine-protocols.md §5).

One formatter per request. ``tokens`` turns the tokens of one emission into the bytes to
write (one SSE event, or one event per token for TGI); ``closing`` ends the stream.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from bench_llm.core.tokenizer import tokenize

_dumps = orjson.dumps


def sse(obj: Any) -> bytes:
    return b"data: " + _dumps(obj) + b"\n\n"


class OpenAIWire:
    """vLLM's /v1/completions and /v1/chat/completions streams."""

    __slots__ = ("rid", "chat", "model", "created", "prompt_tokens", "cached", "include_usage", "continuous",
                 "details", "_opened", "_head", "_mid", "_usage_head", "reasoning", "_reasoning_head", "tool", "n")

    def __init__(self, rid: str, chat: bool, model: str, prompt_tokens: int, include_usage: bool, continuous: bool,
                 cached_details: bool = False) -> None:
        self.rid, self.chat, self.model = rid, chat, model
        self.created = int(time.time())
        self.prompt_tokens = prompt_tokens
        self.cached = 0
        self.include_usage = include_usage
        self.continuous = include_usage and continuous
        self.details = cached_details
        self._opened = False
        # byte templates for the hot path (same bytes orjson would produce)
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = (b'data: {"id":' + _dumps(rid) + b',"object":"' + obj.encode() + b'","created":'
                      + str(self.created).encode() + b',"model":' + _dumps(model)
                      + (b',"choices":[{"index":0,"delta":{"content":' if chat else b',"choices":[{"index":0,"text":'))
        self._mid = (b'},"logprobs":null,"finish_reason":' if chat else b',"logprobs":null,"finish_reason":')
        self._usage_head = b',"usage":{"prompt_tokens":' + str(prompt_tokens).encode() + b',"total_tokens":'
        #: chat only: the first ``reasoning`` output tokens go out as ``delta.reasoning_content``
        #: (vLLM's reasoning parsers), the answer after them
        self.reasoning = 0
        self._reasoning_head = self._head.replace(b'"delta":{"content":', b'"delta":{"reasoning_content":')
        #: chat with tools: (call id, function name) when the answer is a tool call, its arguments
        #: streamed as ``delta.tool_calls`` deltas (vLLM's tool parsers' shape)
        self.tool: tuple[str, str] | None = None
        #: sequences per request (sampling ``n``): with n > 1 each step's tokens go out as one
        #: chunk per choice (``choices_tokens``)
        self.n = 1

    def usage(self, done: int) -> dict[str, Any]:
        u: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens + done,
                             "completion_tokens": done}
        if self.details:
            u["prompt_tokens_details"] = {"cached_tokens": self.cached}
        return u

    def _base(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.rid, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices}

    def tokens(self, text: str, done: int, finish: str | None) -> bytes:
        if self.tool is not None:
            return self._tool_tokens(text, done, finish)
        out = b""
        if self.chat and not self._opened:
            self._opened = True
            first = self._base([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}])
            if self.continuous:
                first["usage"] = self.usage(0)
            out = sse(first)
        fin = b"null" if finish is None else b'"' + finish.encode() + b'"'
        tail = b"}]" if self.chat else b',"stop_reason":null}]'
        if self.continuous:
            usage = (self._usage_head + str(self.prompt_tokens + done).encode() + b',"completion_tokens":'
                     + str(done).encode()
                     + (b',"prompt_tokens_details":{"cached_tokens":' + str(self.cached).encode() + b"}}}\n\n"
                        if self.details else b"}}\n\n"))
        else:
            usage = b"}\n\n"
        head = self._reasoning_head if done <= self.reasoning else self._head
        return out + head + _dumps(text) + self._mid + fin + tail + usage

    def choices_tokens(self, texts: list[str], done: int, finish: str | None) -> bytes:
        """One step's tokens of ``n`` > 1 sequences, as vLLM 0.32 streams them: one chunk per
        choice, in index order, each with (continuous usage) that choice's own cumulative count
        ``done``; in chat, first a role delta per choice with count 0. The total of all choices
        goes in the final usage chunk (``closing``, ``usage(done)`` times ``n``)."""
        out = b""
        if self.chat and not self._opened:
            self._opened = True
            for index in range(len(texts)):
                role = self._base([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}])
                if self.continuous:
                    role["usage"] = self.usage(0)
                out += sse(role)
        key = "reasoning_content" if done <= self.reasoning else "content"
        for index, text in enumerate(texts):
            choice: dict[str, Any] = (
                {"index": index, "delta": {key: text}, "logprobs": None, "finish_reason": finish} if self.chat
                else {"index": index, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None})
            chunk = self._base([choice])
            if self.continuous:
                chunk["usage"] = self.usage(done)
            out += sse(chunk)
        return out

    def _tool_tokens(self, text: str, done: int, finish: str | None) -> bytes:
        """A piece of the tool call's arguments; the first delta names the call and its function."""
        assert self.tool is not None
        call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
        if not self._opened:
            self._opened = True
            call = {"index": 0, "id": self.tool[0], "type": "function",
                    "function": {"name": self.tool[1], "arguments": text}}
        chunk = self._base([{"index": 0, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": finish}])
        if self.continuous:
            chunk["usage"] = self.usage(done)
        return sse(chunk)

    def malformed(self, text: str) -> bytes:
        return b'data: {"id":"' + self.rid.encode() + b'","object":"text_completion","choices":[{"index":0,"text":' + \
            _dumps(text)[:-1] + b"\n\n"

    def closing(self, done: int, no_done: bool) -> bytes:
        out = sse(self._base([]) | {"usage": self.usage(done * self.n)}) if self.include_usage else b""
        return out if no_done else out + b"data: [DONE]\n\n"

    def error(self, message: str, etype: str = "InternalServerError", code: int = 500) -> bytes:
        return sse({"error": {"object": "error", "message": message, "type": etype, "param": None, "code": code}}) + \
            b"data: [DONE]\n\n"

    def aborted(self, done: int) -> bytes:
        """vLLM (and SGLang's OpenAI routes): the last chunk's finish_reason is "abort"."""
        return self.tokens("", done, "abort") + b"data: [DONE]\n\n"

    def unary_choices(self, texts: list[str], done: int, finish: str) -> dict[str, Any]:
        """A whole answer of ``n`` > 1 sequences: a choice per sequence, the usage their total."""
        choices = [{"index": i, "message": {"role": "assistant", "content": t}, "logprobs": None, "finish_reason": finish}
                   if self.chat else {"index": i, "text": t, "logprobs": None, "finish_reason": finish, "stop_reason": None}
                   for i, t in enumerate(texts)]
        return {"id": self.rid, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, "usage": self.usage(done * len(texts))}

    def unary(self, text: str, done: int, finish: str, reasoning_text: str | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self.tool is not None:
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": self.tool[0], "type": "function", "function": {"name": self.tool[1], "arguments": text}}]}
        if reasoning_text is not None:
            message["reasoning_content"] = reasoning_text
        choice: dict[str, Any] = (
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            if self.chat else {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        )
        return {"id": self.rid, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": self.usage(done)}


class EmbeddingWire:
    """vLLM's (and SGLang's) /v1/embeddings response: a small deterministic vector per input."""

    __slots__ = ("rid", "model", "lengths", "cached")

    #: the vectors' dimension (kept small: the client reads the latency, not the values)
    DIM = 8

    def __init__(self, rid: str, model: str, lengths: list[int]) -> None:
        self.rid, self.model, self.lengths = rid, model, lengths
        self.cached = 0

    def unary(self, text: str, done: int, finish: str) -> dict[str, Any]:
        data = [{"object": "embedding", "index": i, "embedding": [((i + 1) * (k + 3) % 17) / 17 for k in range(self.DIM)]}
                for i in range(len(self.lengths))]
        n = sum(self.lengths)
        return {"id": self.rid, "object": "list", "created": int(time.time()), "model": self.model, "data": data,
                "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0, "prompt_tokens_details": None}}


class SGLangWire:
    """SGLang's native /generate stream (0.5.23, tokenizer_manager.py): cumulative text, and
    ``output_ids`` holding every id so far on every event (O(n²) bytes per request)."""

    __slots__ = ("rid", "prompt_tokens", "cached", "text", "arrival_ns", "n_ids", "ids_json", "timing",
                 "engine_ttft", "first_ns")

    def __init__(self, rid: str, prompt_tokens: int, arrival_ns: int, engine_ttft: bool = True) -> None:
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.cached = 0
        self.text = ""
        self.arrival_ns = arrival_ns
        #: the ids so far, kept serialised and appended to: re-encoding them every event cost
        #: the engine loop ~0.1 ms per event at 4096 tokens
        self.n_ids = 0
        self.ids_json = bytearray()
        #: per-request timings once the first token exists (SimServer.request_timing)
        self.timing: dict[str, float] | None = None
        #: the last event states the engine's TTFT (``first_token_latency``, the 0.5.23 generation)
        self.engine_ttft = engine_ttft
        #: when the first token was framed (perf_counter ns), for first_token_latency
        self.first_ns: int | None = None

    def _grow(self, done: int) -> None:
        ids = self.ids_json
        for i in range(self.n_ids, done):
            if i:
                ids += b","
            ids += str(_token_id(i)).encode()
        self.n_ids = max(self.n_ids, done)

    def _meta(self, done: int, finish: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": None if finish is None else {"type": finish, "length": done} if finish == "length"
            else {"type": finish, "matched": 128009},
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": done,
            "cached_tokens": self.cached,
        }
        if self.timing:
            meta.update(self.timing)
        if finish is not None:
            now = time.perf_counter_ns()
            meta["e2e_latency"] = (now - self.arrival_ns) / 1e9
            if self.timing and self.engine_ttft:  # req_time_stats.py convert_to_output_meta_info (API server)
                meta["first_token_latency"] = ((self.first_ns or now) - self.arrival_ns) / 1e9
        return meta

    def event(self, done: int, finish: str | None) -> dict[str, Any]:
        self._grow(done)
        return {"text": self.text, "output_ids": [_token_id(i) for i in range(done)], "meta_info": self._meta(done, finish)}

    def tokens(self, text: str, done: int, finish: str | None) -> bytes:
        if self.first_ns is None:
            self.first_ns = time.perf_counter_ns()
        self.text += text
        self._grow(done)
        # the bytes orjson would write for event(), without re-encoding every id
        return (b'data: {"text":' + _dumps(self.text) + b',"output_ids":[' + self.ids_json + b'],"meta_info":'
                + _dumps(self._meta(done, finish)) + b"}\n\n")

    def malformed(self, text: str) -> bytes:
        return b'data: {"text": ' + _dumps(self.text + text) + b', "meta_info": {"id": "' + self.rid.encode() + b"\n\n"

    def closing(self, done: int, no_done: bool) -> bytes:
        return b"" if no_done else b"data: [DONE]\n\n"

    def error(self, message: str, etype: str = "invalid_request_error", code: int = 400) -> bytes:
        """http_server.py's stream_results: the error object, then [DONE], after HTTP 200."""
        return sse({"error": {"message": message, "type": etype, "code": code, "retryable": False}}) + \
            b"data: [DONE]\n\n"

    def queue_full(self) -> bytes:
        """A request refused past ``--max-queued-requests`` (scheduler.py ``_abort_on_queued_limit``):
        its only event ends it with an abort, status 503, then [DONE]."""
        ev = self.event(0, None)
        ev["meta_info"]["finish_reason"] = {"type": "abort", "status_code": 503, "message": "The request queue is full."}
        return sse(ev) + b"data: [DONE]\n\n"

    def aborted(self, done: int) -> bytes:
        """An abort (FINISH_ABORT.to_json()) on the last event, then [DONE]."""
        ev = self.event(done, None)
        ev["meta_info"]["finish_reason"] = {"type": "abort", "message": "Abort in waiting queue",
                                            "status_code": None, "err_type": None}
        return sse(ev) + b"data: [DONE]\n\n"

    def unary(self, text: str, done: int, finish: str) -> dict[str, Any]:
        self.text = text
        return self.event(done, finish)


def _token_id(i: int) -> int:
    return 1000 + (i * 7919) % 30000


class TGIWire:
    """TGI's /generate_stream: one token per event, ``data:`` without a space, no [DONE]."""

    __slots__ = ("prompt_tokens", "details", "text", "index", "max_new_tokens", "seed")

    def __init__(self, prompt_tokens: int, details: bool, seed: int | None) -> None:
        self.prompt_tokens = prompt_tokens
        self.details = details
        self.text = ""
        self.index = 0
        self.seed = seed

    @staticmethod
    def frame(obj: Any) -> bytes:
        return b"data:" + _dumps(obj) + b"\n\n"

    def _event(self, piece: str, last: bool, finish: str | None, done: int) -> bytes:
        self.index += 1
        if last and finish == "eos_token":
            # the end-of-sequence token is streamed as a special token, left out of the text
            token: dict[str, Any] = {"id": 2, "text": "</s>", "logprob": -0.25, "special": True}
        else:
            self.text += piece
            token = {"id": tokenize(piece)[0] if piece.strip() else 0, "text": piece, "logprob": -0.25,
                     "special": False}
        ev: dict[str, Any] = {
            "index": self.index,
            "token": token,
            "generated_text": self.text if last else None,
            "details": None,
        }
        if last and self.details:
            ev["details"] = {"finish_reason": finish or "length", "generated_tokens": done, "seed": self.seed,
                             "input_length": self.prompt_tokens}
        return self.frame(ev)

    def token_list(self, pieces: list[str], done: int, finish: str | None, suppress_final: bool = False) -> bytes:
        out = b""
        n = len(pieces)
        for j, piece in enumerate(pieces):
            last = finish is not None and j == n - 1 and not suppress_final
            out += self._event(piece, last, finish, done - n + j + 1)
        return out

    def malformed(self, text: str) -> bytes:
        return b'data:{"index":' + str(self.index + 1).encode() + b',"token":{"id":' + b"\n\n"

    def closing(self, done: int, no_done: bool) -> bytes:
        return b""

    def error(self, message: str, etype: str = "generation", code: int = 500) -> bytes:
        """An InferError as an event (router/src/server.rs ``From<InferError> for Event``)."""
        return self.frame({"error": message, "error_type": etype})

    def aborted(self, done: int) -> bytes:
        """TGI has no abort: a request the backend drops ends with its generation error."""
        return self.error("Request failed during generation: request dropped", "generation")

    def unary(self, text: str, done: int, finish: str) -> dict[str, Any]:
        out: dict[str, Any] = {"generated_text": text}
        if self.details:
            out["details"] = {"finish_reason": finish, "generated_tokens": done, "seed": self.seed, "prefill": [],
                              "tokens": []}
        return out
