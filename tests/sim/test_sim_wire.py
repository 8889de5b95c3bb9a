"""Each flavour's wire surface, byte-level details and bench's own clients against it."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.adapters.sglang import SGLangAdapter
from bench_llm.adapters.tgi import TGIAdapter
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.server import ServerConfig, create_app, serve_in_process
from tests.sim_helpers import run_against, schedule, spaced

MODEL = ModelTiming("llama-3.1-8b", "h100")


def cfg(flavor: str, **kw: Any) -> ServerConfig:
    return ServerConfig(model="llama-3.1-8b", flavor=flavor, model_timing=MODEL, **kw)


async def _calls(config: ServerConfig, calls: list[tuple[str, str, Any]]) -> list[tuple[int, bytes, Any]]:
    out = []
    async with serve_in_process(create_app(config)) as url, aiohttp.ClientSession() as s:
        for method, path, body in calls:
            async with s.request(method, url + path, json=body) as r:
                out.append((r.status, await r.read(), r.headers))
    return out


def calls(config: ServerConfig, *items: tuple[str, str, Any]) -> list[tuple[int, bytes, Any]]:
    return asyncio.run(_calls(config, list(items)))


def events(body: bytes, prefix: bytes = b"data: ") -> list[bytes]:
    return [e[len(prefix):] for e in body.split(b"\n\n") if e]


def test_vllm_completions_chat_usage_and_endpoints() -> None:
    prompt = " ".join(["word"] * 40)
    res = calls(
        cfg("vllm"),
        ("POST", "/v1/completions", {"model": "llama-3.1-8b", "prompt": prompt, "max_tokens": 5, "stream": True,
                                     "ignore_eos": True, "min_tokens": 5,
                                     "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
        ("POST", "/v1/chat/completions", {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": prompt}],
                                          "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}),
        ("POST", "/tokenize", {"model": "llama-3.1-8b", "prompt": prompt}),
        ("GET", "/v1/models", None),
        ("GET", "/version", None),
        ("GET", "/health", None),
        ("POST", "/v1/completions", {"model": "other", "prompt": "x", "max_tokens": 2}),
        ("POST", "/v1/completions", {"model": "llama-3.1-8b", "prompt": "x", "max_tokens": 10**7}),
        ("POST", "/v1/completions", {"model": "llama-3.1-8b", "prompt": prompt, "max_tokens": 4}),
        ("GET", "/metrics", None),
    )
    status, body, headers = res[0]
    ev = events(body)
    assert status == 200 and ev[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in ev[:-1]]
    assert [c["usage"]["completion_tokens"] for c in chunks[:-1]] == [1, 2, 3, 4, 5]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * 4 + ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 40
    assert all(c["id"] == headers["x-request-id"] and c["object"] == "text_completion" for c in chunks)
    chat = [orjson.loads(e) for e in events(res[1][1])[:-1]]
    assert chat[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "usage" not in chat[1]  # usage only at the end without continuous_usage_stats
    assert chat[-1]["usage"]["completion_tokens"] == 3 and chat[-2]["choices"][0]["finish_reason"] == "length"
    tok = orjson.loads(res[2][1])
    assert tok["count"] == 40 and len(tok["tokens"]) == 40
    models = orjson.loads(res[3][1])
    assert models["data"][0]["id"] == "llama-3.1-8b" and models["data"][0]["max_model_len"] > 8192
    assert "version" in orjson.loads(res[4][1]) and res[5][0] == 200
    assert res[6][0] == 404 and res[7][0] == 400
    unary = orjson.loads(res[8][1])
    assert unary["usage"]["completion_tokens"] == 4 and unary["choices"][0]["finish_reason"] == "length"
    page = res[9][1].decode()
    for name in ("vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
                 "vllm:prefix_cache_queries_total{", "vllm:prefix_cache_hits_total{", "vllm:num_preemptions_total{",
                 "vllm:time_to_first_token_seconds_bucket{", "vllm:inter_token_latency_seconds_bucket{",
                 "vllm:request_queue_time_seconds_bucket{", "vllm:request_prefill_time_seconds_bucket{",
                 "vllm:request_decode_time_seconds_bucket{", "vllm:e2e_request_latency_seconds_bucket{",
                 'vllm:request_success_total{model_name="llama-3.1-8b",engine="0",finished_reason="length"} 3'):
        assert name in page, name


def test_prefix_cache_hits_reach_usage_and_metrics(tmp_path: Path) -> None:
    shared = " ".join(f"w{i}" for i in range(600))
    prompts = [shared + f" tail{i} more words" for i in range(3)]
    rows = run_against(cfg("vllm"), spaced(prompts, 4, gap_ms=150), tmp_path / "wire")
    assert all(r["ok"] for r in rows)
    cached = [r["cached_tokens"] for r in rows]
    assert cached[0] == 0 and cached[1] >= 576 and cached[2] >= 576, cached
    # the engine's TTFT shrinks with the hit (prefill skipped). Read in virtual time (the same
    # scheduler and cost model, no wall clock): the client's real-time TTFT of a ~20 ms prefill
    # is at the mercy of the host (a loaded one gave the hit 74 ms against 35 ms for the miss).
    from bench_llm.analysis.load import load_run
    from bench_llm.bench.execute import RunConfig
    from bench_llm.bench.virtual import execute_virtual, virtual_engine
    from bench_llm.launch.config import ParallelConfig

    run = RunConfig(out=tmp_path / "virtual", url="virtual:", engine="sim", model="llama-3.1-8b",
                    schedule=spaced(prompts, 4, gap_ms=150))  # fmt: skip
    engine = virtual_engine("llama-3.1-8b", "h100", ParallelConfig())
    modelled = sorted(load_run(execute_virtual(run, engine).run_dir).requests.to_pylist(), key=lambda r: r["request_id"])
    hits = [r["cached_tokens"] for r in modelled]
    assert hits[0] == 0 and hits[1] == hits[2] >= 576, hits  # the same hits as the served engine's
    ttft = [r["first_token_ns"] - r["send_ns"] for r in modelled]
    assert ttft[1] == ttft[2] < ttft[0], ttft  # both hits skip the same prefill; the miss pays it


def test_sglang_generate_cumulative_text_and_meta_info() -> None:
    res = calls(
        cfg("sglang"),
        ("POST", "/generate", {"text": "one two three four", "stream": True,
                               "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}),
        ("POST", "/generate", {"text": "one two", "sampling_params": {"max_new_tokens": 2}}),
        ("GET", "/health_generate", None),
        ("GET", "/server_info", None),
        ("GET", "/metrics", None),
    )
    ev = events(res[0][1])
    assert ev[-1] == b"[DONE]"
    objs = [orjson.loads(e) for e in ev[:-1]]
    texts = [o["text"] for o in objs]
    assert all(b.startswith(a) and len(b) > len(a) for a, b in zip(texts, texts[1:]))  # cumulative
    assert [o["meta_info"]["completion_tokens"] for o in objs] == [1, 2, 3, 4]
    # every event repeats all output ids so far (SGLang 0.5.x without --incremental-streaming-output)
    assert [len(o["output_ids"]) for o in objs] == [1, 2, 3, 4]
    assert all(b["output_ids"][: len(a["output_ids"])] == a["output_ids"] for a, b in zip(objs, objs[1:]))
    assert [o["meta_info"]["finish_reason"] for o in objs[:-1]] == [None] * 3
    assert objs[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert objs[-1]["meta_info"]["prompt_tokens"] == 4 and objs[-1]["meta_info"]["cached_tokens"] == 0
    unary = orjson.loads(res[1][1])
    assert unary["meta_info"]["completion_tokens"] == 2
    assert res[2][0] == 200
    info = orjson.loads(res[3][1])
    assert info["tp_size"] == 1 and info["max_total_num_tokens"] > 0
    page = res[4][1].decode()
    for name in ("sglang:num_running_reqs{", "sglang:num_queue_reqs{", "sglang:token_usage{", "sglang:cache_hit_rate{",
                 "sglang:prompt_tokens_total{", "sglang:generation_tokens_total{", "sglang:cached_tokens_total{",
                 "sglang:time_to_first_token_seconds_bucket{", "sglang:inter_token_latency_seconds_bucket{",
                 "sglang:e2e_request_latency_seconds_bucket{", "sglang:queue_time_seconds_bucket{",
                 "sglang:num_requests_total{", "sglang:request_time_per_output_token_seconds_bucket{",
                 "sglang:num_retracted_requests_total{", "sglang:num_retracted_reqs{"):
        assert name in page, name
    # 0.5.23's label sets: the scheduler's series per rank, the tokenizer's per engine type
    assert 'sglang:num_queue_reqs{model_name="llama-3.1-8b",engine_type="unified",tp_rank="0",pp_rank="0",' \
           'moe_ep_rank="0"}' in page
    assert 'sglang:num_requests_total{model_name="llama-3.1-8b",engine_type="unified"}' in page
    assert "sglang:time_per_output_token_seconds" not in page  # in no release 0.4.10-0.5.23


def test_tgi_generate_stream_framing_details_and_errors() -> None:
    res = calls(
        cfg("tgi"),
        ("POST", "/generate_stream", {"inputs": "one two three", "parameters": {"max_new_tokens": 3, "details": True}}),
        ("POST", "/generate_stream", {"inputs": "one two three", "parameters": {"max_new_tokens": 2}}),
        ("POST", "/generate_stream", {"inputs": "", "parameters": {"max_new_tokens": 2}}),
        ("POST", "/generate", {"inputs": "a b", "parameters": {"max_new_tokens": 2}}),
        ("GET", "/info", None),
        ("GET", "/health", None),
        ("GET", "/metrics", None),
    )
    body = res[0][1]
    assert b"data: " not in body and b"[DONE]" not in body and body.startswith(b"data:{")
    objs = [orjson.loads(e) for e in events(body, b"data:")]
    assert [o["index"] for o in objs] == [1, 2, 3]
    assert all(isinstance(o["token"]["text"], str) and o["token"]["special"] is False for o in objs)
    assert [o["generated_text"] for o in objs[:-1]] == [None, None] and objs[-1]["generated_text"]
    assert [o["details"] for o in objs[:-1]] == [None, None]
    assert objs[-1]["details"]["finish_reason"] == "length" and objs[-1]["details"]["generated_tokens"] == 3
    plain = [orjson.loads(e) for e in events(res[1][1], b"data:")]
    assert plain[-1]["details"] is None and plain[-1]["generated_text"]
    # a validation error of a stream comes inside it, after HTTP 200 (server.rs generate_stream)
    assert res[2][0] == 200 and events(res[2][1], b"data:") == [
        b'{"error":"Input validation error: `inputs` cannot be empty","error_type":"validation"}']
    assert orjson.loads(res[3][1])["generated_text"]
    info = orjson.loads(res[4][1])
    assert info["model_id"] == "llama-3.1-8b" and info["max_total_tokens"] > 0
    assert info["max_concurrent_requests"] == 128 and "num_shard" not in info  # router/src/lib.rs Info
    assert res[5][0] == 200
    page = res[6][1].decode()
    for name in ("tgi_queue_size ", "tgi_batch_current_size ", "tgi_request_count ", "tgi_request_success ",
                 "tgi_request_duration_bucket", "tgi_request_queue_duration_bucket",
                 "tgi_request_mean_time_per_token_duration_bucket", "tgi_request_generated_tokens_bucket",
                 'tgi_batch_forward_duration_bucket{method="prefill",'):
        assert name in page, name


def test_bench_clients_against_each_flavour(tmp_path: Path) -> None:
    for flavor, adapter in (
        ("vllm", OpenAIAdapter(model="llama-3.1-8b")),
        ("vllm", OpenAIAdapter(model="llama-3.1-8b", api="chat")),
        ("sglang", SGLangAdapter(model="llama-3.1-8b")),
        ("tgi", TGIAdapter(model="llama-3.1-8b")),
    ):
        d = tmp_path / f"{flavor}-{id(adapter)}"
        d.mkdir()
        rows = run_against(cfg(flavor), schedule(6, input_tokens=64, output_tokens=12, concurrency=3), d, adapter)
        assert all(r["ok"] for r in rows), [(r["error_type"], r["error_message"]) for r in rows]
        assert all(r["output_tokens"] == 12 for r in rows)
        assert all(r["prompt_tokens"] in (64, None) for r in rows)


def test_client_disconnect_frees_the_request() -> None:
    async def main() -> tuple[str, str]:
        async with serve_in_process(create_app(cfg("vllm"))) as url:
            async with aiohttp.ClientSession() as s:
                r = await s.post(url + "/v1/completions", json={"model": "llama-3.1-8b", "prompt": "a b c",
                                                                "max_tokens": 3000, "stream": True})
                await r.content.readline()
                async with s.get(url + "/metrics") as m:
                    during = await m.text()
                r.close()
                # poll until the engine has freed it (bounded), instead of a fixed sleep
                line = 'vllm:num_requests_running{model_name="llama-3.1-8b",engine="0"} 0'
                deadline = asyncio.get_running_loop().time() + 30
                after = ""
                while line not in after and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.02)
                    async with s.get(url + "/metrics") as m:
                        after = await m.text()
        return during, after

    during, after = asyncio.run(main())
    line = 'vllm:num_requests_running{model_name="llama-3.1-8b",engine="0"}'
    assert f"{line} 1" in during and f"{line} 0" in after


def test_natural_stop_ends_unforced_requests_early_and_says_so(tmp_path: Path) -> None:
    sched = schedule(12, input_tokens=16, output_tokens=60, concurrency=6)
    c = ServerConfig(model="llama-3.1-8b", flavor="tgi", model_timing=MODEL, natural_stop_mean=10.0)
    tgi = run_against(c, sched, tmp_path / "tgi", TGIAdapter(model="llama-3.1-8b"))
    assert all(r["ok"] for r in tgi)
    short = [r for r in tgi if r["output_tokens"] < 60]
    assert len(short) >= 6 and all(r["finish_reason"] == "eos_token" for r in short)
    # vLLM with ignore_eos + min_tokens (bench's OpenAI adapter asks for them): exact lengths
    c2 = dataclasses.replace(c, flavor="vllm")
    vllm = run_against(c2, sched, tmp_path / "vllm")
    assert all(r["ok"] and r["output_tokens"] == 60 and r["finish_reason"] == "length" for r in vllm)
    # without them the same server stops early with finish_reason "stop"
    free = run_against(c2, sched, tmp_path / "free", OpenAIAdapter(model="llama-3.1-8b", force_length_fields=False))
    assert any(r["output_tokens"] < 60 and r["finish_reason"] == "stop" for r in free)


def test_tgi_validation_in_the_stream_and_body_errors_as_422() -> None:
    res = calls(
        cfg("tgi"),
        ("POST", "/generate_stream", {"inputs": "a b", "parameters": {"max_new_tokens": 0}}),
        ("POST", "/generate_stream", {"inputs": "a b", "parameters": {"max_new_tokens": -1}}),
        ("POST", "/generate_stream", {"inputs": "a b", "parameters": {"temperature": 0}}),
        ("POST", "/generate", {"inputs": "a b", "parameters": {"max_new_tokens": 0}}),
    )
    # validation.rs errors come inside an HTTP 200 stream; a body that does not deserialise
    # (max_new_tokens is a u32) is axum's 422; /generate without a stream answers 422
    assert res[0][0] == 200 and b"`max_new_tokens` must be strictly positive" in res[0][1]
    assert res[1][0] == 422
    assert res[2][0] == 200 and b"`temperature` must be strictly positive" in res[2][1]
    assert res[3][0] == 422 and orjson.loads(res[3][1])["error_type"] == "validation"


def test_vllm_counters_exist_from_the_start() -> None:
    """vLLM creates its token and request counters at 0 when it starts (every finished_reason), so a
    scrape before the first request shows them and the first request's tokens are an increase."""
    from bench_llm.loadgen.scrape import parse_metrics

    before, _, after = calls(
        cfg("vllm"),
        ("GET", "/metrics", None),
        ("POST", "/v1/completions", {"model": "llama-3.1-8b", "prompt": "a b c", "max_tokens": 4, "ignore_eos": True}),
        ("GET", "/metrics", None),
    )
    def page(body: bytes, t: int) -> dict[tuple[str, str | None], float]:
        return {(r["metric"], orjson.loads(r["labels"]).get("finished_reason")): r["value"]
                for r in parse_metrics(body.decode(), t)}

    first, later = page(before[1], 0), page(after[1], 1)
    assert first[("vllm:generation_tokens_total", None)] == 0.0 and first[("vllm:prompt_tokens_total", None)] == 0.0
    reasons = {why for m, why in first if m == "vllm:request_success_total"}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}
    assert later[("vllm:generation_tokens_total", None)] == 4.0
    assert later[("vllm:request_success_total", "length")] == 1.0
