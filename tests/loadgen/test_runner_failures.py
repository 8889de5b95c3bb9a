"""Requests that fail are recorded with their error and counted; the run goes on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.analysis.load import load_run
from bench_llm.analysis.summary import summarize
from bench_llm.bench.execute import RunConfig, execute_run
from bench_llm.loadgen.runner import RunOptions
from bench_llm.loadgen.transport import Timeouts
from bench_llm.sim.server import serve_in_process
from bench_llm.workloads.spec import RequestSpec, Schedule


def _chunk(text: str, n: int) -> bytes:
    return b"data: " + orjson.dumps({"id": "x", "choices": [{"text": text}], "usage": {"completion_tokens": n}}) + b"\n\n"


async def faulty(request: web.Request) -> web.StreamResponse:
    mode = (await request.json())["prompt"]
    if mode == "http500":
        return web.json_response({"message": "boom"}, status=500)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_chunk(" a", 1))
    if mode == "reset":
        request.transport.close()  # type: ignore[union-attr]
        return resp
    if mode == "malformed":
        await resp.write(b"data: {oops\n\n")
    if mode == "stall":
        await asyncio.sleep(5)
    await resp.write(_chunk(" b", 2))
    if mode != "no_done":
        await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _schedule(modes: list[str]) -> Schedule:
    specs = tuple(
        RequestSpec(f"r{i}-{m}", input_tokens=1, max_output_tokens=2, prompt=m, send_offset_ns=i * 20_000_000)
        for i, m in enumerate(modes)
    )
    return Schedule("faults", 0, "open", specs, rate=50.0)


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_each_failure_is_a_row_and_the_run_goes_on(tmp_path: Path, transport: str) -> None:
    """Both transports classify every failure the same way."""
    modes = ["ok", "http500", "reset", "malformed", "no_done", "stall", "ok"]

    async def main() -> Path:
        app = web.Application()
        app.router.add_post("/v1/completions", faulty)
        async with serve_in_process(app) as url:
            cfg = RunConfig(
                out=tmp_path / "run",
                url=url,
                engine="test",
                model="m",
                schedule=_schedule(modes),
                options=RunOptions(progress=False),
                timeouts=Timeouts(stall=1.0),
                transport=transport,
            )
            res = await execute_run(cfg, OpenAIAdapter(model="m"), install_signals=False)
            return res.run_dir

    run = load_run(asyncio.run(main()))
    rows = {r["request_id"].split("-", 1)[1]: r for r in run.requests.to_pylist()}
    assert len(rows) == len(set(modes))
    assert rows["ok"]["ok"] and rows["ok"]["output_tokens"] == 2
    assert rows["http500"]["error_type"] == "http_error" and rows["http500"]["http_status"] == 500
    assert rows["reset"]["error_type"] in ("stream_reset", "no_done")
    assert rows["malformed"]["error_type"] == "malformed_chunk"
    assert rows["no_done"]["error_type"] == "no_done"
    assert rows["stall"]["error_type"] == "timeout"
    s = summarize(run.requests)
    assert s.requests.failed == 5 and s.requests.ok == 2
    assert sum(s.requests.errors.values()) == 5


def test_connection_refused_is_recorded(tmp_path: Path) -> None:
    from bench_llm.launch.process import free_port

    cfg = RunConfig(
        out=tmp_path / "run",
        url=f"http://127.0.0.1:{free_port()}",
        engine="test",
        model="m",
        schedule=_schedule(["ok", "ok"]),
        options=RunOptions(progress=False),
    )
    res = asyncio.run(execute_run(cfg, OpenAIAdapter(model="m"), install_signals=False))
    rows = load_run(res.run_dir).requests.to_pylist()
    assert [r["error_type"] for r in rows] == ["connect", "connect"]
    assert load_run(res.run_dir).meta["status"] == "complete"
