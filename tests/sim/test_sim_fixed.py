"""Fixed timing: request deadlines and the global step grid, checked against the emission log."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench_llm.sim.server import ServerConfig
from bench_llm.sim.timing import FixedTiming
from tests.sim_helpers import run_against, schedule


def _log(path: Path) -> dict[str, list[tuple[int, int, int]]]:
    t = pq.read_table(path).to_pylist()
    out: dict[str, list[tuple[int, int, int]]] = {}
    for r in t:
        out.setdefault(r["server_request_id"], []).append((r["token_index"], r["intended_ns"], r["actual_ns"]))
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.parametrize("clock", ["user", "kernel"])
def test_emission_log_matches_the_stream_token_by_token(tmp_path: Path, clock: str) -> None:
    log = tmp_path / "emissions.parquet"
    cfg = ServerConfig(timing=FixedTiming(0.03, 0.005), emission_log=log)
    rows = run_against(cfg, schedule(12, output_tokens=10, concurrency=4), tmp_path, clock=clock)
    assert all(r["ok"] for r in rows)
    assert pq.read_schema(log).names == ["server_request_id", "token_index", "intended_ns", "actual_ns"]
    by_id = _log(log)
    assert set(by_id) == {r["server_request_id"] for r in rows}
    for r in rows:
        toks = by_id[r["server_request_id"]]
        assert [i for i, _, _ in toks] == list(range(10))
        intended = [t for _, t, _ in toks]
        assert all(b - a == 5_000_000 for a, b in zip(intended, intended[1:]))  # ITL truth is exact
        assert all(act >= itd for _, itd, act in toks)  # never early
        if clock == "user":
            # the client (same thread) read each chunk after the server wrote it and logged it
            assert r["chunk_ns"][0] >= toks[0][2] and r["chunk_ns"][-1] >= toks[-1][2] - 1
        else:
            # the kernel stamps the data inside the server's write, which starts at or after the
            # intended time and ends before the server logs it; 50 µs for the conversion of
            # the kernel's realtime stamp onto perf_counter_ns
            assert r["chunk_ns"][0] >= toks[0][1] - 50_000 and r["chunk_ns"][-1] >= toks[-1][1] - 50_000
        # client TTFT contains the true TTFT (30 ms from the server's arrival stamp)
        assert r["first_token_ns"] - r["send_ns"] >= 30_000_000


def test_grid_mode_steps_every_stream_together(tmp_path: Path) -> None:
    log = tmp_path / "grid.parquet"
    cfg = ServerConfig(timing=FixedTiming(0.02, 0.01), emission_log=log, fixed_grid=True)
    rows = run_against(cfg, schedule(8, output_tokens=6, concurrency=None, rate=100.0), tmp_path)
    assert all(r["ok"] for r in rows)
    by_id = _log(log)
    origin_mod = {t % 10_000_000 for toks in by_id.values() for _, t, _ in toks}
    assert len(origin_mod) == 1  # every intended time is on one 10 ms grid
    for r in rows:
        toks = by_id[r["server_request_id"]]
        # first token: first grid point at or after arrival + TTFT, so client TTFT >= 20 ms
        assert r["first_token_ns"] - r["send_ns"] >= 20_000_000
        assert [t for _, t, _ in toks] == [toks[0][1] + 10_000_000 * i for i in range(6)]


@pytest.mark.parametrize("per", [1, 3])
def test_tokens_per_chunk_keeps_exact_counts(tmp_path: Path, per: int) -> None:
    cfg = ServerConfig(timing=FixedTiming(0.01, 0.002, per))
    rows = run_against(cfg, schedule(3, output_tokens=7, concurrency=3), tmp_path)
    for r in rows:
        assert r["ok"] and r["output_tokens"] == 7 and r["completion_tokens"] == 7
        assert len([c for c in r["chunk_tokens"] if c]) == -(-7 // per)
