"""The simulated engine's cache-reset routes empty the prefix cache (what sweeps call between loads)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from bench_llm.sim.options import ModelTiming
from bench_llm.sim.server import ServerConfig, create_app, serve_in_process

PROMPT = " ".join(f"w{i}" for i in range(512))


async def _cached_tokens(session: aiohttp.ClientSession, url: str, model: str) -> int:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 2, "stream": False}
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        data = await resp.json()
    details = data["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


@pytest.mark.parametrize(("flavor", "route"), [("vllm", "/reset_prefix_cache"), ("sglang", "/flush_cache")])
def test_reset_route_empties_the_prefix_cache(flavor: str, route: str) -> None:
    t = ModelTiming("llama-3.1-8b", "h100")
    cfg = ServerConfig(model="llama-3.1-8b", model_timing=t, flavor=flavor)

    async def main() -> tuple[int, int, int]:
        async with serve_in_process(create_app(cfg)) as url, aiohttp.ClientSession() as s:
            first = await _cached_tokens(s, url, cfg.model)
            warm = await _cached_tokens(s, url, cfg.model)
            async with s.post(url + route) as resp:
                assert resp.status == 200
            cold = await _cached_tokens(s, url, cfg.model)
            return first, warm, cold

    first, warm, cold = asyncio.run(main())
    assert first == 0 and warm >= 496 and cold == 0, (first, warm, cold)


def test_sglang_refuses_to_flush_while_requests_are_pending() -> None:
    # SGLang's /flush_cache answers 400 while requests run or wait (scheduler.py flush_cache)
    cfg = ServerConfig(model="llama-3.1-8b", model_timing=ModelTiming("llama-3.1-8b", "h100"), flavor="sglang")

    async def main() -> tuple[int, int]:
        async with serve_in_process(create_app(cfg)) as url, aiohttp.ClientSession() as s:
            body = {"text": "a b c", "stream": True, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
            async with s.post(url + "/generate", json=body) as gen:
                await gen.content.readline()  # the request is running
                async with s.post(url + "/flush_cache") as resp:  # no timeout: no waiting for idle
                    busy = resp.status
                await gen.read()
            async with s.post(url + "/flush_cache") as resp:
                idle = resp.status
            return busy, idle

    assert asyncio.run(main()) == (400, 200)
