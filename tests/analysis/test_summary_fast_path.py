"""The summary's fastest path (one token per chunk, zero-token frames only at a row's edges,
chunk lists used in place: analysis.metrics.token_ranges) gives exactly the figures of the
per-row definitions (docs/metrics.md), written out here as plain loops over each request.

The runs mix what real runs hold: role-only opening frames and usage-only closing frames
(0 tokens), reasoning before the answer, failed rows with and without chunks, rows with one
token or none, cancelled and warm-up rows, and stalls that miss the fluidity deadlines.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import bench_llm.analysis.summary as summary_module
from bench_llm.analysis.distributions import PooledDistribution, percentiles
from bench_llm.analysis.load import iter_request_batches, load_run
from bench_llm.analysis.metrics import token_range_gaps, token_ranges
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.smoothness import Deadlines, fluidity_reference
from bench_llm.analysis.summary import REQUEST_COLUMNS, SummaryOptions, summarize_batches, summarize_run
from bench_llm.results.record import RequestRecord
from tests.helpers_records import MS, record, write_run

OPTIONS = SummaryOptions((1, 50, 90, 99, 99.9), SLO.parse("ttft_ms=120,tpot_ms=9"))
DEADLINES = Deadlines(120, 9)


def _mixed_records(n: int = 300, seed: int = 5, middle_zero: bool = False) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    recs: list[RequestRecord] = []
    for i in range(n):
        send = float(rng.integers(0, 50_000))
        t = send + float(rng.choice([40, 90, 130, 400]))
        chunks: list[tuple[float, int]] = []
        if rng.random() < 0.7:
            chunks.append((send + 1, 0))  # role-only opening frame
        for _ in range(int(rng.integers(0, 40))):
            chunks.append((t, 1))
            t += float(rng.choice([0, 3.5, 8, 8.25, 11, 250]))
        if rng.random() < 0.8:
            chunks.append((t + 0.02, 0))  # usage-only closing frame
        if rng.random() < 0.1:
            chunks.append((t + 0.03, 0))  # and an empty one after it
        kind = rng.random()
        if kind < 0.08:
            rec = record(f"r{i}", send, chunks[:3], ok=False, error_type="http_error")
        elif kind < 0.11:
            rec = record(f"r{i}", send, [], ok=False, error_type="connect")
        elif kind < 0.15:
            rec = record(f"r{i}", send, chunks, ok=False, error_type="cancelled")
        elif kind < 0.2:
            rec = record(f"r{i}", send, chunks, phase="warmup")
        else:
            rec = record(f"r{i}", send, chunks, max_output_tokens=40)
            tokens = [ts for ts, k in zip(rec.chunk_ns, rec.chunk_tokens) if k]
            if len(tokens) > 3 and rng.random() < 0.3:  # reasoning first: the answer starts later
                rec = dataclasses.replace(rec, first_content_ns=tokens[3])
        recs.append(rec)
    recs.append(record("one", 10.0, [(11, 0), (60, 1), (60.01, 0)]))
    recs.append(record("frames-only", 20.0, [(21, 0), (22, 0)]))
    recs.append(record("nothing", 30.0, []))
    if middle_zero:  # an empty frame between two tokens: not the fastest path's layout
        recs.append(record("middle", 40.0, [(41, 0), (90, 1), (95, 0), (99, 1), (107, 1), (108, 0)]))
    return recs


def _reference(table: pa.Table) -> dict[str, np.ndarray]:
    """The definitions, request by request (rows in table order; ITL pooled over ok rows)."""
    itl: list[float] = []
    max_itl, fluidity, longest, ok_rows = [], [], [], []
    for row in table.to_pylist():
        if row["phase"] != "measure":
            continue
        arrivals = [t for t, k in zip(row["chunk_ns"] or [], row["chunk_tokens"] or []) for _ in range(k)]
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
        if row["ok"]:
            itl.extend(g / 1e6 for g in gaps)
        max_itl.append(max(gaps) / 1e6 if gaps else math.nan)
        longest.append(max(gaps) / 1e6 if gaps else math.nan)
        fluidity.append(fluidity_reference(row["send_ns"], arrivals, DEADLINES) if arrivals else math.nan)
        ok_rows.append(bool(row["ok"]))
    ok = np.array(ok_rows)
    return {
        "itl": np.array(itl),
        "max_itl_ok": np.array(max_itl)[ok],
        "fluidity_ok": np.array(fluidity)[ok],
        "longest_ok": np.array(longest)[ok],
    }


def _check_against_reference(s: dict, table: pa.Table) -> None:
    ref = _reference(table)
    assert s.latency["itl_ms"] == percentiles(ref["itl"], OPTIONS.percentiles)
    assert s.latency["chunk_gap_ms"] == percentiles(ref["itl"], OPTIONS.percentiles)  # one token per chunk
    assert s.latency["max_itl_ms"] == percentiles(ref["max_itl_ok"], OPTIONS.percentiles)
    assert s.smoothness.fluidity == percentiles(ref["fluidity_ok"], (1, 5, 10, 50))
    assert s.smoothness.longest_gap_ms == percentiles(ref["longest_ok"], (50, 90, 95, 99))
    assert 0 < s.smoothness.fluidity["mean"] < 1  # the sample exercises misses


def _no_other_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("the fastest path should have taken this batch")

    monkeypatch.setattr(summary_module, "one_token_chunks", refuse)
    monkeypatch.setattr(summary_module, "token_chunks", refuse)


def test_fast_path_equals_the_per_row_definitions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = write_run(tmp_path / "run", _mixed_records())
    table = load_run(run_dir).requests
    assert token_ranges(table.combine_chunks().to_batches()[0]) is not None
    _no_other_path(monkeypatch)
    s = summarize_run(run_dir, OPTIONS)
    assert s.token_distributions.method == "exact"
    assert s.requests.failed > 0 and s.requests.cancelled_at_end > 0 and s.requests.warmup_excluded > 0
    _check_against_reference(s, table)
    # batches that cut the run anywhere give the same summary
    tiny = summarize_batches(iter_request_batches(run_dir, list(REQUEST_COLUMNS), batch_rows=3), OPTIONS)
    assert json.dumps(tiny.to_json(), sort_keys=True, default=str) == json.dumps(s.to_json(), sort_keys=True, default=str)


def test_a_zero_token_frame_between_tokens_takes_the_other_path_with_the_same_definitions(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", _mixed_records(middle_zero=True))
    table = load_run(run_dir).requests
    assert token_ranges(table.combine_chunks().to_batches()[0]) is None
    _check_against_reference(summarize_run(run_dir, OPTIONS), table)


def test_multi_token_chunks_are_not_the_fast_path() -> None:
    batch = pa.RecordBatch.from_pydict(
        {"chunk_ns": [[1, 2, 3]], "chunk_tokens": [[0, 2, 1]]},
        schema=pa.schema([("chunk_ns", pa.list_(pa.int64())), ("chunk_tokens", pa.list_(pa.int32()))]),
    )
    assert token_ranges(batch) is None


def test_token_range_gaps_mark_every_non_gap(tmp_path: Path) -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "chunk_ns": [[5, 10, 20, 35, 36], [40, 41], [50, 70, 75], [], [80, 90, 91]],
            "chunk_tokens": [[0, 1, 1, 1, 0], [0, 0], [1, 1, 1], [], [1, 1, 0]],
        },
        schema=pa.schema([("chunk_ns", pa.list_(pa.int64())), ("chunk_tokens", pa.list_(pa.int32()))]),
    )
    ranges = token_ranges(batch)
    assert ranges is not None
    assert ranges.start.tolist() == [1, 7, 7, 10, 10] and ranges.end.tolist() == [4, 7, 10, 10, 12]
    ok = np.array([True, True, False, True, True])
    gaps, excluded, longest = token_range_gaps(ranges, ok)
    kept = np.delete(gaps, excluded)
    assert kept.tolist() == [10, 15, 10]  # row 0: 20-10, 35-20; row 2 failed; row 4: 90-80
    assert (gaps[excluded] == 0).all()
    assert np.isnan(longest[[1, 3]]).all() and longest[[0, 2, 4]].tolist() == [15, 20, 10]


@pytest.mark.parametrize("exact_limit", [50, 5000])
def test_placeholders_count_as_nothing_past_the_exact_limit(exact_limit: int) -> None:
    rng = np.random.default_rng(3)
    with_holes = PooledDistribution(exact_limit)
    same_as = PooledDistribution(exact_limit)
    plain = PooledDistribution(exact_limit)
    for _ in range(7):
        values = rng.lognormal(np.log(10), 0.5, 300)
        holes = np.sort(rng.choice(300, 40, replace=False))
        values[holes] = 0.0
        with_holes.add(values, placeholders=holes)
        same_as.add(values, same_as=with_holes, placeholders=holes)
        plain.add(np.delete(values, holes))
    ps = (0, 1, 50, 99, 100)
    want = plain.summary(ps)
    for got in (with_holes.summary(ps), same_as.summary(ps)):
        assert got["n"] == want["n"] == 7 * 260
        assert got["mean"] == pytest.approx(want["mean"], rel=1e-12)
        assert {k: v for k, v in got.items() if k.startswith("p")} == {k: v for k, v in want.items() if k.startswith("p")}
    assert with_holes.method == ("histogram" if exact_limit == 50 else "exact")


def test_fluidity_at_the_deadline_boundaries() -> None:
    """First token exactly at its deadline, gaps of exactly one interval, one nanosecond over
    with and without banked slack: the in-place fluidity equals the definition's loop."""
    from bench_llm.analysis.smoothness import token_range_fluidity

    dp, dd = 120 * MS, 9 * MS
    rows = [
        (0, [0, dp, dp + dd, dp + 2 * dd, dp + 2 * dd + 20]),  # on time to the nanosecond: no miss
        (0, [0, dp, dp + dd + 1, dp + 2 * dd + 1]),  # one ns late: one miss, then re-based
        (0, [0, dp - 5 * MS, dp - 5 * MS + dd + 1, dp - 5 * MS + 2 * dd + 2]),  # gaps over D_d, covered by slack
        (0, [0, dp + 1]),  # first token one ns late
        (1000, [1000, 1000 + dp]),  # a single token, on time
    ]
    toks = [[0] + [1] * (len(ts) - 2) + [0] if i == 0 else [0] + [1] * (len(ts) - 1) for i, (_, ts) in enumerate(rows)]
    batch = pa.RecordBatch.from_pydict(
        {"chunk_ns": [ts for _, ts in rows], "chunk_tokens": toks},
        schema=pa.schema([("chunk_ns", pa.list_(pa.int64())), ("chunk_tokens", pa.list_(pa.int32()))]),
    )
    ranges = token_ranges(batch)
    assert ranges is not None
    _, _, longest = token_range_gaps(ranges, np.ones(len(rows), bool))
    send = np.array([float(s) for s, _ in rows])
    fluidity, misses = token_range_fluidity(ranges, send, DEADLINES, longest)
    want = []
    for (s, ts), tk in zip(rows, toks):
        arrivals = [t for t, k in zip(ts, tk) if k]
        want.append(fluidity_reference(s, arrivals, DEADLINES))
    assert fluidity.tolist() == pytest.approx(want, abs=1e-15)  # 1 − misses/tokens vs met/tokens
    assert misses.tolist() == [0, 1, 0, 1, 0]


