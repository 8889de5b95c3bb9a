"""Results store, bench trend and the rolling-baseline gate (docs/results.md, docs/reporting.md).

The detector is pinned on constructed series (fast, deterministic); the commands run on a store
of synthetic runs (no engine). The end-to-end figure on the simulated engine is
benchmarks/trend_history.py's.
"""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from bench_llm.analysis.changepoint import e_divisive
from bench_llm.analysis.history import Series
from bench_llm.bench.cli import cli
from bench_llm.results.synthetic import synthetic_run
from tests.conftest import REPO

N_COMMITS, REGRESSION_AT = 12, 8  # commit 8 (1-based) is the first 15 % slower one


def _series(seed: int, shift_at: int | None, n: int = 30, shift: float = 0.10) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = 10.0 * (1 + 0.02 * rng.standard_t(4, n))  # heavy-tailed 2 % noise: run-to-run outliers
    if shift_at is not None:
        z[shift_at:] *= 1 + shift
    return z


def test_detector_finds_a_10pct_shift_at_run_20_and_little_else() -> None:
    found, false = 0, 0
    for seed in range(10):
        cps = [c.index for c in e_divisive(_series(seed, 19))]
        found += any(abs(i - 19) <= 1 for i in cps)
        false += sum(abs(i - 19) > 1 for i in cps)
        false += len(e_divisive(_series(100 + seed, None)))  # no change at all
    assert found == 10
    assert false <= 1


def test_detector_ignores_a_single_outlier_and_reports_the_levels() -> None:
    z = _series(3, None)
    z[12] *= 1.5
    assert e_divisive(z) == []
    (cp,) = e_divisive(_series(4, 19))
    assert cp.before == pytest.approx(10, rel=0.03) and cp.after == pytest.approx(11, rel=0.03)
    assert cp.rel_change == pytest.approx(0.10, abs=0.03) and cp.p_value <= 0.01


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("history")
    st = root / "store"
    today = _dt.datetime.now(_dt.timezone.utc).date()
    runner = CliRunner()
    for i in range(1, N_COMMITS + 1):
        run = synthetic_run(root / f"run{i:02d}", 200, 8, seed=i, scale=1.15 if i >= REGRESSION_AT else 1.0)
        day = (today - _dt.timedelta(days=N_COMMITS - i)).isoformat()
        res = runner.invoke(cli, ["history", str(run), "--store", str(st), "--commit", f"c{i:02d}", "--date", day])
        assert res.exit_code == 0, res.output
    return st


def test_store_is_one_partitioned_dataset(store: Path) -> None:
    files = sorted(store.glob("metrics/date=*/commit=*/config=run/*.parquet"))
    assert len(files) == N_COMMITS
    assert len(list(store.glob("runs/date=*/commit=c01/config=run/run=*/requests/*.parquet"))) == 1
    hist = pd.read_parquet(store / "metrics")  # pandas: one call, partitions as columns
    assert {"date", "commit", "config", "metric", "value", "run_id"} <= set(hist.columns)
    assert sorted(hist["commit"].astype(str).unique()) == [f"c{i:02d}" for i in range(1, N_COMMITS + 1)]
    res = CliRunner().invoke(cli, ["history", str(store / "runs"), "--store", str(store), "--commit", "c01", "--date", hist["date"].astype(str).min()])
    assert res.exit_code == 2 and "already in the store" in res.output


def _doc_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", (REPO / "docs" / "results.md").read_text(encoding="utf-8"), flags=re.S)


def test_dashboard_queries_in_the_docs_run_on_the_store(store: Path) -> None:
    duckdb = pytest.importorskip("duckdb", reason="duckdb is a test dependency (pip install -e .[test])")
    blocks = _doc_blocks("sql history")
    assert len(blocks) == 3
    con = duckdb.connect()
    tpot, wide, reqs = (con.sql(b.replace("STORE/", f"{store}/")).df() for b in blocks)
    assert list(tpot["commit"]) == [f"c{i:02d}" for i in range(1, N_COMMITS + 1)]
    assert tpot["tpot_p50_ms"].iloc[-1] > 1.1 * tpot["tpot_p50_ms"].iloc[0]
    assert len(wide) == 8 and "tpot_p50_ms" in wide.columns  # the last 7 days and today
    assert len(reqs) == N_COMMITS and (reqs["requests"] == 200).all()
    ns: dict = {"STORE": str(store)}
    exec(compile(_doc_blocks("python history")[0], "results.md[history]", "exec"), ns)  # noqa: S102 - our own documentation
    assert ns["tpot"].shape == (N_COMMITS, 1)


