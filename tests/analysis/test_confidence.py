"""Stated confidence (issue 18): Wilson intervals on attainment, probe verdicts that wait for
their interval to clear the target, capacity as a bracket, separation, under-sampled loads,
and untrustworthy ones (issue 16 item 3) — on constructed outcomes, no engine."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from bench_llm.analysis.capacity import CapacitySearch, Probe, capacity_from_probes, judge_load
from bench_llm.analysis.capacity_steady import long_enough
from bench_llm.analysis.confidence import (
    attainment_verdict,
    interval_verdict,
    requests_to_pass,
    separation,
    wilson_interval,
)


@pytest.mark.parametrize(
    "k,n,lo,hi",
    [
        (0, 10, 0.0, 0.2775),  # never 0 wide at the ends, unlike the normal approximation
        (10, 10, 0.7225, 1.0),
        (5, 10, 0.2366, 0.7634),
        (30, 30, 0.8865, 1.0),
        (90, 100, 0.8256, 0.9448),
        (900, 1000, 0.8798, 0.9171),
    ],
)
def test_wilson_interval_on_known_values(k: int, n: int, lo: float, hi: float) -> None:
    assert wilson_interval(k, n) == pytest.approx((lo, hi), abs=1e-4)


def test_wilson_interval_narrows_with_n_and_is_empty_without_requests() -> None:
    widths = [(lambda lh: lh[1] - lh[0])(wilson_interval(int(0.9 * n), n)) for n in (20, 80, 320, 1280)]
    assert widths == sorted(widths, reverse=True) and widths[-1] < widths[0] / 7
    assert all(math.isnan(v) for v in wilson_interval(0, 0))
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_a_verdict_needs_the_whole_interval_on_one_side_of_the_target() -> None:
    assert attainment_verdict(30, 30, 0.9) == "undecided"  # 100 % of 30: the interval reaches 88.6 %
    assert attainment_verdict(35, 35, 0.9) == "pass"
    assert requests_to_pass(0.9) == 35 and requests_to_pass(0.99) == 381
    assert attainment_verdict(9, 10, 0.9) == "undecided"
    assert attainment_verdict(900, 1000, 0.85) == "pass"
    assert attainment_verdict(800, 1000, 0.85) == "fail"
    assert attainment_verdict(0, 6, 0.9) == "fail"  # a handful of requests can fail decisively
    assert attainment_verdict(100, 100, 1.0) == "pass" and attainment_verdict(99, 100, 1.0) == "fail"
    assert attainment_verdict(0, 0, 1.0) == "undecided"  # no requests: nothing to judge, even at 100 %


def test_an_interval_decides_only_wholly_on_one_side() -> None:
    assert interval_verdict(0.9, 0.95, 0.9) == "pass"  # at the target counts
    assert interval_verdict(0.8, 0.8999, 0.9) == "fail"
    assert interval_verdict(0.85, 0.95, 0.9) == "undecided"
    assert interval_verdict(math.nan, math.nan, 0.9) == "undecided"


def _row(met: int, n: int, **kw: Any) -> dict[str, Any]:
    return {"met": met, "requests": n, "attainment": met / n, "saturated": False, **kw}


def test_a_load_with_too_few_requests_cannot_decide_a_capacity() -> None:
    small = judge_load([_row(20, 20)], 90.0)
    assert small.verdict == "undecided" and small.needs_more
    assert "fewer than the 35 requests a pass needs" in small.reason
    # the same load measured again (a repeat, or more requests) feeds the same interval
    pooled = judge_load([_row(20, 20), _row(20, 20)], 90.0)
    assert pooled.verdict == "pass" and (pooled.met, pooled.judged) == (40, 40)
    # an undecided load never becomes "the capacity"
    res = capacity_from_probes([Probe(4, True), Probe(8, False, undecided=True, reason=small.reason)], 0.1)
    assert res.capacity_rps == 4 and res.upper_rps is None and res.undecided == (8,)
    assert "undecided at 8 req/s" in res.note


def test_an_under_sampled_load_cannot_pass_but_can_fail() -> None:
    why = long_enough(0.9, 0.5, 20)  # sent for 0.9 s where a long request lives 0.5 s
    assert why is not None and "no steady state yet" in why
    assert long_enough(10.0, 0.5, 20) is None
    passing = judge_load([_row(200, 200, under_sampled=why)], 90.0)
    assert passing.verdict == "undecided" and passing.reason.startswith("under-sampled")
    # one long enough run of the same load settles it
    assert judge_load([_row(200, 200, under_sampled=why), _row(200, 200)], 90.0).verdict == "pass"
    assert judge_load([_row(20, 200, under_sampled=why)], 90.0).verdict == "fail"


def test_an_untrustworthy_run_decides_nothing() -> None:
    bad = _row(0, 100, untrustworthy="client saturated: send lag p99 40.0 ms > 5 ms")
    j = judge_load([bad], 90.0)
    assert j.verdict == "undecided" and j.untrustworthy and not j.needs_more
    # re-measured truthfully: only the trustworthy run counts
    j2 = judge_load([bad, _row(100, 100)], 90.0)
    assert j2.verdict == "pass" and j2.judged == 100


def test_saturation_fails_a_load_whatever_its_attainment() -> None:
    j = judge_load([_row(100, 100, saturated=True, saturation_reason="queueing grew")], 90.0)
    assert j.verdict == "fail" and "queueing grew" in j.reason


def test_the_search_bisects_below_an_undecided_rate() -> None:
    s = CapacitySearch(start=4.0, precision=0.1)
    s.record(Probe(4.0, True))
    assert s.next_rate() == 8.0
    s.record(Probe(8.0, False, undecided=True))
    assert s.next_rate() == 6.0  # nothing above an undecided rate can be claimed
    s.record(Probe(6.0, True))
    s.record(Probe(7.0, False))
    res = s.result()
    assert (res.capacity_rps, res.upper_rps, res.undecided) == (6.0, 7.0, (8.0,))


def test_separation_of_two_capacity_brackets() -> None:
    assert separation("a", (10.0, 12.0), "b", (6.0, 8.0)).separated
    close = separation("a", (10.0, 12.0), "b", (9.0, 11.0))
    assert not close.separated and "too close to call" in close.text
    assert not separation("a", (10.0, None), "b", (9.0, None)).separated  # b never failed


def test_a_sweep_load_with_too_few_requests_stays_undecided_and_is_no_capacity(tmp_path: Path) -> None:
    """12 requests, all meeting the SLOs, then 8 more (the --max-requests limit of 20): 100 %
    of 20 has an interval reaching 83.9 %, so at a 90 % target the load is undecided, and the
    sweep reports no capacity rather than 10 req/s."""
    import json

    from bench_llm.analysis.recommend import recommend
    from bench_llm.analysis.recommend_io import load_points
    from bench_llm.analysis.recommend_text import format_recommendation
    from bench_llm.analysis.recommend_types import Recommendation
    from bench_llm.bench.sweep.orchestrate import run_sweep
    from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec, WorkloadSpec
    from bench_llm.bench.sweep.store import read_cells
    from tests.sweep_fakes import FixedSimLauncher

    spec = SweepSpec(
        model="m",
        gpus=1,
        matrix=MatrixSpec(tp=(1,)),
        loads=LoadSpec(rates=(10.0,), requests=12, max_requests=20, warmup=0),
        workloads=(WorkloadSpec(input_tokens=32, output_tokens=8),),
        slo={"ttft_ms": 5000.0},
        attainment_pct=90.0,
    )
    out = tmp_path / "sweep"
    lines: list[str] = []
    run_sweep(spec, out, launcher=FixedSimLauncher(), echo=lines.append, progress=False)
    cell = read_cells(out)[0]
    cap = json.loads(cell["capacity_json"])["in32-out8"]
    assert cap["capacity_rps"] is None and cap["undecided"] == [10.0]
    pts = load_points(out)
    assert len(pts) >= 2 and int(pts["requests"].sum()) <= 20 + 12  # measured more, within the limit
    assert pts.iloc[0]["verdict"] == "undecided" and "fewer than the 35 requests" in pts.iloc[0]["verdict_reason"]
    assert any("undecided" in ln and "more requests" in ln for ln in lines)
    rec = recommend(out).to_json()
    assert rec["recommendation"] is None
    assert any(u.startswith("tp1 at 10 req/s") for u in rec["workloads"]["in32-out8"]["undecided"] + rec["untrustworthy"])
    assert "undecided" in format_recommendation(Recommendation.from_json(rec)).lower()


def test_a_client_delay_makes_a_load_untrustworthy_only_where_it_matters() -> None:
    from bench_llm.analysis.capacity_saturation import untrustworthy
    from bench_llm.analysis.slo import SLO
    from bench_llm.analysis.summary_types import ClientHealth

    busy = ClientHealth(schedule_lag_p99_ms=30.0, loop_lag_p99_ms=400.0, warnings=["client saturated: x"], saturated=True)
    calm = ClientHealth(schedule_lag_p99_ms=float("nan"))
    loose, tight = SLO.parse("ttft_ms=1000"), SLO.parse("ttft_ms=200")
    assert untrustworthy(0, 100, busy, loose, 10.0, 1.0, "kernel") is None  # 30 ms against 1 s: cannot flip it
    assert untrustworthy(0, 100, busy, tight, 10.0, 1.0, "kernel")  # 30 ms against 200 ms: could
    assert untrustworthy(0, 100, busy, loose, 10.0, 1.0, "user")  # reads stamped 400 ms late
    assert "behind the schedule" in str(untrustworthy(0, 100, busy, loose, 10.0, 150.0, "kernel"))
    assert untrustworthy(0, 100, calm, tight) is None
    assert untrustworthy(2, 100, calm) == "2 of 100 records anomalous"
    assert untrustworthy(1, 100, calm) is None  # 1 %: counted, excluded, not decisive


def test_confidence_zero_is_the_point_estimate_and_old_sweeps_keep_it() -> None:
    import json

    from bench_llm.bench.sweep.spec import SweepSpec, spec_from_dict

    assert wilson_interval(9, 10, 0.0) == pytest.approx((0.9, 0.9))
    assert judge_load([_row(9, 10)], 90.0, 0.0).verdict == "pass"
    assert judge_load([_row(9, 10)], 90.0).verdict == "undecided"
    assert SweepSpec(model="m").confidence == 0.95
    old = json.loads(json.dumps(SweepSpec(model="m").as_dict()))
    del old["confidence"]  # a sweep.json written before verdicts had intervals
    assert spec_from_dict(old).confidence == 0.0


def test_a_load_with_a_saturated_client_is_measured_again_with_more_client_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench_llm.bench.sweep import cell_loads
    from bench_llm.bench.sweep.orchestrate import run_sweep
    from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec, WorkloadSpec
    from tests.sweep_fakes import FixedSimLauncher

    real = cell_loads.run_load
    seen: list[int] = []

    def first_one_untrustworthy(**kw: Any) -> Any:
        seen.append(kw["spec"].workers)
        from dataclasses import replace

        measured = real(**kw)
        # the policy reads the row's flag, not the reason's wording: the reason names no client
        figures = replace(measured.figures, untrustworthy=None if len(seen) > 1 else "forced by the test",
                          client_saturated=len(seen) == 1)  # fmt: skip
        return replace(measured, figures=figures)

    monkeypatch.setattr(cell_loads, "run_load", first_one_untrustworthy)
    spec = SweepSpec(
        model="m", gpus=1, matrix=MatrixSpec(tp=(1,)),
        loads=LoadSpec(rates=(10.0,), requests=8, warmup=0),
        workloads=(WorkloadSpec(input_tokens=32, output_tokens=8),),
        slo={"ttft_ms": 5000.0}, confidence=0.0,
    )  # fmt: skip
    lines: list[str] = []
    run_sweep(spec, tmp_path / "s", launcher=FixedSimLauncher(), echo=lines.append, progress=False)
    assert seen == [1, 2]  # the same load again, with twice the client processes
    assert any("measuring again with 2 client processes" in ln for ln in lines)
