"""Performance history a release manager can act on (issue 38): change points that survive
reverts, the culprit commit on the first night, comparable runs only, a store that survives
one bad file.

Stores are built from metric rows (``add_entry`` without run folders: fast), except where the
rolling-baseline gate needs stored runs (small synthetic runs). The comparison with Apache
Otava, the false-alarm cost of the knobs and the 1,000-night cost are benchmarks/trend_*.py's.
"""

from __future__ import annotations

import datetime as _dt
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

from bench_llm.analysis.changepoint import e_divisive
from bench_llm.bench.cli import cli
from bench_llm.results.history import Partition, add_entry, read_history
from bench_llm.results.reader import read_run_meta
from bench_llm.results.schema import HISTORY_SCHEMA
from bench_llm.results.synthetic import synthetic_run
from bench_llm.results.writer import write_run_meta, write_table_atomic

DAY0 = _dt.date(2026, 1, 1)
GATES = """
[gate]
level = 0.95
resamples = 200
[metrics.tpot_p50_ms]
max_increase_pct = 5
[metrics.ttft_p50_ms]
max_increase_pct = 3
"""


def _rows(commit: str, values: dict[str, float], fingerprint: str | None, start: _dt.datetime) -> pa.Table:
    n = len(values)
    return pa.table(
        {"run_id": [f"run-{commit}"] * n, "config_key": [""] * n, "start_utc": [start] * n, "added_utc": [start] * n,
         "engine": ["sim"] * n, "model": ["m"] * n, "bench_version": ["t"] * n, "runs": [1] * n, "requests": [100] * n,
         "metric": list(values), "value": list(values.values()), "fingerprint": [fingerprint] * n},
        schema=HISTORY_SCHEMA,
    )  # fmt: skip


def _store(root: Path, series: dict[str, np.ndarray], fingerprints: list[str | None] | None = None) -> Path:
    """A store of one configuration: commit c01, c02, ... on consecutive days."""
    n = len(next(iter(series.values())))
    for i in range(n):
        day = DAY0 + _dt.timedelta(days=i)
        start = _dt.datetime(day.year, day.month, day.day, 2, tzinfo=_dt.timezone.utc)
        fp = fingerprints[i] if fingerprints else json.dumps({"concurrency": 4, "engine": "sim"})
        add_entry(root, Partition(day.isoformat(), f"c{i + 1:02d}", "run"), "e", _rows(f"c{i + 1:02d}", {m: float(v[i]) for m, v in series.items()}, fp, start), [])
    return root


def _trend(store: Path, tmp: Path, *args: str) -> tuple[int, str]:
    gates = tmp / "gates.toml"
    gates.write_text(GATES)
    res = CliRunner().invoke(cli, ["trend", str(store), "--config", str(gates), *args])
    return res.exit_code, res.output


def _noisy(n: int, seed: int, level: float = 12.0, noise: float = 0.01) -> np.ndarray:
    return level * (1 + noise * np.random.default_rng(seed).standard_normal(n))


# -- the change points ------------------------------------------------------------------------


def test_every_change_point_of_a_store_with_reverts_and_its_commit(tmp_path: Path) -> None:
    """60 nights: TPOT +10 % for 5 nights then fixed (c11-c15), a 10-night bump (c26-c35), a
    lasting step at c46; TTFT +5 % from c21. Every edge is found at its commit, nothing else."""
    tpot = _noisy(60, 1)
    tpot[10:15] *= 1.10
    tpot[25:35] *= 1.10
    tpot[45:] *= 1.10
    ttft = _noisy(60, 2, level=80.0)
    ttft[20:] *= 1.05
    store = _store(tmp_path / "store", {"tpot_p50_ms": tpot, "ttft_p50_ms": ttft})
    md = tmp_path / "trend.md"
    code, out = _trend(store, tmp_path, "--markdown", str(md))
    assert code == 1, out  # regressions flagged: a nightly job fails
    found = sorted(line.split()[0] + " " + line.split()[2] + " " + line.split()[5] for line in out.splitlines()[1:] if line.split()[0].isupper())
    assert found == sorted([
        "REGRESSION tpot_p50_ms c11", "IMPROVEMENT tpot_p50_ms c16", "REGRESSION tpot_p50_ms c26", "IMPROVEMENT tpot_p50_ms c36",
        "REGRESSION tpot_p50_ms c46", "REGRESSION ttft_p50_ms c21",
    ]), out  # fmt: skip
    assert "p=" in out and "+10." in out and "+5." in out  # each with its p-value and magnitude
    text = md.read_text()
    assert text.index("❌ regression") < text.index("✅ improvement")  # regressions first
    page_path = tmp_path / "trend.html"
    code, _ = _trend(store, tmp_path, "--html", str(page_path))
    page = page_path.read_text()
    # the first screen: the red headline with the worst regression, the flagged table, a plot per flagged change
    head = page.index("4 regression(s) flagged; worst: tpot_p50_ms of run +")
    assert head < page.index(">regression<") < page.index(">improvement<") < page.index('id="fig-0-flagged-0"') < page.index("Configuration run")
    assert page.count('-flagged-') >= 6 and "#dc2626" in page