@pytest.mark.parametrize("group_bytes", [1, 40_000, 8 << 20])  # every file streamed alone, groups of a few, one group
def test_request_batches_come_in_file_order_however_files_are_grouped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group_bytes: int
) -> None:
    import bench_llm.analysis.load as load
    from bench_llm.results.writer import RequestsWriter, write_run_meta

    recs = _mixed_records(n=240)
    run_dir = tmp_path / "run"
    write_run_meta(run_dir, {"run_id": "t", "schema_version": "1.0", "bench_version": "0", "status": "complete"})
    w = RequestsWriter(run_dir, "t")
    for part in np.array_split(np.arange(len(recs)), 9):
        w.write([{f: getattr(recs[j], f) for f in recs[j].__dataclass_fields__} for j in part])
    monkeypatch.setattr(load, "GROUP_BYTES", group_bytes)
    batches = list(iter_request_batches(run_dir, ["request_id", "chunk_ns"], batch_rows=16))
    assert all(0 < b.num_rows <= 16 for b in batches)
    got = pa.Table.from_batches(batches)
    want = load_run(run_dir).requests.select(["request_id", "chunk_ns"])
    assert got.equals(want)
    assert got.column("request_id").to_pylist() == [r.request_id for r in recs]


def test_read_requests_fills_columns_an_older_part_lacks(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from bench_llm.results.reader import read_requests
    from bench_llm.results.schema import REQUESTS_SCHEMA

    run_dir = write_run(tmp_path / "run", _mixed_records(n=20))
    part = next((run_dir / "requests").glob("*.parquet"))
    old = pq.read_table(part).drop_columns(["output_text", "cached_tokens"])
    pq.write_table(old, run_dir / "requests" / "part-000-999999.parquet")  # a part without two columns
    table = read_requests(run_dir)
    assert table.schema.equals(REQUESTS_SCHEMA) and table.num_rows == 2 * old.num_rows
    assert table.slice(old.num_rows)["cached_tokens"].null_count == old.num_rows
    assert table.slice(old.num_rows).drop_columns(["output_text", "cached_tokens"]).equals(old.cast(old.schema))


def test_parts_written_after_the_per_request_columns_were_read_are_not_mismatched(tmp_path: Path) -> None:
    """A run still recording: the per-request table handed in is older than the parts."""
    from bench_llm.analysis.summary import REQUEST_SCALAR_COLUMNS
    from bench_llm.results.writer import RequestsWriter

    recs = _mixed_records(n=120)
    run_dir = write_run(tmp_path / "run", recs[:60])
    early = load_run(run_dir, list(REQUEST_SCALAR_COLUMNS)).requests
    w = RequestsWriter(run_dir, "test")
    w._seq = 1  # the next part file
    w.write([{f: getattr(r, f) for f in r.__dataclass_fields__} for r in recs[60:]])
    late = summarize_run(run_dir, OPTIONS, requests=early)
    assert late.requests.rows == len(recs)
    assert json.dumps(late.to_json(), sort_keys=True, default=str) == json.dumps(summarize_run(run_dir, OPTIONS).to_json(), sort_keys=True, default=str)


def _many_parts(run_dir: Path, parts: int = 20) -> list[RequestRecord]:
    from bench_llm.results.writer import RequestsWriter, write_run_meta

    recs = _mixed_records(n=200)
    write_run_meta(run_dir, {"run_id": "t", "schema_version": "1.0", "bench_version": "0", "status": "complete"})
    w = RequestsWriter(run_dir, "t")
    for part in np.array_split(np.arange(len(recs)), parts):
        w.write([{f: getattr(recs[j], f) for f in recs[j].__dataclass_fields__} for j in part])
    return recs


def test_compacting_keeps_every_row_in_order_and_the_summary(tmp_path: Path) -> None:
    from bench_llm.results.reader import read_requests
    from bench_llm.results.writer import compact_requests

    run_dir = tmp_path / "run"
    _many_parts(run_dir)
    before, summary = read_requests(run_dir), summarize_run(run_dir, OPTIONS)
    if not compact_requests(run_dir, file_bytes=60_000, row_group_rows=16):  # files end at a row group
        pytest.skip("no atomic directory swap (renameat2 RENAME_EXCHANGE) on this platform or file system")
    files = sorted((run_dir / "requests").glob("*.parquet"))
    assert 2 <= len(files) <= 5 and not any(p.name.startswith(".") for p in run_dir.iterdir() if p.name != ".")
    assert read_requests(run_dir).equals(before)
    assert json.dumps(summarize_run(run_dir, OPTIONS).to_json(), sort_keys=True, default=str) == json.dumps(summary.to_json(), sort_keys=True, default=str)


def test_compacting_changes_nothing_where_the_swap_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench_llm.results.writer as writer

    run_dir = tmp_path / "run"
    _many_parts(run_dir)
    names = sorted(p.name for p in (run_dir / "requests").iterdir())
    monkeypatch.setattr(writer, "_exchange", lambda a, b: False)
    assert writer.compact_requests(run_dir, file_bytes=60_000) is False
    assert sorted(p.name for p in (run_dir / "requests").iterdir()) == names
    assert sorted(p.name for p in run_dir.iterdir()) == ["requests", "run.parquet"]
