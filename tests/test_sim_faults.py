"""Each injected fault is recorded by bench's client as the right kind of failure (or success)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from adapters.tgi import TGIAdapter
from sim.faults import FaultSpec, FaultSpecError
from sim.server import ServerConfig, create_app, serve_in_process
from sim.timing import FixedTiming
from tests.sim_helpers import run_against, schedule


def faulty(spec: str, flavor: str = "vllm") -> ServerConfig:
    return ServerConfig(timing=FixedTiming(0.01, 0.003), faults=FaultSpec.parse(spec), flavor=flavor, seed=1)


@pytest.mark.parametrize(
    ("spec", "error_type", "status"),
    [
        ("reset=1", "stream_reset", 200),
        ("http500=1", "http_error", 500),
        ("http503=1", "http_error", 503),
        ("http429=1", "http_error", 429),
        ("malformed=1", "malformed_chunk", 200),
        ("no_done=1", "no_done", 200),
        ("stall=1:3s", "timeout", 200),
    ],
)
def test_fault_is_recorded_as_its_failure(tmp_path: Path, spec: str, error_type: str, status: int) -> None:
    rows = run_against(faulty(spec), schedule(3, output_tokens=8, concurrency=3), tmp_path, stall_s=0.8)
    assert [r["error_type"] for r in rows] == [error_type] * 3, [(r["error_type"], r["error_message"]) for r in rows]
    assert all(not r["ok"] and r["http_status"] == status for r in rows)


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
            await asyncio.sleep(0.7)
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
    from sim.faults import FaultPlanner

    a = [FaultPlanner(FaultSpec.parse("reset=0.3"), 5).plan(10) for _ in range(1)]
    p1, p2 = FaultPlanner(FaultSpec.parse("reset=0.3"), 5), FaultPlanner(FaultSpec.parse("reset=0.3"), 5)
    plans1 = [p1.plan(10) for _ in range(200)]
    assert plans1 == [p2.plan(10) for _ in range(200)] and a
    rate = sum(p.reset_at >= 0 for p in plans1) / 200
    assert 0.2 < rate < 0.4