def test_19_steps_in_300_nights_are_all_found() -> None:
    """The 30-night scenario copied 10 times: TPOT +10 % on nights 21-30 of each copy."""
    z = _noisy(300, 3)
    truth = []
    for c in range(10):
        z[30 * c + 20 : 30 * c + 30] *= 1.10
        truth += [30 * c + 20] + ([30 * c + 30] if c < 9 else [])
    found = [cp.index for cp in e_divisive(z)]
    assert found == truth


def test_no_change_point_in_noise_and_a_lone_outlier_is_not_one() -> None:
    false = 0
    for seed in range(20):
        z = 10.0 * (1 + 0.02 * np.random.default_rng(100 + seed).standard_t(4, 30))  # heavy-tailed
        false += len(e_divisive(z))
    assert false <= 1
    z = _noisy(30, 4)
    z[12] *= 1.3
    z[29] *= 1.3  # also on the newest night
    assert e_divisive(z) == []


def test_the_culprit_on_the_first_night_a_change_is_reported() -> None:
    """Run nightly: on the first night a change is reported, it names the right commit, or
    says the commit is not yet certain and the commits it may be include the right one."""
    for seed, at, shift in ((5, 20, 0.10), (6, 10, 0.05), (7, 20, 0.10), (8, 14, 0.08)):
        z = _noisy(30, seed)
        z[at:] *= 1 + shift
        for night in range(at + 1, 31):
            near = [cp for cp in e_divisive(z[:night]) if abs(cp.index - at) <= 3]
            if near:
                lo, hi = near[0].span
                assert (near[0].certain and near[0].index == at) or lo <= at <= hi, (seed, night, near)
                assert night - at <= 4, (seed, night)  # reported within a few nights of the change
                break
        else:
            pytest.fail(f"never reported (seed {seed})")


def test_an_uncertain_commit_is_reported_as_such(tmp_path: Path) -> None:
    """Noise at half the step: the change is reported, its commit not yet certain."""
    z = _noisy(23, 9, noise=0.02)
    z[20:] *= 1.10
    z[19] = 12.0 * 1.05  # the night before is half-way: either commit may be the culprit
    cps = e_divisive(z)
    assert len(cps) == 1 and not cps[0].certain and cps[0].span[0] <= 20 <= cps[0].span[1]
    store = _store(tmp_path / "store", {"tpot_p50_ms": z})
    code, out = _trend(store, tmp_path)
    assert code == 1 and "new, commit not yet certain (one of #" in out, out


# -- bounded look-back, short stores ----------------------------------------------------------


def test_last_and_since_limit_the_look_back(tmp_path: Path) -> None:
    z = _noisy(40, 10)
    z[10:] *= 1.10
    store = _store(tmp_path / "store", {"tpot_p50_ms": z})
    code, out = _trend(store, tmp_path)
    assert code == 1 and "c11" in out
    code, out = _trend(store, tmp_path, "--last", "25")  # commits c16-c40: no change left
    assert code == 0 and "c11" not in out and out.startswith("1 series;"), out
    code, out = _trend(store, tmp_path, "--since", (DAY0 + _dt.timedelta(days=5)).isoformat())
    assert code == 1 and "at #6 c11" in out, out  # c06 is the first point now
    assert read_history(store, last=5).table.num_rows == 5
    code, out = _trend(store, tmp_path, "--since", "yesterday")
    assert code == 2 and "YYYY-MM-DD" in out


def test_a_one_run_store_says_how_many_commits_are_needed(tmp_path: Path) -> None:
    store = _store(tmp_path / "store", {"tpot_p50_ms": np.array([12.0])})
    code, out = _trend(store, tmp_path)
    assert code == 0 and "needs at least 6 commits" in out and "add 5 more" in out, out


# -- a store that survives one bad file --------------------------------------------------------


def _step_store(tmp_path: Path) -> Path:
    z = _noisy(20, 11)
    z[10:] *= 1.10
    return _store(tmp_path / "store", {"tpot_p50_ms": z})


def test_a_corrupt_metrics_file_is_named_skipped_and_counted(tmp_path: Path) -> None:
    store = _step_store(tmp_path)
    bad = next(store.glob("metrics/date=*/commit=c03/config=run/*.parquet"))
    bad.write_bytes(b"PAR1 this is not parquet")
    code, out = _trend(store, tmp_path)
    assert code == 1 and "c11" in out, out  # the rest of the store is judged
    assert f"skipped 1 unreadable file(s) of the store (20 in all): {bad}" in out, out


def test_a_metrics_file_missing_columns_is_named_and_skipped(tmp_path: Path) -> None:
    store = _step_store(tmp_path)
    bad = next(store.glob("metrics/date=*/commit=c04/config=run/*.parquet"))
    write_table_atomic(pa.table({"metric": ["tpot_p50_ms"], "value_ms": [1.0]}), bad)
    code, out = _trend(store, tmp_path)
    assert code == 1 and str(bad) in out and "missing column(s) run_id, config_key, value" in out, out


