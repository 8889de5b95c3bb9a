"""Capacity maths on constructed data: the search, saturation, attainment, server signals."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest

from bench_llm.analysis.capacity import CapacitySearch, Probe, capacity_from_probes, passes
from bench_llm.analysis.capacity_points import point_metrics
from bench_llm.analysis.capacity_saturation import admission_saturation, closed_loop_plateau, open_loop_saturation
from bench_llm.analysis.load import load_run
from bench_llm.analysis.server_signals import server_signals
from bench_llm.analysis.slo import SLO
from bench_llm.results.schema import SERVER_METRICS_SCHEMA
from tests.helpers_records import record, write_run


def _search(true_capacity: float, **kw: float) -> CapacitySearch:
    s = CapacitySearch(**kw)  # type: ignore[arg-type]
    while (r := s.next_rate()) is not None:
        s.record(Probe(r, r <= true_capacity))
    return s


@pytest.mark.parametrize("true_cap,start", [(7.3, 1.0), (7.3, 40.0), (0.5, 1.0), (123.0, 2.0)])
def test_search_brackets_then_bisects_to_the_stated_precision(true_cap: float, start: float) -> None:
    s = _search(true_cap, start=start, precision=0.1, max_probes=20)
    res = s.result()
    assert res.converged
    assert res.capacity_rps is not None and res.upper_rps is not None
    assert res.capacity_rps <= true_cap < res.upper_rps
    assert (res.upper_rps - res.capacity_rps) <= 0.1 * res.capacity_rps * 1.0001
    # bracketing doubles or halves: never more probes than log2 range + bisection steps
    assert len(res.probes) <= 12


def test_search_stops_at_max_probes_and_says_it_did_not_converge() -> None:
    res = _search(7.3, start=1.0, precision=0.01, max_probes=4).result()
    assert len(res.probes) == 4
    assert not res.converged
    assert res.capacity_rps == 4.0 and res.upper_rps == 8.0


def test_search_nothing_passes_and_everything_passes() -> None:
    none = _search(0.0, start=1.0, min_rate=0.1, max_probes=20).result()
    assert none.capacity_rps is None and "no probed rate" in none.note
    assert min(p.rate for p in none.probes) == 0.1  # the floor itself is the last probe
    floor = _search(0.35, start=1.0, min_rate=0.3, max_probes=20).result()
    assert [p.rate for p in floor.probes][:3] == [1.0, 0.5, 0.3] and floor.capacity_rps is not None
    all_ = _search(1e9, start=1.0, max_rate=16.0, max_probes=20).result()
    assert all_.capacity_rps == 16.0 and all_.upper_rps is None and "at least" in all_.note


def test_noise_keeps_the_conservative_bracket() -> None:
    probes = [Probe(2, True), Probe(4, False), Probe(6, True), Probe(3, True)]
    res = capacity_from_probes(probes, 0.1)
    assert res.capacity_rps == 3 and res.upper_rps == 4
    assert "noise" in res.note


def test_passes_needs_attainment_and_no_saturation() -> None:
    assert passes(0.9, False, 90.0)
    assert not passes(0.89, False, 90.0)
    assert not passes(1.0, True, 90.0)
    assert not passes(float("nan"), False, 90.0)


def _open_loop_run(tmp: Path, n: int, gap_ms: float, service_ms: float, decode_ms: float = 5.0) -> Path:
    """One server slot: request i starts service when the previous one finished."""
    recs = []
    free_at = 0.0
    for i in range(n):
        arrive = i * gap_ms
        start = max(arrive, free_at)
        first = start + service_ms
        free_at = first
        recs.append(record(f"r{i}", arrive, [(first, 1), (first + decode_ms, 1), (first + 2 * decode_ms, 1)]))
    return write_run(tmp, recs, {"workload_json": '{"rate": %f, "mode": "open"}' % (1000.0 / gap_ms)})


def test_a_run_that_keeps_up_is_not_saturated(tmp_path: Path) -> None:
    run = load_run(_open_loop_run(tmp_path / "ok", 30, gap_ms=100, service_ms=50))
    sat = open_loop_saturation(run)
    assert not sat.saturated, sat


def test_a_run_behind_its_offered_rate_is_saturated(tmp_path: Path) -> None:
    run = load_run(_open_loop_run(tmp_path / "over", 30, gap_ms=100, service_ms=200))
    sat = open_loop_saturation(run)
    assert sat.saturated
    text = str(sat)
    assert "behind the offered" in text and "queueing grew" in text


def test_attainment_counts_failures_and_cancellations_as_misses(tmp_path: Path) -> None:
    recs = [record(f"r{i}", i * 100.0, [(i * 100.0 + 50, 1), (i * 100.0 + 60, 1)]) for i in range(8)]
    recs.append(record("slow", 900.0, [(900.0 + 900, 1), (900.0 + 910, 1)]))  # TTFT 900 ms: misses
    recs.append(record("gone", 1000.0, [], ok=False, error_type="cancelled", end_ms=5000.0))
    run = load_run(write_run(tmp_path / "r", recs, {"workload_json": '{"rate": 10.0}'}))
    m = point_metrics(run, SLO.parse("ttft_ms=200,tpot_ms=50"))
    assert m.requests == 10
    assert m.attainment == pytest.approx(0.8)
    assert m.miss_share["ttft_ms"] == pytest.approx(0.2)
    assert m.offered_rps == 10.0
    assert m.goodput_rps == pytest.approx(8 / m.window_s)
    assert math.isnan(m.server_kv_cache_usage_max)  # no server metrics: degrades to NaN


def test_requests_rejected_at_admission_saturate_the_load_and_say_so(tmp_path: Path) -> None:
    # TGI past --max-concurrent-requests: HTTP 200, then an "overloaded" event (2 of 10 here,
    # below the failed-share threshold, and the others keep up)
    recs = [record(f"r{i}", i * 100.0, [(i * 100.0 + 50, 1), (i * 100.0 + 60, 1)]) for i in range(8)]
    recs += [record(f"x{i}", 850.0 + i, [], ok=False, error_type="overloaded", end_ms=852.0 + i) for i in range(2)]
    run = load_run(write_run(tmp_path / "r", recs, {"workload_json": '{"rate": 10.0}'}))
    for sat in (open_loop_saturation(run), admission_saturation(run)):
        assert sat.saturated and "2 of 10 requests rejected at admission" in str(sat), sat
    assert point_metrics(run, SLO.parse("ttft_ms=200")).rejected_at_admission == 2
    clean = load_run(write_run(tmp_path / "c", recs[:8], {"workload_json": '{"rate": 10.0}'}))
    assert not admission_saturation(clean).saturated


def test_closed_loop_plateau() -> None:
    assert closed_loop_plateau(10.0, 8, 10.3, 16).saturated
    assert not closed_loop_plateau(10.0, 8, 17.0, 16).saturated


def test_server_signals_from_common_names() -> None:
    rows = []
    for i, (waiting, kv, pre, qsum, qcount) in enumerate(
        [(0, 0.2, 0, 0.0, 0), (1, 0.5, 0, 0.1, 2), (3, 0.9, 1, 0.5, 4), (6, 0.97, 2, 2.0, 6), (9, 0.99, 3, 4.0, 8), (12, 0.99, 3, 7.0, 10)]
    ):
        ts = i * 1_000_000_000
        rows += [
            {"ts_ns": ts, "metric": "vllm:num_requests_waiting", "common": "waiting", "type": "gauge", "value": float(waiting)},
            {"ts_ns": ts, "metric": "vllm:kv_cache_usage_perc", "common": "kv_cache_usage", "type": "gauge", "value": kv},
            {"ts_ns": ts, "metric": "vllm:num_preemptions_total", "common": "preemptions", "type": "counter", "value": float(pre)},
            {"ts_ns": ts, "metric": "vllm:request_queue_time_seconds_sum", "common": "queue_seconds", "type": "histogram_sum", "value": qsum},
            {"ts_ns": ts, "metric": "vllm:request_queue_time_seconds_count", "common": "queue_seconds", "type": "histogram_count", "value": float(qcount)},
        ]
    table = pa.Table.from_pylist(rows, schema=SERVER_METRICS_SCHEMA)
    sig = server_signals(table)
    assert sig["kv_cache_usage_max"] == pytest.approx(0.99)
    assert sig["preemptions"] == 3
    assert sig["queue_time_mean_ms"] == pytest.approx(700.0)
    assert sig["waiting_growth"] > 4
    assert server_signals(None) == {}
