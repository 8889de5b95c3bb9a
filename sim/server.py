"""The embedded engine's HTTP server (vLLM-flavoured OpenAI API), paced in real time.

Tokens are written against absolute deadlines (arrival + TTFT + k·ITL), so a late
wake-up never accumulates into later tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from sim.metrics import Registry
from sim.timing import FixedTiming
from sim.tokenizer import count_tokens, output_token, tokenize

_now = time.perf_counter_ns


@dataclass(frozen=True, slots=True)
class ServerConfig:
    model: str = "sim-model"
    timing: FixedTiming = FixedTiming()
    max_model_len: int = 131072


class SimEngine:
    """State shared by the routes: counters and in-flight requests."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.running = 0
        self.metrics = Registry({"model_name": config.model, "engine": "0"})
        self._ids = itertools.count()
        self.ttft_hist = self.metrics.histogram("vllm:time_to_first_token_seconds", "Time to first token.")
        self.itl_hist = self.metrics.histogram("vllm:inter_token_latency_seconds", "Inter-token latency.")
        self.e2e_hist = self.metrics.histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency.")

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids):08x}"

    # -- routes --------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(self, request: web.Request) -> web.Response:
        m = self.config.model
        data = {"object": "list", "data": [{"id": m, "object": "model", "root": m, "max_model_len": self.config.max_model_len}]}
        return web.json_response(data)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "bench-sim"})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        text = body.get("prompt")
        if text is None and "messages" in body:
            text = "\n".join(str(m.get("content", "")) for m in body["messages"])
        tokens = tokenize(str(text or ""))
        return web.json_response({"tokens": tokens, "count": len(tokens), "max_model_len": self.config.max_model_len})

    async def prometheus(self, request: web.Request) -> web.Response:
        self.metrics.gauge("vllm:num_requests_running", "Requests running.", self.running)
        self.metrics.gauge("vllm:num_requests_waiting", "Requests waiting.", 0)
        self.metrics.gauge("vllm:kv_cache_usage_perc", "KV-cache usage (0-1).", 0.0)
        return web.Response(text=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    # -- generation ------------------------------------------------------------------------
    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = _now()
        body = await _json_body(request)
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return _error(400, "messages must be a non-empty list")
            prompt = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                return _error(400, "prompt must be a string")
        model = body.get("model", self.config.model)
        if model != self.config.model:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, "max_tokens must be a positive integer")
        prompt_tokens = count_tokens(prompt)
        if prompt_tokens + max_tokens > self.config.max_model_len:
            return _error(400, f"prompt ({prompt_tokens}) + max_tokens ({max_tokens}) exceeds max_model_len")
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        continuous = include_usage and bool(opts.get("continuous_usage_stats"))
        rid = self.next_id("chatcmpl" if chat else "cmpl")
        seed = zlib.crc32(rid.encode())
        self.running += 1
        self.metrics.inc("vllm:prompt_tokens", "Prefill tokens processed.", prompt_tokens)
        try:
            if not body.get("stream"):
                return await self._unary(rid, chat, model, seed, prompt_tokens, max_tokens, arrival)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            base: dict[str, Any] = {
                "id": rid,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()),
                "model": model,
            }

            def usage(done: int) -> dict[str, int]:
                return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + done, "completion_tokens": done}

            if chat:
                first = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
                if continuous:
                    first["usage"] = usage(0)
                await resp.write(_sse(first))
            done = 0
            last_emit = arrival
            async for k, n in self._pace(arrival, max_tokens):
                text = "".join(output_token(seed, done + j) for j in range(n))
                done += n
                finish = "length" if done >= max_tokens else None
                choice: dict[str, Any] = (
                    {"index": 0, "delta": {"content": text}, "finish_reason": finish}
                    if chat
                    else {"index": 0, "text": text, "finish_reason": finish}
                )
                chunk = {**base, "choices": [choice]}
                if continuous:
                    chunk["usage"] = usage(done)
                await resp.write(_sse(chunk))
                now = _now()
                if k == 0:
                    self.ttft_hist.observe((now - arrival) / 1e9)
                else:
                    self.itl_hist.observe((now - last_emit) / 1e9 / n)
                last_emit = now
            if include_usage:
                await resp.write(_sse({**base, "choices": [], "usage": usage(done)}))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            self._finished(arrival, done)
            return resp
        finally:
            self.running -= 1

    async def _pace(self, arrival: int, max_tokens: int) -> AsyncIterator[tuple[int, int]]:
        """Yield (chunk index, tokens in chunk) at each chunk's absolute deadline."""
        t = self.config.timing
        per = t.tokens_per_chunk
        emitted = 0
        k = 0
        while emitted < max_tokens:
            n = min(per, max_tokens - emitted)
            last_token_index = emitted + n - 1
            deadline = arrival + int((t.ttft_s + last_token_index * t.itl_s) * 1e9)
            delay = deadline - _now()
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            yield k, n
            emitted += n
            k += 1

    async def _unary(
        self, rid: str, chat: bool, model: str, seed: int, prompt_tokens: int, max_tokens: int, arrival: int
    ) -> web.Response:
        async for _ in self._pace(arrival, max_tokens):
            pass
        text = "".join(output_token(seed, j) for j in range(max_tokens))
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            if chat
            else {"index": 0, "text": text, "finish_reason": "length"}
        )
        self._finished(arrival, max_tokens)
        return web.json_response(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "model": model,
                "choices": [choice],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens, "total_tokens": prompt_tokens + max_tokens},
            }
        )

    def _finished(self, arrival: int, tokens: int) -> None:
        self.metrics.inc("vllm:generation_tokens", "Generated tokens.", tokens)
        self.metrics.inc("vllm:request_success", "Finished requests.")
        self.e2e_hist.observe((_now() - arrival) / 1e9)


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _error(status: int, message: str, etype: str = "BadRequestError") -> web.Response:
    return web.json_response({"object": "error", "message": message, "type": etype, "code": status}, status=status)


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise web.HTTPBadRequest(text='{"object":"error","message":"invalid JSON body"}', content_type="application/json")
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text='{"object":"error","message":"body must be an object"}', content_type="application/json")
    return body


def create_app(config: ServerConfig = ServerConfig()) -> web.Application:
    engine = SimEngine(config)
    app = web.Application()
    app["engine"] = engine
    app.router.add_get("/health", engine.health)
    app.router.add_get("/v1/models", engine.models)
    app.router.add_get("/version", engine.version)
    app.router.add_get("/metrics", engine.prometheus)
    app.router.add_post("/tokenize", engine.tokenize)
    app.router.add_post("/v1/completions", engine.completions)
    app.router.add_post("/v1/chat/completions", engine.chat)
    return app


@contextlib.asynccontextmanager
async def serve_in_process(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Run ``app`` on the current event loop; yields its base URL."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    server = site._server
    assert server is not None
    sock_port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://{host}:{sock_port}"
    finally:
        await runner.cleanup()
