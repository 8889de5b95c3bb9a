"""docs/results.md: every DuckDB and pandas example runs against a real run and agrees with bench."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench_llm.analysis.load import load_run
from bench_llm.analysis.summary import summarize
from tests.analysis.test_report_fixtures import add_server_metrics, real_run
from tests.conftest import REPO

DOC = REPO / "docs" / "results.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dashboard")
    run = real_run(root / "run", requests=80, concurrency=8, output_tokens=12)
    add_server_metrics(run)
    sweep = root / "sweep"
    for cell in ("tp1", "tp2"):
        shutil.copytree(run, sweep / f"cell={cell}" / "load=rate-1")
    return run


def test_docs_list_every_schema_field() -> None:
    from bench_llm.results import schema

    text = DOC.read_text(encoding="utf-8")
    for sch in (schema.RUN_SCHEMA, schema.REQUESTS_SCHEMA, schema.SCHEDULE_SCHEMA, schema.MONITOR_SCHEMA, schema.SERVER_METRICS_SCHEMA):
        for name in sch.names:
            assert f"`{name}`" in text, f"{sch.metadata[b'bench.table'].decode()}.{name} undocumented"


def test_duckdb_examples_run_and_match_bench(run_dir: Path) -> None:
    duckdb = pytest.importorskip("duckdb", reason="duckdb is a test dependency (pip install -e .[test])")
    blocks = _blocks("sql")
    assert len(blocks) >= 6
    con = duckdb.connect()
    results = []
    for sql in blocks:
        q = sql.replace("SWEEP/", f"{run_dir.parent / 'sweep'}/").replace("RUN/", f"{run_dir}/")
        rel = con.sql(q)
        rows = rel.fetchall()
        assert rows or "NOT ok" in sql, f"no rows from:\n{sql}"  # the failure breakdown may be empty
        results.append(dict(zip(rel.columns, rows[0])) if rows else {})
    s = summarize(load_run(run_dir).requests)
    pct, itl, thr = results[0], results[1], results[2]
    assert pct["requests"] == s.requests.ok
    assert pct["ttft_p50_ms"] == pytest.approx(s.latency["ttft_ms"]["p50"])
    assert pct["ttft_p95_ms"] == pytest.approx(s.latency["ttft_ms"]["p95"])
    assert pct["e2e_p99_ms"] == pytest.approx(s.latency["e2e_ms"]["p99"])
    assert itl["tokens"] == s.latency["itl_ms"]["n"]
    assert itl["itl_p50_ms"] == pytest.approx(s.latency["itl_ms"]["p50"])
    assert itl["itl_p99_ms"] == pytest.approx(s.latency["itl_ms"]["p99"])
    assert thr["requests_per_s"] == pytest.approx(s.throughput.requests_per_s)
    assert thr["output_tokens_per_s"] == pytest.approx(s.throughput.output_tokens_per_s)
    assert thr["failed"] == s.requests.failed
    sweep_rows = con.sql(blocks[-1].replace("SWEEP/", f"{run_dir.parent / 'sweep'}/")).fetchall()
    assert [r[:2] for r in sweep_rows] == [("tp1", "rate-1"), ("tp2", "rate-1")]


def test_pandas_examples_run_and_match_bench(run_dir: Path, tmp_path: Path) -> None:
    blocks = _blocks("python")
    assert len(blocks) >= 3
    ns: dict = {"RUN": str(run_dir)}
    exec(compile(blocks[0], "results.md[pandas 1]", "exec"), ns)  # noqa: S102 - our own documentation
    s = summarize(load_run(run_dir).requests)
    got = ns["summary"]
    assert got["ttft_p50_ms"] == pytest.approx(s.latency["ttft_ms"]["p50"])
    assert got["ttft_p95_ms"] == pytest.approx(s.latency["ttft_ms"]["p95"])
    assert got["tpot_p50_ms"] == pytest.approx(s.latency["tpot_ms"]["p50"])
    assert got["output_tokens_per_s"] == pytest.approx(s.throughput.output_tokens_per_s)
    exec(compile(blocks[1], "results.md[pandas 2]", "exec"), ns)  # noqa: S102
    assert ns["chunk_gap_ms"].quantile(0.5) == pytest.approx(s.latency["chunk_gap_ms"]["p50"])
    hist = tmp_path / "history"
    shutil.copytree(run_dir, hist / "a")
    cwd = Path.cwd()
    try:
        import os

        os.chdir(tmp_path)
        exec(compile(blocks[2], "results.md[pandas 3]", "exec"), ns)  # noqa: S102
    finally:
        os.chdir(cwd)
    history: pd.DataFrame = ns["history"]
    assert len(history) == 1 and np.isfinite(history["ttft_p95_ms"].iloc[0])
