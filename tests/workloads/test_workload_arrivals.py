"""Arrival processes: mean rate and inter-arrival CV on large samples.

Tolerances come from the sample itself: the statistic is computed on B batches of
consecutive gaps and the allowed error is 5 standard errors of the batch means
(which also covers processes whose gaps are correlated, like ON/OFF).
"""

from __future__ import annotations

import numpy as np
import pytest

from bench_llm.workloads.arrivals import (
    offsets_s,
    parse_arrival,
    ramp_cumulative,
    spread_buckets,
    steps_cumulative,
    trace_offsets,
)
from bench_llm.workloads.errors import WorkloadError

N = 200_000
BATCHES = 100
Z = 5.0


def _batch_check(gaps: np.ndarray, want_mean: float, want_cv: float) -> None:
    batches = np.array_split(gaps, BATCHES)
    means = np.array([b.mean() for b in batches])
    cvs = np.array([b.std() / b.mean() for b in batches])
    mean, cv = gaps.mean(), gaps.std() / gaps.mean()
    se_mean = means.std(ddof=1) / np.sqrt(BATCHES)
    se_cv = cvs.std(ddof=1) / np.sqrt(BATCHES)
    assert abs(mean - want_mean) <= Z * se_mean, (mean, want_mean, se_mean)
    assert abs(cv - want_cv) <= Z * se_cv, (cv, want_cv, se_cv)
    # the tolerance is meaningful: a few percent at most
    assert Z * se_mean < 0.05 * want_mean and Z * se_cv < 0.1 * max(want_cv, 0.5)


def _gaps(text: str, rate: float | None, seed: int = 1) -> np.ndarray:
    t = offsets_s(parse_arrival(text), N, rate, np.random.default_rng(seed))
    assert np.all(np.diff(t) >= 0)
    return np.diff(t)


def test_poisson() -> None:
    _batch_check(_gaps("poisson", 8.0), 1 / 8.0, 1.0)


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_cv(cv: float) -> None:
    _batch_check(_gaps(f"gamma:cv={cv}", 5.0), 1 / 5.0, cv)


def test_gamma_burstiness_maps_to_cv() -> None:
    b = 0.5  # cv = 3
    _batch_check(_gaps(f"gamma:burstiness={b}", 2.0), 0.5, 3.0)


def test_gamma_shape_maps_to_cv() -> None:
    _batch_check(_gaps("gamma:shape=0.25", 2.0), 0.5, 2.0)  # BurstGPT's published demo shape


def test_constant_is_truly_even() -> None:
    t = offsets_s(parse_arrival("constant"), 1000, 4.0, np.random.default_rng(0))
    assert t[0] == 0 and np.allclose(np.diff(t), 0.25, rtol=0, atol=1e-12)


def _onoff_moments(lam: float, on: float, off: float) -> tuple[float, float]:
    """Mean and CV of gaps: G = E + off * (ON-period boundaries crossed), E ~ Exp(lam)."""
    e = np.linspace(0, 60 / lam, 2_000_001)
    w = lam * np.exp(-lam * e)
    m = np.floor(e / on)
    f = e / on - m
    g1 = e + off * (m + f)  # E[G | e]
    g2 = (1 - f) * (e + off * m) ** 2 + f * (e + off * (m + 1)) ** 2  # E[G^2 | e]
    mean = np.trapezoid(w * g1, e)
    second = np.trapezoid(w * g2, e)
    return float(mean), float(np.sqrt(second - mean * mean) / mean)


def test_onoff_rate_cv_and_silence() -> None:
    rate, on, off = 4.0, 2.0, 6.0
    t = offsets_s(parse_arrival(f"onoff:on_s={on},off_s={off}"), N, rate, np.random.default_rng(2))
    want_mean, want_cv = _onoff_moments(rate * (on + off) / on, on, off)
    assert abs(want_mean - 1 / rate) < 1e-6
    assert want_cv > 1.5
    _batch_check(np.diff(t), want_mean, want_cv)
    phase = np.mod(t, on + off)
    assert np.all(phase < on + 1e-9), "no request during OFF periods"


