"""One attainment rule and one set of run totals (analysis/totals.py): the summary, a sweep
point (capacity), the bootstrap behind compare and gate, and the report agree on one run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench_llm.analysis.bootstrap import make_side, point_estimates
from bench_llm.analysis.capacity_points import point_metrics
from bench_llm.analysis.compare import compare_paths
from bench_llm.analysis.gate import GateConfig, GateSettings, MetricGate, run_gate
from bench_llm.analysis.load import load_run
from bench_llm.analysis.report.data import build_run_view, load_points
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.summary import SummaryOptions, summarize_run
from bench_llm.analysis.totals import run_totals
from tests.helpers_records import MS, record, write_run

SLO_TEXT = "ttft_ms=50"


def _run(tmp_path: Path) -> Path:
    recs = [record(f"ok{i}", 100.0 * i, [(100.0 * i + 10, 1), (100.0 * i + 20, 1)]) for i in range(6)]
    recs.append(record("slow", 650.0, [(750.0, 1), (760.0, 1)]))  # ok, misses TTFT
    recs.append(record("failed", 700.0, [], ok=False, error_type="http_error"))
    # still running at the drain deadline: the slowest; misses, not errors, and in the window
    recs += [record(f"c{i}", 800.0 + i, [(900.0, 1)], ok=False, error_type="cancelled", end_ms=3000.0) for i in range(2)]
    bad = record("neg", 900.0, [(910.0, 1), (920.0, 1)])  # first token before the send: an anomaly
    recs.append(replace(bad, send_ns=int(915 * MS), first_byte_ns=int(915 * MS), intended_send_ns=int(915 * MS)))
    return write_run(tmp_path / "run", recs, {"config_json": {"slo": {"ttft_ms": 50.0}}})


def test_summary_capacity_bootstrap_gate_and_report_agree_on_one_run(tmp_path: Path) -> None:
    run_dir = _run(tmp_path)
    slo = SLO.parse(SLO_TEXT)
    run = load_run(run_dir)
    s = summarize_run(run_dir, SummaryOptions(slo=slo))
    # the rule: 6 met of 10 judged (anomaly out; failed and both cancelled are misses)
    assert (s.slo.met, s.slo.judged) == (6, 10)
    assert s.slo.attainment == pytest.approx(0.6)
    window = 3.0  # 0 .. 3000 ms: the cancelled requests' end
    assert s.window_s == pytest.approx(window)
    assert s.throughput.requests_per_s == pytest.approx(7 / window)
    assert s.slo.goodput_rps == pytest.approx(6 / window)
    assert s.requests.error_rate == pytest.approx(1 / 8)

    point = point_metrics(run, slo)
    boot = point_estimates(make_side([run.requests], slo), ["slo_attainment", "goodput_rps", "requests_per_s", "error_rate"])
    gate = run_gate(run_dir, run_dir, GateConfig(GateSettings(resamples=100, slo={"ttft_ms": 50.0}), {"slo_attainment": MetricGate(min=0.0)}))
    gated = {c.metric: c.current for g in gate.comparison.groups for c in g.changes}
    compared = {c.metric: c.current for g in compare_paths(run_dir, run_dir, ["goodput_rps"], slo).groups for c in g.changes}
    view = build_run_view(run, "", slo)
    report = load_points([run], [view], slo)[0].metrics

    for attainment in (point.attainment, boot["slo_attainment"], gated["slo_attainment"], report["slo_attainment"], view.summary.slo.attainment):
        assert attainment == pytest.approx(s.slo.attainment)
    for goodput in (point.goodput_rps, boot["goodput_rps"], compared["goodput_rps"], report["goodput_rps"]):
        assert goodput == pytest.approx(s.slo.goodput_rps)
    for rps in (point.throughput_rps, boot["requests_per_s"], report["requests_per_s"]):
        assert rps == pytest.approx(s.throughput.requests_per_s)
    assert point.window_s == pytest.approx(s.window_s)
    assert boot["error_rate"] == pytest.approx(s.requests.error_rate)
    assert point.anomalies == s.requests.anomalies == 1
    lo, hi = s.slo.attainment_interval
    assert (point.attainment_low, point.attainment_high) == pytest.approx((lo, hi))
    assert lo < 0.6 < hi


def test_run_totals_without_an_slo_has_no_attainment(tmp_path: Path) -> None:
    from bench_llm.analysis.metrics import measured, request_metrics

    df = request_metrics(measured(load_run(_run(tmp_path)).requests))
    t = run_totals(df)
    assert t.met is None and t.attainment != t.attainment and t.goodput_rps != t.goodput_rps
    assert (t.judged, t.ok, t.cancelled, t.failed) == (11, 8, 2, 1)  # no anomaly column given: all judged
