"""The streamed summary (part file by part file, batch by batch) equals the in-memory one, and
the histogram used past the exact limit keeps its stated bound (docs/metrics.md, Aggregates)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from bench_llm.analysis.distributions import HISTOGRAM_RELATIVE_ERROR, PooledDistribution, percentiles
from bench_llm.analysis.load import iter_request_batches, load_run
from bench_llm.analysis.metrics import chunk_gap_ms, itl_ms
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.smoothness import Deadlines, smoothness_metrics
from bench_llm.analysis.summary import REQUEST_COLUMNS, SummaryOptions, summarize, summarize_batches, summarize_run
from bench_llm.analysis.summary_types import RunSummary, json_of
from bench_llm.results.writer import RequestsWriter, write_run_meta
from tests.helpers_records import record

OPTIONS = SummaryOptions((1, 50, 90, 99, 99.9), SLO.parse("ttft_ms=120,tpot_ms=9"))


def _random_run(run_dir: Path, n: int = 400, parts: int = 5, seed: int = 11, multi_token: bool = True) -> Path:
    """Requests with multi-token (unless not ``multi_token``), empty and role-only chunks,
    stalls, failures, warm-up and cancelled rows, written as ``parts`` part files."""
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n):
        send = float(rng.integers(0, 60_000))
        t = send + float(rng.choice([40, 90, 130, 400]))
        chunks: list[tuple[float, int]] = [(send + 1, 0)]  # role-only opening frame
        for _ in range(int(rng.integers(1, 30))):
            chunks.append((t, int(rng.choice([1, 1, 1, 2, 3, 0] if multi_token else [1, 1, 1, 0]))))
            t += float(rng.choice([0, 3.5, 8, 8.25, 11, 250]))
        kind = rng.random()
        if kind < 0.08:
            recs.append(record(f"r{i}", send, chunks[:2], ok=False, error_type="http_error"))
        elif kind < 0.12:
            recs.append(record(f"r{i}", send, chunks, ok=False, error_type="cancelled"))
        elif kind < 0.18:
            recs.append(record(f"r{i}", send, chunks, phase="warmup"))
        else:
            recs.append(record(f"r{i}", send, chunks, max_output_tokens=40))
    write_run_meta(run_dir, {"run_id": "t", "schema_version": "1.0", "bench_version": "0", "status": "complete"})
    w = RequestsWriter(run_dir, "t")
    for chunk in np.array_split(np.arange(n), parts):
        w.write([{f: getattr(recs[j], f) for f in recs[j].__dataclass_fields__} for j in chunk])
    return run_dir


def _same(a: RunSummary | dict, b: RunSummary | dict) -> None:
    assert json.dumps(json_of(a), sort_keys=True, default=str) == json.dumps(json_of(b), sort_keys=True, default=str)


@pytest.mark.parametrize("multi_token", [True, False])  # False: the one-token-per-chunk fast path
def test_streamed_summary_equals_in_memory_on_several_part_files(tmp_path: Path, multi_token: bool) -> None:
    run_dir = _random_run(tmp_path / "run", multi_token=multi_token)
    assert len(list((run_dir / "requests").glob("*.parquet"))) == 5
    table = load_run(run_dir).requests
    whole = summarize(pa.Table.from_batches([table.combine_chunks().to_batches()[0]]), OPTIONS)
    streamed = summarize_run(run_dir, OPTIONS)
    assert streamed.token_distributions.method == "exact"
    _same(streamed, whole)
    # small batches, cutting requests of one part file apart from each other
    tiny = summarize_batches(iter_request_batches(run_dir, list(REQUEST_COLUMNS), batch_rows=7), OPTIONS)
    _same(tiny, whole)

    # ... and both equal the definitions computed on the whole table at once
    m = table.filter(pa.compute.equal(table["phase"], "measure"))
    ok = m.filter(m["ok"])
    for name, values in (("itl_ms", itl_ms(ok)), ("chunk_gap_ms", chunk_gap_ms(ok))):
        assert streamed.latency[name] == percentiles(values, OPTIONS.percentiles)
    sm = smoothness_metrics(ok, Deadlines(120, 9))
    assert streamed.smoothness.fluidity == percentiles(sm["fluidity"].to_numpy(), (1, 5, 10, 50))
    assert streamed.smoothness.longest_gap_ms == percentiles(sm["longest_gap_ms"].to_numpy(), (50, 90, 95, 99))
    assert streamed.requests.warmup_excluded > 0 and streamed.requests.cancelled_at_end > 0
    assert 0 < streamed.smoothness.fluidity["mean"] < 1  # the sample exercises misses


@pytest.mark.parametrize("multi_token", [True, False])
def test_past_the_exact_limit_the_summary_says_histogram(tmp_path: Path, multi_token: bool) -> None:
    run_dir = _random_run(tmp_path / "run", n=120, parts=3, multi_token=multi_token)
    exact = summarize_run(run_dir, OPTIONS)
    approx = summarize_batches(iter_request_batches(run_dir, list(REQUEST_COLUMNS), batch_rows=16), OPTIONS, exact_limit=50)
    td = approx.token_distributions
    assert td.method == "histogram" and td.max_relative_error == HISTOGRAM_RELATIVE_ERROR
    for name in ("itl_ms", "chunk_gap_ms"):
        e, a = exact.latency[name], approx.latency[name]
        assert a["n"] == e["n"] and a["mean"] == pytest.approx(e["mean"], rel=1e-12)
        for key in ("p1", "p50", "p90", "p99", "p99_9"):
            assert abs(a[key] - e[key]) <= HISTOGRAM_RELATIVE_ERROR * abs(e[key]) + 1e-12
    _same({k: v for k, v in approx.to_json().items() if k not in ("latency", "token_distributions")},
          {k: v for k, v in exact.to_json().items() if k not in ("latency", "token_distributions")})


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_histogram_percentiles_within_the_stated_bound(seed: int) -> None:
    rng = np.random.default_rng(seed)
    # heavy-tailed ITL-like values (ms): zeros (chunks sharing a read), sub-µs, ms, seconds
    values = np.r_[np.zeros(500), rng.uniform(0, 1e-3, 2_000), rng.lognormal(np.log(10), 0.6, 200_000), rng.pareto(1.5, 5_000) * 100]
    rng.shuffle(values)
    repeats = rng.integers(1, 4, len(values))
    d = PooledDistribution(exact_limit=1_000)
    for part, rep in zip(np.array_split(values, 13), np.array_split(repeats, 13)):
        d.add(part, rep)
    assert d.method == "histogram"
    ps = (0, 0.1, 1, 5, 25, 50, 75, 90, 95, 99, 99.9, 99.99, 100)
    truth = percentiles(np.repeat(values, repeats), ps)
    got = d.summary(ps)
    assert got["n"] == truth["n"] and got["mean"] == pytest.approx(truth["mean"], rel=1e-12)
    for key in truth:
        if key.startswith("p"):
            assert abs(got[key] - truth[key]) <= HISTOGRAM_RELATIVE_ERROR * abs(truth[key]), key
    # the bound is not vacuous: the histogram does move values
    assert any(got[k] != truth[k] for k in truth if k.startswith("p"))


def test_negative_values_keep_their_order() -> None:
    d = PooledDistribution(exact_limit=0)
    v = np.array([-5.0, -1.0, 0.0, 2.0, 7.0])
    d.add(v)
    got = d.summary((0, 25, 50, 100))
    truth = percentiles(v, (0, 25, 50, 100))
    for key in ("p0", "p25", "p50", "p100"):
        assert abs(got[key] - truth[key]) <= HISTOGRAM_RELATIVE_ERROR * abs(truth[key])


def test_a_run_without_request_files_streams_an_empty_summary(tmp_path: Path) -> None:
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    write_run_meta(run_dir, {"run_id": "e", "schema_version": "1.0", "bench_version": "0", "status": "complete"})
    s = summarize_run(run_dir, OPTIONS)
    assert s.requests.measured == 0 and s.latency["itl_ms"]["n"] == 0


def test_values_binned_off_thread_count_as_if_added() -> None:
    """``bin`` (run in the summary's worker threads) then ``add_binned`` gives the very state
    that ``add`` gives: the same bins, count and sum, NaNs, negatives, repeats and
    placeholders handled alike; and it is refused while the distribution is still exact."""
    rng = np.random.default_rng(7)
    direct, binned = PooledDistribution(exact_limit=10), PooledDistribution(exact_limit=10)
    start = rng.lognormal(2, 1, 50)
    direct.add(start)
    binned.add(start)
    assert direct.method == binned.method == "histogram"
    assert not PooledDistribution(exact_limit=10).add_binned(PooledDistribution.bin(start))  # exact: refused
    for i in range(6):
        v = np.r_[rng.lognormal(2, 1, 3_000), -rng.uniform(0, 5, 40 * (i % 2)), [np.nan] * i, np.zeros(7)]
        repeats = rng.integers(1, 4, len(v)) if i % 3 == 0 else None
        holes = None if repeats is not None else np.flatnonzero(v == 0)[: 3 + i % 2]
        direct.add(v, repeats, placeholders=holes)
        assert binned.add_binned(PooledDistribution.bin(v, repeats, holes))
    assert binned.n == direct.n and binned.total == direct.total
    assert binned._pos is not None and direct._pos is not None and binned._neg is not None and direct._neg is not None
    assert np.array_equal(binned._pos, direct._pos) and np.array_equal(binned._neg, direct._neg)
    assert binned._neg.sum() > 0  # the negative side was exercised
    ps = (1, 50, 99)
    assert binned.summary(ps) == direct.summary(ps)