def test_random_onoff_mean_rate_and_burstiness() -> None:
    rate = 3.0
    t = offsets_s(parse_arrival("onoff:on_s=2,off_s=6,random=1"), N, rate, np.random.default_rng(5))
    gaps = np.diff(t)
    batches = np.array_split(gaps, BATCHES)
    se = np.std([b.mean() for b in batches], ddof=1) / np.sqrt(BATCHES)
    assert abs(gaps.mean() - 1 / rate) <= Z * se
    assert gaps.std() / gaps.mean() > 1.5  # bursty, unlike Poisson


def test_ramp_by_time_rescaling() -> None:
    start, end = 1.0, 20.0
    t = offsets_s(parse_arrival(f"ramp:start={start},end={end}"), N, None, np.random.default_rng(3))
    # Lambda(t_i) must be a unit-rate Poisson process: gaps with mean 1 and CV 1
    _batch_check(np.diff(ramp_cumulative(t, start, end, N)), 1.0, 1.0)
    span = 2 * N / (start + end)
    early = np.sum(t < span * 0.1) / (span * 0.1)
    late = np.sum(t > span * 0.9) / (span * 0.1)
    assert early < 0.2 * late  # the rate really rises


def test_steps_by_time_rescaling() -> None:
    rates, step = (1.0, 4.0, 16.0), 5000.0
    t = offsets_s(parse_arrival("steps:rates=1/4/16,step_s=5000"), N, None, np.random.default_rng(4))
    _batch_check(np.diff(steps_cumulative(t, rates, step)), 1.0, 1.0)
    for i, r in enumerate(rates):
        k = np.sum((t >= i * step) & (t < (i + 1) * step))
        assert abs(k - r * step) <= Z * np.sqrt(r * step)


def test_mooncake_buckets_are_spread_evenly() -> None:
    ts = np.array([0.0, 0.0, 0.0, 3.0, 3.0, 9.0])
    out = spread_buckets(ts, 3.0)
    assert np.allclose(out, [0.0, 1.0, 2.0, 3.0, 4.5, 9.0])
    assert np.allclose(trace_offsets(ts + 10, 0.5, 3.0), out * 0.5)


@pytest.mark.parametrize(
    "text",
    ["nonsense", "gamma:cv=0", "gamma:k=2", "gamma:cv=2,shape=4", "onoff:on_s=0", "steps:rates=1/2", "gamma:cv=x", "ramp:start=0,end=0"],
)
def test_bad_arrivals_are_rejected(text: str) -> None:
    with pytest.raises(WorkloadError):
        offsets_s(parse_arrival(text), 10, 1.0, np.random.default_rng(0))


def test_rate_needed() -> None:
    with pytest.raises(WorkloadError, match="rate"):
        offsets_s(parse_arrival("poisson"), 10, None, np.random.default_rng(0))


def test_the_synthetic_workload_takes_its_send_times_from_the_arrival_processes() -> None:
    """One schedule builder: ``bench run --rate`` without a workload file gets the same offsets
    as the arrival process (Poisson: the same draws; constant: exactly i/rate, where its own
    running sum drifted by 13 ns over 2000 requests at 0.003 req/s)."""
    from bench_llm.workloads.synthetic import SyntheticWorkload

    for arrival, rate, n in (("poisson", 5.0, 300), ("constant", 0.003, 2000)):
        sched = SyntheticWorkload(requests=n, input_tokens=1, output_tokens=1, rate=rate, arrival=arrival, seed=3).schedule()
        got = np.array([s.send_offset_ns for s in sched.measured], dtype=np.int64)
        want = np.round(offsets_s(parse_arrival(arrival), n, rate, np.random.default_rng(3)) * 1e9).astype(np.int64)
        assert np.array_equal(got, want), arrival


def test_arrival_errors_name_the_setting_not_a_cli_flag() -> None:
    """A workload TOML file sets ``arrival`` too, so the message names the setting, not ``--arrival``."""
    for text in ("nonsense", "gamma:k=2", "gamma:cv=x"):
        with pytest.raises(WorkloadError) as err:
            parse_arrival(text)
        assert str(err.value).startswith("arrival ") and "--" not in str(err.value), err.value
    with pytest.raises(WorkloadError) as err:
        offsets_s(parse_arrival("poisson"), 10, None, np.random.default_rng(0))
    assert "--" not in str(err.value), err.value
