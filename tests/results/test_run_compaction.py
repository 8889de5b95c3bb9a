"""A finished `bench run` merges its request part files (written once per second or per
256 requests while recording) into few large files, keeping every row."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest

from bench_llm import results
from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.analysis.load import load_run
from bench_llm.bench.execute import RunConfig, execute_run
from bench_llm.loadgen.runner import RunOptions
from bench_llm.results.schema import MONITOR_DIR, REQUESTS_DIR
from bench_llm.sim.server import ServerConfig, create_app, serve_in_process
from bench_llm.sim.timing import FixedTiming
from bench_llm.workloads.spec import RequestSpec, Schedule


def test_run_ends_with_its_parts_merged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results.writer, "COMPACT_MIN_PARTS", 2)
    parts_seen: dict[str, int] = {}
    real = results.writer.compact_parts

    def spy(folder: Path, schema: pa.Schema, **kwargs: int) -> bool:
        parts_seen[folder.name] = len(list(folder.glob("*.parquet")))
        return real(folder, schema, **kwargs)

    monkeypatch.setattr(results.writer, "compact_parts", spy)
    # open loop, 10 requests/s for 2.5 s: the writer flushes about once a second
    specs = tuple(RequestSpec(f"r{i:03d}", 4, 4, prompt="p", send_offset_ns=i * 100_000_000) for i in range(25))

    async def main() -> Path:
        async with serve_in_process(create_app(ServerConfig(timing=FixedTiming(0.002, 0.001)))) as url:
            cfg = RunConfig(out=tmp_path / "run", url=url, engine="sim", model="sim-model",
                            schedule=Schedule("o", 0, "open", specs, rate=10.0), options=RunOptions(progress=False))
            return (await execute_run(cfg, OpenAIAdapter(model="sim-model"), install_signals=False)).run_dir

    run_dir = asyncio.run(main())
    files = list((run_dir / REQUESTS_DIR).glob("*.parquet"))
    assert parts_seen[REQUESTS_DIR] >= 2  # recorded as several parts...
    assert len(files) == 1  # ...merged into one at the end
    # the client monitor's parts (one every 2 s) too, rows kept in order
    assert parts_seen[MONITOR_DIR] >= 2
    assert len(list((run_dir / MONITOR_DIR).glob("*.parquet"))) == 1
    monitor = load_run(run_dir).monitor
    assert monitor is not None and monitor.num_rows >= 2
    ts = monitor["ts_ns"].to_pylist()
    assert ts == sorted(ts)
    rows = load_run(run_dir).requests.to_pylist()
    assert sorted(r["request_id"] for r in rows) == [s.request_id for s in specs]
    assert all(r["ok"] for r in rows)


def test_a_failed_merge_leaves_a_complete_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def full_disk(folder: Path, schema: pa.Schema, **kwargs: int) -> bool:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(results.writer, "compact_parts", full_disk)
    specs = tuple(RequestSpec(f"r{i}", 4, 4, prompt="p") for i in range(4))

    async def main() -> Path:
        async with serve_in_process(create_app(ServerConfig(timing=FixedTiming(0.002, 0.001)))) as url:
            cfg = RunConfig(out=tmp_path / "run", url=url, engine="sim", model="sim-model",
                            schedule=Schedule("c", 0, "closed", specs, concurrency=2), options=RunOptions(progress=False))
            return (await execute_run(cfg, OpenAIAdapter(model="sim-model"), install_signals=False)).run_dir

    run = load_run(asyncio.run(main()))
    assert run.meta["status"] == "complete" and run.requests.num_rows == 4
    assert "left unmerged" in capsys.readouterr().err