def test_trend_flags_the_regressing_commit_only(store: Path, tmp_path: Path) -> None:
    html, md = tmp_path / "trend.html", tmp_path / "trend.md"
    res = CliRunner().invoke(cli, ["trend", str(store), "--config", str(REPO / "ci" / "gates-sim.toml"), "--html", str(html), "--markdown", str(md),
                                   "--metrics", "tpot_p50_ms,itl_p50_ms,e2e_p50_ms,error_rate"])  # fmt: skip
    assert res.exit_code == 1, res.output  # a regression flagged: a nightly job fails on it
    flagged = [line for line in res.output.splitlines() if line.startswith(("REGRESSION", "IMPROVEMENT"))]
    assert flagged and all(f"at #{REGRESSION_AT} c{REGRESSION_AT:02d}" in line for line in flagged), res.output
    assert any("tpot_p50_ms" in line and line.startswith("REGRESSION") for line in flagged)
    text = md.read_text()
    assert text.startswith("## Performance trend:") and "`c08`" in text and "❌ regression" in text
    page = html.read_text()
    assert "Did anything regress?" in page and "regression(s) flagged" in page and "flagged-0" in page


def test_gate_against_a_rolling_baseline(store: Path, tmp_path: Path) -> None:
    config = str(REPO / "ci" / "gates-sim.toml")
    fast = synthetic_run(tmp_path / "fast", 200, 8, seed=99, scale=1.0)
    slow = synthetic_run(tmp_path / "slow", 200, 8, seed=98, scale=1.15)
    runner = CliRunner()
    # the last 4 entries are all at the slower level: a fast run improves, a slow one passes
    res = runner.invoke(cli, ["gate", "--history", str(store), "--window", "4", "--current", str(slow), "--config", config])
    assert res.exit_code == 0, res.output
    assert "last 4 entries" not in res.output  # the text lists checks; the baseline label is in the markdown
    # against the 5 fast entries before the regression, the slow run fails on TPOT
    early = tmp_path / "early"
    for i in range(1, REGRESSION_AT):
        day = str(pd.read_parquet(store / "metrics", filters=[("commit", "=", f"c{i:02d}")])["date"].iloc[0])
        runner.invoke(cli, ["history", str(store / "runs" / f"date={day}" / f"commit=c{i:02d}"), "--store", str(early), "--commit", f"c{i:02d}", "--date", day])
    res = runner.invoke(cli, ["gate", "--history", str(early), "--window", "5", "--current", str(slow), "--config", config])
    assert res.exit_code == 1, res.output
    assert re.search(r"FAIL\s+run\s+tpot_p50_ms", res.output), res.output
    res = runner.invoke(cli, ["gate", "--history", str(early), "--window", "5", "--current", str(fast), "--config", config])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["gate", "--current", str(fast), "--config", config])
    assert res.exit_code == 2 and "exactly one of --baseline and --history" in res.output


def _as_series(metric: str, values: np.ndarray) -> Series:
    from bench_llm.analysis.history import Point

    return Series("", metric, tuple(Point(f"2026-01-{i + 1:02d}", f"c{i + 1:02d}", float(v), 1) for i, v in enumerate(values)))


def test_a_change_that_coincides_with_a_slower_host_is_not_flagged() -> None:
    """TTFT jumps at night 11 because the host got busier (the client's event-loop lag jumps
    with it): listed as a host change. TPOT regresses at night 20 while the host recovers:
    flagged. Without the host series both are flagged."""
    from bench_llm.analysis.gate import MetricGate
    from bench_llm.analysis.history import HOST_LAG_METRIC
    from bench_llm.analysis.trend import TrendOptions, TrendResult, detect, markdown

    rng = np.random.default_rng(7)
    lag = np.where((np.arange(30) >= 10) & (np.arange(30) < 19), 8.0, 0.5) * (1 + 0.2 * rng.standard_normal(30))
    ttft = _series(1, 10, shift=0.6)
    tpot = _series(2, 19)
    gates = {"ttft_p50_ms": MetricGate(max_increase_pct=30), "tpot_p50_ms": MetricGate(max_increase_pct=5)}
    series = [_as_series("ttft_p50_ms", ttft), _as_series("tpot_p50_ms", tpot)]
    host = [_as_series(HOST_LAG_METRIC, lag)]
    found = detect(series, gates, TrendOptions(), host)
    by = {(f.metric, f.index): f for f in found}
    assert by[("ttft_p50_ms", 10)].verdict == "host change" and not by[("ttft_p50_ms", 10)].flagged
    assert by[("ttft_p50_ms", 10)].host is not None and by[("ttft_p50_ms", 10)].host.after > by[("ttft_p50_ms", 10)].host.before
    assert by[("tpot_p50_ms", 19)].verdict == "regression"  # the host got faster there: not an excuse
    md = markdown(TrendResult("s", tuple(series), tuple(found), TrendOptions(), gates, tuple(host)))
    assert "· host change" in md and "event-loop lag" in md
    plain = detect(series, gates, TrendOptions())
    assert sorted((f.metric, f.index) for f in plain if f.flagged) == [("tpot_p50_ms", 19), ("ttft_p50_ms", 10)]
    never = detect(series, gates, TrendOptions(host_tolerance=-1), host)
    assert all(f.verdict != "host change" for f in never)
