"""Each metric computed by hand on small constructed records (docs/metrics.md)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from bench_llm.analysis.load import load_run
from bench_llm.analysis.metrics import chunk_gap_ms, itl_ms, measured, request_metrics
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.summary import SummaryOptions, summarize
from tests.helpers_records import record, write_run


@pytest.fixture()
def run(tmp_path: Path):  # type: ignore[no-untyped-def]
    recs = [
        # send 0; role frame (0 tokens) at 5; first token at 100; then 1 token at 110,
        # a 2-token chunk at 130, usage frame (0) at 131; end 131
        record("a", 0, [(5, 0), (100, 1), (110, 1), (130, 2), (131, 0)]),
        # send 1000, first token 1200, then one 3-token chunk at 1260
        record("b", 1000, [(1200, 1), (1260, 3)], end_ms=1265),
        # failed request (HTTP 500): counted, never in latency statistics
        record("c", 500, [], ok=False, error_type="http_error", end_ms=501),
        # warm-up: excluded entirely
        record("w", -500, [(-400, 1), (-390, 1)], phase="warmup"),
    ]
    return load_run(write_run(tmp_path / "run", recs))


def test_per_request_metrics(run) -> None:  # type: ignore[no-untyped-def]
    df = request_metrics(measured(run.requests)).set_index("request_id")
    assert df.loc["a", "ttft_ms"] == pytest.approx(100)
    assert df.loc["a", "e2e_ms"] == pytest.approx(131)
    # TPOT = (E2E - TTFT) / (output tokens - 1) = (131 - 100) / 3
    assert df.loc["a", "tpot_ms"] == pytest.approx(31 / 3)
    assert df.loc["b", "ttft_ms"] == pytest.approx(200)
    assert df.loc["b", "tpot_ms"] == pytest.approx((265 - 200) / 3)
    assert math.isnan(df.loc["c", "ttft_ms"])


def test_itl_spreads_multi_token_chunks(run) -> None:  # type: ignore[no-untyped-def]
    ok = measured(run.requests).filter(measured(run.requests)["ok"])
    # a: gaps 10 (1 token), 20 (2 tokens -> 10, 10); b: 60 over 3 tokens -> 20, 20, 20
    assert sorted(itl_ms(ok).tolist()) == pytest.approx([10, 10, 10, 20, 20, 20])
    # raw chunk gaps: one per chunk
    assert sorted(chunk_gap_ms(ok).tolist()) == pytest.approx([10, 20, 60])


def test_summary_counts_throughput_and_goodput(run) -> None:  # type: ignore[no-untyped-def]
    s = summarize(run.requests, SummaryOptions((50, 99), SLO.parse("ttft_ms=150")))
    r = s.requests
    assert (r.measured, r.ok, r.failed, r.warmup_excluded) == (3, 2, 1, 1)
    assert r.errors == {"http_error": 1}
    assert r.error_rate == pytest.approx(1 / 3)
    # window: first intended send (0 ms) to last end (1265 ms)
    assert s.window_s == pytest.approx(1.265)
    assert s.throughput.requests_per_s == pytest.approx(2 / 1.265)
    assert s.throughput.output_tokens_per_s == pytest.approx(8 / 1.265)
    assert s.throughput.total_tokens_per_s == pytest.approx((8 + 20) / 1.265)
    # TTFT p50 over a (100) and b (200)
    assert s.latency["ttft_ms"]["p50"] == pytest.approx(150)
    # SLO ttft<=150: only a meets it; the failed request counts as a miss
    assert s.slo.met == 1
    assert s.slo.attainment == pytest.approx(1 / 3)
    assert s.slo.goodput_rps == pytest.approx(1 / 1.265)


def test_percentiles_are_numpy_linear(tmp_path: Path) -> None:
    recs = [record(f"r{i}", 0, [(t, 1), (t + 5, 1)]) for i, t in enumerate([10, 20, 30, 40, 50])]
    run = load_run(write_run(tmp_path / "r", recs))
    s = summarize(run.requests, SummaryOptions((50, 90)))
    assert s.latency["ttft_ms"]["p90"] == pytest.approx(np.percentile([10, 20, 30, 40, 50], 90))


def test_token_mismatch_and_short_output_are_counted(tmp_path: Path) -> None:
    recs = [
        record("a", 0, [(10, 1), (20, 1)], completion_tokens=3),
        record("b", 0, [(10, 1), (20, 1)], max_output_tokens=5),
        record("c", 0, [(10, 1), (20, 2)], max_output_tokens=2),  # a TGI segment overshoot
    ]
    s = summarize(load_run(write_run(tmp_path / "r", recs)).requests)
    assert s.tokens.chunk_vs_server_mismatches == 1
    assert s.tokens.shorter_than_requested == 1
    assert s.tokens.longer_than_requested == 1


def test_request_metrics_of_the_same_table_twice_is_a_fresh_copy(run) -> None:  # type: ignore[no-untyped-def]
    from bench_llm.analysis.metrics import clear_cache

    table = measured(run.requests)
    first = request_metrics(table)
    expected = first.copy()
    first["ttft_ms"] = -1.0  # a caller changing its frame (point_metrics adds columns)
    first["anomaly"] = True
    again = request_metrics(table)  # the kept frame, copied
    assert again is not first and "anomaly" not in again
    assert again.equals(expected)
    clear_cache()
    assert request_metrics(table).equals(expected)  # recomputed: the same figures
