"""Steady state, correlation and the verdict (analysis/capacity_steady.py, docs/sweeps.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench_llm.analysis.capacity import Probe, capacity_from_probes, judge_load
from bench_llm.analysis.capacity_steady import design_effect, long_enough, stationarity


def test_a_short_load_says_how_many_more_requests_it_needs() -> None:
    # 40 requests sent over 10 s; the workload's long requests live 4 s: 16 s of sending needed
    why = long_enough(10.0, 4.0, 40)
    assert why is not None and why.startswith("undecided: 24 more requests needed")
    assert long_enough(16.0, 4.0, 40) is None


def _load(n: int, rate: float, life_s: float, growth: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Requests sent at ``rate``, each living ``life_s`` (times 1 + growth over the run)."""
    t = np.arange(n) / rate * 1e9
    return t, t.copy(), t + life_s * (1.0 + growth * np.arange(n) / n) * 1e9


def test_a_load_whose_requests_in_flight_keep_growing_is_not_stationary() -> None:
    t, s, e = _load(2000, 20.0, 5.0)
    assert stationarity(t, s, e, None, 5.0) is None
    t, s, e = _load(2000, 20.0, 5.0, growth=2.0)  # lifetimes triple over the run: a queue builds
    why = stationarity(t, s, e, None, 5.0)
    assert why is not None and why.startswith("not stationary") and "in flight grew" in why


def test_misses_growing_between_the_halves_or_the_engines_kv_use_is_not_stationary() -> None:
    t, s, e = _load(2000, 20.0, 5.0)
    met = np.ones(2000, bool)
    met[1200:][::4] = False  # a quarter of the late requests miss, none of the early ones
    why = stationarity(t, s, e, met, 5.0)
    assert why is not None and "misses grew" in why
    ts = np.arange(0, 100) * 1e9
    kv = np.linspace(0.2, 0.9, 100)  # the engine's KV cache fills over the run
    why = stationarity(t, s, e, np.ones(2000, bool), 5.0, {"kv_cache_usage": (ts, kv)})
    assert why is not None and "KV-cache use grew" in why
    assert stationarity(t, s, e, np.ones(2000, bool), 5.0, {"kv_cache_usage": (ts, np.full(100, 0.5))}) is None


def test_misses_in_runs_over_time_count_as_fewer_requests() -> None:
    rng = np.random.default_rng(0)
    t = np.arange(4000) / 20.0 * 1e9
    independent = rng.random(4000) > 0.1
    assert design_effect(t, independent, 5.0) < 1.6
    bursts = np.repeat(rng.random(40) > 0.1, 100)  # misses come 100 at a time (a queue episode)
    assert design_effect(t, bursts, 5.0) > 10
    assert design_effect(t, np.ones(4000, bool), 5.0) == 1.0


def test_a_correlated_load_that_would_pass_as_independent_requests_is_undecided() -> None:
    row = {"requests": 4000, "met": 3800, "attainment": 0.95, "saturated": False}
    assert judge_load([row], 90.0).verdict == "pass"
    j = judge_load([{**row, "attainment_deff": 60.0}], 90.0)
    assert j.verdict == "undecided" and "correlation counts them as 67" in j.reason
    assert j.low < 0.9 < j.high and j.low < j.attainment < j.high


def test_a_steady_run_decides_alone_and_a_load_that_never_settles_never_passes() -> None:
    ramp = {"requests": 1000, "met": 990, "saturated": False, "under_sampled": "not stationary: in flight grew"}
    steady = {"requests": 4000, "met": 2000, "saturated": False}
    j = judge_load([ramp, steady], 90.0)
    assert j.verdict == "fail" and j.judged == 4000  # the ramp-up's flattering 99 % is not pooled
    j = judge_load([ramp, ramp], 90.0)
    assert j.verdict == "undecided" and "not stationary" in j.reason


def test_a_run_failing_before_it_settled_fails_the_load_a_steady_short_run_passed() -> None:
    """A confirmation still growing at its end only flatters the load: failing, it decides."""
    short = {"requests": 6, "met": 6, "saturated": False}
    growing = {"requests": 400, "met": 272, "saturated": False, "under_sampled": "not stationary: misses grew"}
    j = judge_load([short, growing], 90.0, 0.0)
    assert j.verdict == "fail" and j.judged == 406
    steady_long = {"requests": 400, "met": 398, "saturated": False}
    j = judge_load([steady_long, {**growing, "requests": 100, "met": 60}], 90.0, 0.0)
    assert j.verdict == "fail" and "had not settled" in j.reason
    # the longest run did not settle: passing or not, the load is not decided by short ones
    settling = {**growing, "met": 380}
    j = judge_load([short, settling], 90.0, 0.0)
    assert j.verdict == "undecided" and "not stationary" in j.reason


def test_the_interval_runs_between_the_rates_decided_with_a_margin_either_side_of_the_capacity() -> None:
    assert judge_load([{"requests": 4000, "met": 3980, "saturated": False}], 90.0).sure
    barely = judge_load([{"requests": 4000, "met": 3650, "saturated": False}], 90.0)
    assert barely.passed and not barely.sure  # 91.25 %: another seed might not pass it
    assert judge_load([{"requests": 4000, "met": 3000, "saturated": False}], 90.0).sure  # 75 %: fails for anyone
    probes = [Probe(10, True, sure=True), Probe(15, True, sure=True), Probe(18, True), Probe(19, True, sure=True),
              Probe(20, False), Probe(24, False, sure=True)]  # fmt: skip
    r = capacity_from_probes(probes, 0.1)
    assert (r.capacity_rps, r.upper_rps) == (19, 20)
    assert (r.interval_low_rps, r.interval_high_rps) == (15, 24)  # the ends decided with a margin


def test_a_capacity_whose_confirmations_all_failed_is_printed_not_confirmed(tmp_path: Path) -> None:
    from bench_llm.analysis.recommend import recommend
    from bench_llm.analysis.recommend_text import format_recommendation
    from tests.analysis.test_recommend import _point, _sweep

    pts = [_point("tp1", r, 1.0) for r in (2.0, 4.0)] + [_point("tp1", 8.0, 0.2, sat=True)]
    pts.append({**_point("tp1", 6.0, 0.5, role="confirm"), "met": 25})  # its confirmation failed
    pts.append({**_point("tp1", 6.0, 1.0), "run_dir": "cell=tp1/load=rate-6-r0"})
    text = format_recommendation(recommend(_sweep(tmp_path, pts), slo={}, attainment_pct=90.0))
    assert "NOT CONFIRMED: tp1: its capacity 4 req/s rests on a probe" in text
    assert "% of 50?" in text  # the attainment beside it says so too
