"""Each injected fault is recorded by bench's client as the right kind of failure (or success)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench_llm.adapters.sglang import SGLangAdapter
from bench_llm.adapters.tgi import TGIAdapter
from bench_llm.sim.faults import FaultSpec, FaultSpecError
from bench_llm.sim.server import ServerConfig, create_app, serve_in_process
from bench_llm.sim.serving import tgi_generated
from bench_llm.sim.timing import FixedTiming
from tests.sim_helpers import run_against, schedule


def faulty(spec: str, flavor: str = "vllm") -> ServerConfig:
    return ServerConfig(timing=FixedTiming(0.01, 0.003), faults=FaultSpec.parse(spec), flavor=flavor, seed=1)


@pytest.mark.parametrize(
    ("spec", "error_type", "status"),
    [
        ("reset=1", "stream_reset", 200),
        ("http500=1", "http_error", 500),
        ("http503=1", "http_503", 503),  # admission rejections have their own types (core/rejections.py)
        ("http429=1", "http_429", 429),
        ("malformed=1", "malformed_chunk", 200),
        ("no_done=1", "no_done", 200),
        ("stall=1:3s", "timeout", 200),
    ],
)
def test_fault_is_recorded_as_its_failure(tmp_path: Path, spec: str, error_type: str, status: int) -> None:
    rows = run_against(faulty(spec), schedule(3, output_tokens=8, concurrency=3), tmp_path, stall_s=0.8)
    assert [r["error_type"] for r in rows] == [error_type] * 3, [(r["error_type"], r["error_message"]) for r in rows]
    assert all(not r["ok"] and r["http_status"] == status for r in rows)


def _adapter(flavor: str) -> Any:
    return {"vllm": None, "sglang": SGLangAdapter(model="sim-model"), "tgi": TGIAdapter(model="sim-model")}[flavor]


@pytest.mark.parametrize(
    ("flavor", "spec", "error_type"),
    [
        # the engines' own shapes: HTTP 200 already sent, then the error event (and [DONE])
        ("vllm", "stream_error=1", "InternalServerError"),
        ("sglang", "stream_error=1", "internal_error"),
        ("tgi", "stream_error=1", "generation"),
        # aborts: vLLM finish_reason "abort"; SGLang finish_reason {"type": "abort"}; TGI has
        # none and ends with its generation error
        ("vllm", "abort=1", "abort"),
        ("sglang", "abort=1", "abort"),
        ("tgi", "abort=1", "generation"),
    ],
)
def test_in_stream_failures_are_failures_after_http_200(tmp_path: Path, flavor: str, spec: str, error_type: str) -> None:
    rows = run_against(faulty(spec, flavor), schedule(3, output_tokens=8, concurrency=3), tmp_path, _adapter(flavor))
    assert [r["error_type"] for r in rows] == [error_type] * 3, [(r["error_type"], r["error_message"]) for r in rows]
    assert all(not r["ok"] and r["http_status"] == 200 for r in rows)
    assert all(1 <= r["output_tokens"] < 8 for r in rows)  # what came before the failure is kept


def test_tgi_rejects_past_its_admission_limit_inside_the_stream(tmp_path: Path) -> None:
    # TGI's --max-concurrent-requests: request 129 (here 3) gets HTTP 200 and an overloaded event
    cfg = ServerConfig(timing=FixedTiming(0.2, 0.01), flavor="tgi", max_concurrent_requests=2)
    rows = run_against(cfg, schedule(4, output_tokens=5, concurrency=4), tmp_path, TGIAdapter(model="sim-model"))
    assert sorted(str(r["error_type"]) for r in rows) == ["None", "None", "overloaded", "overloaded"]
    assert all(r["http_status"] == 200 for r in rows)


def test_sglang_context_overflow_is_an_in_stream_error(tmp_path: Path) -> None:
    cfg = ServerConfig(timing=FixedTiming(0.01, 0.003), flavor="sglang", max_model_len=64)
    rows = run_against(cfg, schedule(2, input_tokens=60, output_tokens=8, concurrency=2), tmp_path,
                       SGLangAdapter(model="sim-model"), fit_context=False)  # the engine's own answer
    assert all(r["error_type"] == "invalid_request_error" and r["http_status"] == 200 for r in rows)
    assert "maximum context length of 64 tokens" in str(rows[0]["error_message"])


def test_tgi_generates_in_segments_and_may_overshoot(tmp_path: Path) -> None:
    # 1500 asked: two segments of min(1500, 1024) (router/src/infer/mod.rs), 2048 tokens out
    assert tgi_generated(10, 1500, 100_000) == 2048
    assert tgi_generated(10, 1500, 2048) == 1024  # the grown input plus a segment no longer fits
    assert tgi_generated(10, 1024, 100_000) == 1024 and tgi_generated(10, 7, 100) == 7
    cfg = ServerConfig(timing=FixedTiming(0.005, 0.0002), flavor="tgi", max_model_len=8192)
    rows = run_against(cfg, schedule(1, input_tokens=16, output_tokens=1500, concurrency=1), tmp_path,
                       TGIAdapter(model="sim-model"))
    assert rows[0]["ok"] and rows[0]["output_tokens"] == 2048 == rows[0]["completion_tokens"]


def test_split_utf8_is_reassembled_and_counted(tmp_path: Path) -> None:
    rows = run_against(faulty("split_utf8=1"), schedule(3, output_tokens=8, concurrency=3), tmp_path)
    assert all(r["ok"] and r["output_tokens"] == 8 for r in rows)


def test_multi_token_chunks_are_counted_exactly(tmp_path: Path) -> None:
    rows = run_against(faulty("multi_token=1"), schedule(3, output_tokens=9, concurrency=3), tmp_path)
    assert all(r["ok"] and r["output_tokens"] == 9 for r in rows)
    assert all(max(r["chunk_tokens"]) >= 2 for r in rows)


def test_tgi_without_final_event_is_truncated(tmp_path: Path) -> None:
    rows = run_against(faulty("no_done=1", "tgi"), schedule(2, output_tokens=5, concurrency=2), tmp_path,
                       TGIAdapter(model="sim-model"))
    assert [r["error_type"] for r in rows] == ["truncated", "truncated"]


def test_slow_start_answers_503_then_serves(tmp_path: Path) -> None:
    async def main() -> tuple[int, int, int, int]:
        async with serve_in_process(create_app(faulty("slow_start=0.6s"))) as url, aiohttp.ClientSession() as s:
            async with s.get(url + "/health") as r:
                early = r.status
            async with s.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}) as r:
                early_gen = r.status
            # poll /health until it turns (bounded), instead of sleeping past the 0.6 s start-up
            deadline = asyncio.get_running_loop().time() + 30
            late = early
            while late != 200 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
                async with s.get(url + "/health") as r:
                    late = r.status
            async with s.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}) as r:
                late_gen = r.status
            return early, early_gen, late, late_gen

    assert asyncio.run(main()) == (503, 503, 200, 200)


def test_fault_spec_parsing_and_seeded_rates() -> None:
    s = FaultSpec.parse("reset=0.1,http500=0.05,stall=0.05:5s,slow_start=3s")
    assert (s.reset, s.http500, s.stall, s.stall_s, s.slow_start_s) == (0.1, 0.05, 0.05, 5.0, 3.0)
    for bad in ("reset", "bogus=0.1", "reset=2", "stall=0.1:x"):
        with pytest.raises(FaultSpecError):
            FaultSpec.parse(bad)
    from bench_llm.sim.faults import FaultPlanner

    a = [FaultPlanner(FaultSpec.parse("reset=0.3"), 5).plan(10) for _ in range(1)]
    p1, p2 = FaultPlanner(FaultSpec.parse("reset=0.3"), 5), FaultPlanner(FaultSpec.parse("reset=0.3"), 5)
    plans1 = [p1.plan(10) for _ in range(200)]
    assert plans1 == [p2.plan(10) for _ in range(200)] and a
    rate = sum(p.reset_at >= 0 for p in plans1) / 200
    assert 0.2 < rate < 0.4
