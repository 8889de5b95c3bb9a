"""The simulated TGI as TGI 3.3 answers: ``/generate`` never streams (its body has no ``stream``
field), a stream refuses ``decoder_input_details`` and ``best_of`` > 1 in-stream, and
``tgi_batch_total_tokens`` is not exported (TGI registers it, never sets it)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from bench_llm.sim.server import ServerConfig, create_app, serve_in_process
from bench_llm.sim.timing import FixedTiming

CFG = ServerConfig(timing=FixedTiming(0.005, 0.001), flavor="tgi")


def _serve(fn: Any) -> Any:
    async def main() -> Any:
        async with serve_in_process(create_app(CFG)) as url, aiohttp.ClientSession() as s:
            return await fn(s, url)

    return asyncio.run(main())


def test_generate_ignores_stream_true_and_answers_one_json_body() -> None:
    async def fn(s: aiohttp.ClientSession, url: str) -> tuple[str, Any]:
        body = {"inputs": "a b c", "stream": True, "parameters": {"max_new_tokens": 3}}
        async with s.post(url + "/generate", json=body) as resp:
            return resp.headers["Content-Type"], await resp.json()

    ctype, obj = _serve(fn)
    assert ctype.startswith("application/json") and isinstance(obj["generated_text"], str)


def test_a_stream_refuses_decoder_input_details_and_best_of() -> None:
    async def fn(s: aiohttp.ClientSession, url: str) -> list[tuple[int, str]]:
        out = []
        for extra in ({"decoder_input_details": True}, {"best_of": 2}):
            body = {"inputs": "a b c", "parameters": {"max_new_tokens": 3, **extra}}
            async with s.post(url + "/generate_stream", json=body) as resp:
                out.append((resp.status, (await resp.read()).decode()))
        return out

    (s1, b1), (s2, b2) = _serve(fn)
    assert s1 == s2 == 200  # TGI validates inside the stream
    assert "`decoder_input_details` == true is not supported when streaming tokens" in b1 and '"validation"' in b1
    assert "`best_of` != 1 is not supported when streaming tokens" in b2


def test_tgi_batch_total_tokens_is_not_exported() -> None:
    async def fn(s: aiohttp.ClientSession, url: str) -> str:
        async with s.get(url + "/metrics") as resp:
            return await resp.text()

    text = _serve(fn)
    assert "tgi_queue_size" in text and "tgi_batch_total_tokens" not in text
