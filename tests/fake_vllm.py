"""A stand-in for one ``vllm serve`` instance of a prefill/decode cell, for the P/D proxy tests.

It speaks the NixlConnector's hand-off as vLLM 0.32 does (nixl/pull_scheduler.py
``request_finished``): a request with ``kv_transfer_params.do_remote_decode`` is a prefill
and answers one non-streamed completion whose ``kv_transfer_params`` name this instance
(``remote_port`` = its ``VLLM_NIXL_SIDE_CHANNEL_PORT``); any other request is a decode and
streams ``max_tokens`` chunks (with vLLM's cumulative ``usage``) whose text says which
prefill instance's KV it was given (``kv<remote_port>``, or ``nokv``; also printed, one line per
decode). Every body it receives is kept in ``received``.

In-process: ``FakeVllm(side_port).app()``. As a program it takes vLLM's argv
(``serve MODEL --host H --port P ...``) and ignores the flags it does not know.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from aiohttp import web


class FakeVllm:
    def __init__(self, side_port: int, model: str = "m") -> None:
        self.side_port = side_port
        self.model = model
        self.received: list[dict[str, Any]] = []
        self.authorization: list[str | None] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/reset_prefix_cache", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        return app

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0-fake"})

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": self.model}]})

    async def metrics(self, _request: web.Request) -> web.Response:
        text = f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{side=\"{self.side_port}\"}} 0\n"
        return web.Response(text=text, content_type="text/plain")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        self.authorization.append(request.headers.get("Authorization"))
        params = body.get("kv_transfer_params") or {}
        if params.get("do_remote_decode"):
            if body.get("stream") or body.get("max_tokens") != 1 or "min_tokens" in body:
                return web.json_response({"error": {"message": "a prefill must be one unstreamed token"}}, status=400)
            return web.json_response({
                "id": "cmpl-prefill", "object": "text_completion", "model": self.model,
                "choices": [{"index": 0, "text": "p", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5},
                "kv_transfer_params": {
                    "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2]],
                    "remote_engine_id": f"engine-{self.side_port}", "remote_request_id": "cmpl-prefill-0",
                    "remote_host": "127.0.0.1", "remote_port": self.side_port, "tp_size": 1,
                },
            })  # fmt: skip
        tag = f"kv{params['remote_port']}" if params.get("do_remote_prefill") else "nokv"
        print(f"decode {tag}", flush=True)  # the launched instance's log shows each hand-off
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        n = int(body.get("max_tokens", 1))
        for i in range(n):
            chunk = {"id": "cmpl-decode", "choices": [{"index": 0, "text": f"{tag}.{i} ",
                                                       "finish_reason": "length" if i == n - 1 else None}],
                     "usage": {"prompt_tokens": 4, "completion_tokens": i + 1, "total_tokens": 5 + i}}  # fmt: skip
            await out.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out


def main(argv: list[str]) -> None:
    args = argv[1:] if argv and argv[0] == "serve" else argv
    model = args[0] if args else "m"
    host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
    port = int(args[args.index("--port") + 1])
    side_port = int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
    web.run_app(FakeVllm(side_port, model).app(), host=host, port=port, print=None, access_log=None)


if __name__ == "__main__":
    main(sys.argv[1:])
