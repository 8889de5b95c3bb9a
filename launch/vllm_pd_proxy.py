"""bench's prefill/decode proxy for vLLM disaggregated serving.

vLLM (0.32, docs/features/nixl_connector_usage.md) serves P/D as two groups of ordinary
``vllm serve`` instances, each with a KV connector (``--kv-transfer-config``), and leaves
the front to a proxy it ships only as a test script, not in the package. This is bench's
own: one client request becomes

1. a prefill request to a prefill instance: the client's body with one output token
   (``max_tokens``, and ``max_completion_tokens`` on the chat route), not streamed, no
   ``min_tokens``/``stream_options`` (which vLLM refuses then), and
   ``kv_transfer_params = {"do_remote_decode": true, ...}``, so the prefill instance keeps
   the prompt's KV blocks for a decode instance to read;
2. a decode request to a decode instance: the client's body unchanged but for the
   ``kv_transfer_params`` the prefill answer returned (the NixlConnector's
   ``do_remote_prefill``, ``remote_engine_id``, ``remote_block_ids``, ``remote_host``,
   ``remote_port``, ...: ``nixl/pull_scheduler.py`` ``request_finished``), whose answer (a
   stream or not) is passed to the client byte for byte.

Each pool is used in turn (round robin). A prefill error is the client's answer, as the
engine gave it. ``GET /health`` is 200 when every instance's is; ``POST
/reset_prefix_cache`` goes to every instance; any other route (``/version``, ``/v1/models``,
``/metrics``, ``/tokenize``) is answered by the first decode instance.

Run: ``python -m launch.vllm_pd_proxy --port P --prefill URL [--prefill URL] --decode URL``.
It binds 127.0.0.1 unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

#: The ``kv_transfer_params`` of a prefill request: produce the KV for a remote decode.
PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
#: Fields a one-token, non-streamed prefill request must not carry (vLLM refuses
#: ``min_tokens`` above ``max_tokens`` and ``stream_options`` without ``stream``).
_DROPPED_FOR_PREFILL = ("stream", "stream_options", "min_tokens")
GENERATE_ROUTES = ("/v1/completions", "/v1/chat/completions")
#: client headers passed on to both instances (``vllm serve --api-key`` wants the bearer token)
_PASSED_HEADERS = ("Authorization", "X-Request-Id")
_HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"})


def prefill_body(body: dict[str, Any], route: str) -> dict[str, Any]:
    """The prefill instance's request for the client's ``body`` on ``route``."""
    out = {k: v for k, v in body.items() if k not in _DROPPED_FOR_PREFILL}
    out["max_tokens"] = 1
    if route == "/v1/chat/completions":
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    return out


def decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    """The decode instance's request: the client's body with the prefill answer's KV hand-off."""
    return {**body, "kv_transfer_params": kv_transfer_params}


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "proxy_error", "code": status}}, status=status)


def _copy_headers(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP_HEADERS}


class PDProxy:
    """The proxy's state: the two pools, their round-robin cursors and one client session."""

    def __init__(self, prefill: Sequence[str], decode: Sequence[str]) -> None:
        if not prefill or not decode:
            raise ValueError("the proxy needs at least one prefill and one decode instance")
        self.prefill = [u.rstrip("/") for u in prefill]
        self.decode = [u.rstrip("/") for u in decode]
        self._next_prefill: Iterator[str] = itertools.cycle(self.prefill)
        self._next_decode: Iterator[str] = itertools.cycle(self.decode)
        self._session: ClientSession | None = None
        #: prefill answers without kv_transfer_params (the decode instance then prefilled itself)
        self.missing_kv_params = 0

    @property
    def session(self) -> ClientSession:
        if self._session is None:
            # no pool limit (the load generator decides the concurrency); no total timeout
            # (a long generation is not an error); proxies from the environment ignored
            self._session = ClientSession(
                connector=TCPConnector(limit=0), timeout=ClientTimeout(total=None, sock_connect=30)
            )
        return self._session

    async def close(self, _app: web.Application | None = None) -> None:
        if self._session is not None:
            await self._session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for route in GENERATE_ROUTES:
            app.router.add_post(route, self.generate)
        app.router.add_get("/health", self.health)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        app.on_cleanup.append(self.close)
        return app

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body is not a JSON object")
        route = request.path
        headers = {h: request.headers[h] for h in _PASSED_HEADERS if h in request.headers}
        prefill_url = next(self._next_prefill) + route
        try:
            async with self.session.post(prefill_url, json=prefill_body(body, route), headers=headers) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    return web.Response(status=resp.status, body=raw, headers=_copy_headers(resp.headers))
            answer = json.loads(raw)
        except (ClientError, TimeoutError) as exc:
            return _error(502, f"prefill instance {prefill_url}: {exc!r}")
        except json.JSONDecodeError:
            return _error(502, f"prefill instance {prefill_url}: the answer is not JSON")
        kv = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if kv is None:
            self.missing_kv_params += 1
            if self.missing_kv_params == 1:
                print(f"warning: {prefill_url} returned no kv_transfer_params: is its KV connector set?",
                      file=sys.stderr, flush=True)  # fmt: skip
        decode_url = next(self._next_decode) + route
        out: web.StreamResponse | None = None
        try:
            async with self.session.post(decode_url, json=decode_body(body, kv), headers=headers) as resp:
                out = web.StreamResponse(status=resp.status, headers=_copy_headers(resp.headers))
                await out.prepare(request)
                async for chunk in resp.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        except (ClientError, TimeoutError) as exc:
            if out is None or not out.prepared:
                return _error(502, f"decode instance {decode_url}: {exc!r}")
            raise  # the client's stream was already started: it ends early, as the engine's would

    async def health(self, _request: web.Request) -> web.Response:
        for base in (*self.prefill, *self.decode):
            try:
                async with self.session.get(base + "/health", timeout=ClientTimeout(total=10)) as resp:
                    if resp.status != 200:
                        return _error(503, f"{base}/health answered {resp.status}")
            except (ClientError, TimeoutError) as exc:
                return _error(503, f"{base}/health: {exc!r}")
        return web.Response(status=200)

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        statuses = []
        for base in (*self.prefill, *self.decode):
            try:
                async with self.session.post(base + "/reset_prefix_cache" + _query(request)) as resp:
                    statuses.append(resp.status)
            except (ClientError, TimeoutError):
                statuses.append(502)
        worst = max(statuses)
        return web.Response(status=worst if worst >= 400 else 200)

    async def forward(self, request: web.Request) -> web.Response:
        url = self.decode[0] + request.path + _query(request)
        try:
            async with self.session.request(request.method, url, data=await request.read(),
                                            headers={"Content-Type": request.content_type}) as resp:  # fmt: skip
                return web.Response(status=resp.status, body=await resp.read(), headers=_copy_headers(resp.headers))
        except (ClientError, TimeoutError) as exc:
            return _error(502, f"decode instance {url}: {exc!r}")


def _query(request: web.Request) -> str:
    return f"?{request.query_string}" if request.query_string else ""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m launch.vllm_pd_proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefill", action="append", required=True, help="a prefill instance's base URL")
    parser.add_argument("--decode", action="append", required=True, help="a decode instance's base URL")
    args = parser.parse_args(argv)
    proxy = PDProxy(args.prefill, args.decode)
    # a stopped cell stops at once: open keep-alive connections do not hold the shutdown
    web.run_app(proxy.app(), host=args.host, port=args.port, print=None, access_log=None, shutdown_timeout=1.0)


if __name__ == "__main__":
    main()
