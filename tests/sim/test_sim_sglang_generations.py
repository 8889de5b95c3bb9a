"""The simulated SGLang speaks the release it is told to imitate (``--engine-version``; the
0.5.8, 0.5.10 and 0.5.23 generations: docs/engines.md, "Per-request timings"), and both
simulated engines turn requests away past their admission limits as the real ones do
(vLLM --max-num-queued-reqs: HTTP 503; SGLang --max-queued-requests: an abort, status 503),
which bench records as admission rejections and counts as saturation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench_llm.adapters.sglang import SGLangAdapter
from bench_llm.analysis.capacity_saturation import admission_saturation
from bench_llm.analysis.load import load_run
from bench_llm.analysis.ttft_split import request_parts
from bench_llm.results.reader import read_requests
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.server import ServerConfig, create_app, serve_in_process
from tests.sim_helpers import run_against, schedule

MODEL = "llama-3.1-8b"


def _cfg(version: str | None = None, **kw: Any) -> ServerConfig:
    return ServerConfig(model=MODEL, model_timing=ModelTiming(MODEL, "h100", **kw.pop("timing", {})), flavor="sglang",
                        engine_version=version, **kw)  # fmt: skip


async def _last_event(s: aiohttp.ClientSession, url: str, sp: dict[str, Any] | None = None) -> tuple[int, Any]:
    body = {"text": "a b c d", "stream": True, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True, **(sp or {})}}
    async with s.post(url + "/generate", json=body) as resp:
        if resp.status != 200:
            return resp.status, await resp.json()
        events = [line[6:] for line in (await resp.read()).decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return 200, json.loads(events[-2])


def _serve(cfg: ServerConfig, fn: Any) -> Any:
    async def main() -> Any:
        async with serve_in_process(create_app(cfg)) as url, aiohttp.ClientSession() as s:
            return await fn(s, url)

    return asyncio.run(main())


@pytest.mark.parametrize("version, keys, absent", [
    ("0.5.8", {"queue_time", "prefill_launch_delay", "prefill_launch_latency"}, {"forward_entry_time", "first_token_latency"}),
    ("0.5.10", {"queue_time", "prefill_waiting_latency", "prefill_launch_latency", "forward_entry_time",
                "prefill_finished_time"}, {"prefill_launch_delay", "first_token_latency"}),
    (None, {"queue_time", "forward_entry_time", "prefill_finished_time", "first_token_latency"},
     {"prefill_launch_delay", "prefill_waiting_latency", "prefill_launch_latency"}),
])  # fmt: skip
def test_each_generation_reports_its_own_timing_keys_and_version(version: str | None, keys: set[str],
                                                                  absent: set[str]) -> None:  # fmt: skip
    async def fn(s: aiohttp.ClientSession, url: str) -> tuple[dict[str, Any], str]:
        status, last = await _last_event(s, url)
        async with s.get(url + "/server_info") as resp:
            info = await resp.json()
        return last["meta_info"], info["version"]

    meta, reported = _serve(_cfg(version), fn)
    assert keys <= set(meta) and not absent & set(meta)
    assert reported.startswith(version or "0.5.23") and reported.endswith("bench-sim")
    if "forward_entry_time" in meta:  # wall-clock stamps, one clock: prefill is their difference
        assert 0 < meta["prefill_finished_time"] - meta["forward_entry_time"] < 1.0
        assert abs(meta["forward_entry_time"] - __import__("time").time()) < 60
    if "first_token_latency" in meta:
        assert 0 < meta["first_token_latency"] <= meta["e2e_latency"]


def test_the_simulated_0_5_23_split_is_read_by_its_stamps_and_sums_to_the_client_ttft(tmp_path: Path) -> None:
    rows = run_against(_cfg(), schedule(12, input_tokens=512, output_tokens=4), tmp_path,
                       adapter=SGLangAdapter(model=MODEL), engine="sglang")  # fmt: skip
    assert all(r["ok"] for r in rows)
    stated: list[str] = []
    parts = request_parts(read_requests(tmp_path / "run"), None, None, stated)
    assert len(parts) == 12 and (parts["source"] == "response").all() and "0.5.12+" in stated[0]
    assert (parts["prefill_ms"] > 0).all() and (parts["queue_ms"] >= 0).all()
    total = parts[["queue_ms", "prefill_ms", "emission_ms", "transit_ms"]].sum(axis=1)
    assert ((total - parts["ttft_ms"]).abs() < 1e-6).all()  # with the engine's TTFT nothing is left to `other`


def test_0_5_22_on_refuses_unknown_sampling_params_and_0_5_8_ignores_them() -> None:
    async def fn(s: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
        return await _last_event(s, url, {"best_of": 2})

    status, body = _serve(_cfg("0.5.23"), fn)
    assert status == 400 and body["error"].startswith("unknown field `best_of`, expected one of `max_new_tokens`")
    assert _serve(_cfg("0.5.21"), fn)[0] == 200 and _serve(_cfg("0.5.8"), fn)[0] == 200


def test_flush_cache_answers_get_and_post_and_waits_for_idle_with_a_timeout_from_0_5_10() -> None:
    async def fn(s: aiohttp.ClientSession, url: str) -> list[int]:
        out = []
        body = {"text": "a b c", "stream": True, "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
        async with s.post(url + "/generate", json=body) as gen:
            await gen.content.readline()  # the request is running
            async with s.post(url + "/flush_cache") as resp:
                out.append(resp.status)  # refused while a request is pending
            async with s.get(url + "/flush_cache?timeout=30") as resp:
                out.append(resp.status)  # 0.5.10 on: waits for idle, then flushes
            await gen.read()
        return out

    assert _serve(_cfg("0.5.23"), fn) == [400, 200]
    assert _serve(_cfg("0.5.8"), fn) == [400, 400]  # before 0.5.10 the timeout is ignored: no waiting


def test_sglang_past_max_queued_requests_aborts_with_503_counted_as_admission_rejection(tmp_path: Path) -> None:
    cfg = _cfg(max_queued_requests=2, timing={"max_num_seqs": 1})
    rows = run_against(cfg, schedule(16, input_tokens=64, output_tokens=8, concurrency=8), tmp_path,
                       adapter=SGLangAdapter(model=MODEL), engine="sglang")  # fmt: skip
    rejected = [r for r in rows if not r["ok"]]
    assert rejected and all(r["error_type"] == "abort_503" and "queue is full" in r["error_message"] for r in rejected)
    assert len(rejected) < len(rows)  # the admitted ones complete
    sat = admission_saturation(load_run(tmp_path / "run"))
    assert sat.saturated and f"{len(rejected)} of 16 requests rejected at admission ({len(rejected)} abort_503" in str(sat)


def test_vllm_past_max_num_queued_reqs_answers_503_counted_as_admission_rejection(tmp_path: Path) -> None:
    cfg = ServerConfig(model=MODEL, model_timing=ModelTiming(MODEL, "h100", max_num_seqs=1), max_num_queued_reqs=2)
    rows = run_against(cfg, schedule(16, input_tokens=64, output_tokens=8, concurrency=8), tmp_path)
    rejected = [r for r in rows if not r["ok"]]
    assert rejected and all(r["error_type"] == "http_503" and r["http_status"] == 503 for r in rejected)
    sat = admission_saturation(load_run(tmp_path / "run"))
    assert sat.saturated and "http_503: HTTP 503 (vLLM past --max-num-queued-reqs" in str(sat)


def test_sglang_openai_routes_past_the_limit_end_the_stream_with_a_503_chunk(tmp_path: Path) -> None:
    from bench_llm.adapters.sglang import SGLangOpenAIAdapter

    cfg = _cfg(max_queued_requests=2, timing={"max_num_seqs": 1})
    rows = run_against(cfg, schedule(16, input_tokens=64, output_tokens=8, concurrency=8), tmp_path,
                       adapter=SGLangOpenAIAdapter(model=MODEL), engine="sglang-openai")  # fmt: skip
    rejected = [r for r in rows if not r["ok"]]
    # HTTP 200, then {"error": {"type": "SERVICE_UNAVAILABLE", "code": 503}} (serving_completions.py)
    assert rejected and all(r["error_type"] == "abort_503" and r["http_status"] == 200 for r in rejected)
    assert admission_saturation(load_run(tmp_path / "run")).saturated