def test_an_empty_metrics_folder_is_a_clear_message(tmp_path: Path) -> None:
    (tmp_path / "store" / "metrics").mkdir(parents=True)
    code, out = _trend(tmp_path / "store", tmp_path)
    assert code == 0 and "no entry to analyse" in out and "bench history" in out, out
    code, out = _trend(tmp_path / "nowhere", tmp_path)
    assert code == 2 and "not a results store" in out


def _meta(run: Path, **workload: object) -> Path:
    meta = read_run_meta(run)
    meta = {k: v for k, v in meta.items() if not k.endswith("_json") or k == "config_json"}
    meta.pop("config", None)
    write_run_meta(run, {**meta, "config_json": {"api": "completions"}, "workload_json": {"name": "synthetic", "seed": 1, **workload}})
    return run


@pytest.fixture(scope="module")
def run_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A store of 3 nightly synthetic runs at concurrency 4, 64 input tokens; the gates file."""
    root = tmp_path_factory.mktemp("runs")
    runner = CliRunner()
    for i in range(1, 4):
        run = _meta(synthetic_run(root / f"r{i}", 120, 6, seed=i), concurrency=4, input_tokens=64)
        res = runner.invoke(cli, ["history", str(run), "--store", str(root / "store"), "--commit", f"c{i}", "--date", f"2026-01-0{i}"])
        assert res.exit_code == 0, res.output
    gates = root / "gates.toml"
    gates.write_text(GATES)
    return root / "store", gates


def test_gate_refuses_a_run_that_is_not_comparable(run_store: tuple[Path, Path], tmp_path: Path) -> None:
    store, gates = run_store
    other = _meta(synthetic_run(tmp_path / "c8", 120, 6, seed=9, scale=0.5), concurrency=8, input_tokens=128)
    res = CliRunner().invoke(cli, ["gate", "--history", str(store), "--current", str(other), "--config", str(gates)])
    assert res.exit_code == 2, res.output
    assert "not comparable" in res.output and "concurrency 8 vs 4, input_tokens 128 vs 64" in res.output, res.output
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    res = CliRunner().invoke(cli, ["history", str(other), "--store", str(copy), "--commit", "c9", "--date", "2026-01-09"])
    assert res.exit_code == 0 and "note: run measured something else than its stored entries (concurrency 8 vs 4" in res.output, res.output
    same = _meta(synthetic_run(tmp_path / "c4", 120, 6, seed=10), concurrency=4, input_tokens=64)
    res = CliRunner().invoke(cli, ["gate", "--history", str(store), "--current", str(same), "--config", str(gates)])
    assert res.exit_code == 0, res.output


def test_trend_separates_runs_that_measured_something_else(tmp_path: Path) -> None:
    z = _noisy(16, 12)
    z[8:] *= 1.9  # concurrency 8 from c09: higher latency, not a regression of the code
    fps = [json.dumps({"concurrency": 4 if i < 8 else 8}) for i in range(16)]
    store = _store(tmp_path / "store", {"tpot_p50_ms": z}, fps)
    code, out = _trend(store, tmp_path)
    assert code == 0, out
    assert "8 commit(s) measured something else (concurrency 8 vs 4" in out and "2 series;" in out, out


def test_a_corrupt_stored_run_is_named(run_store: tuple[Path, Path], tmp_path: Path) -> None:
    store, gates = run_store
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    parts = sorted(copy.glob("runs/date=*/commit=c3/config=run/run=*/requests/*.parquet"))
    parts[0].write_bytes(b"garbage")
    current = _meta(synthetic_run(tmp_path / "cur", 120, 6, seed=11), concurrency=4, input_tokens=64)
    res = CliRunner().invoke(cli, ["gate", "--history", str(copy), "--current", str(current), "--config", str(gates)])
    assert res.exit_code == 0 and f"1 stored run(s) unreadable, left out of the baseline: {parts[0]}" in res.output, res.output
    res = CliRunner().invoke(cli, ["gate", "--history", str(copy), "--window", "1", "--current", str(current), "--config", str(gates)])
    assert res.exit_code == 2 and str(parts[0]) in res.output, res.output


def test_history_refuses_a_run_whose_requests_all_failed(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "failed", 50, 4, seed=1)
    req = next((run / "requests").glob("*.parquet"))
    table = pa.parquet.read_table(req)
    table = table.set_column(table.schema.get_field_index("ok"), "ok", pa.array([False] * table.num_rows))
    write_table_atomic(table, req)
    res = CliRunner().invoke(cli, ["history", str(run), "--store", str(tmp_path / "store"), "--commit", "c1", "--date", "2026-01-01"])
    assert res.exit_code == 3, res.output
    assert "refused run: 0 of 50 measured requests succeeded" in res.output
    assert not list((tmp_path / "store").glob("metrics/**/*.parquet"))
