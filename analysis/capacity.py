"""Capacity under SLOs, from the sweep's points: a load's verdict and the capacity search.

* **Capacity** (DistServe's goodput): the highest offered request rate at which attainment is
  at least the target (default 90 %) and the load is not saturated, found by bracketing and
  bisection to a stated relative precision. Reported per configuration and per GPU.
* A load's **verdict** (``judge_load``): its runs pooled, decided on the attainment interval
  (docs/sweeps.md, Confidence).

The numbers of one load run: analysis/capacity_points.py; saturation and the client-trust
checks: analysis/capacity_saturation.py; steady state: analysis/capacity_steady.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench_llm.analysis.capacity_client import untrusted_confirmation
from bench_llm.analysis.confidence import (
    CONFIDENCE,
    Verdict,
    attainment_verdict,
    interval_verdict,
    requests_to_pass,
    wilson_interval,
    z_value,
)
from bench_llm.results.sweep_rows import Reason, ReasonCode


@dataclass(frozen=True)
class Probe:
    """One load's verdict. ``passed`` False with ``undecided`` True: the sample could not
    decide (its interval straddles the target, it was under-sampled, or the client could not
    measure it truthfully; ``reason`` says which)."""

    rate: float
    passed: bool
    attainment: float = float("nan")
    saturated: bool = False
    undecided: bool = False
    reason: str = ""
    #: decided with a margin: another run of it (another seed) would reach the same verdict
    #: with about 99 % probability (``LoadJudgement.sure``); such a pass below the capacity is
    #: the lower end of the capacity's interval, such a failure above it the upper end
    sure: bool = False


@dataclass(frozen=True)
class CapacityResult:
    """``capacity_rps`` is the highest probed rate that passed below the lowest that did not
    pass (failed or undecided).

    ``upper_rps`` is the lowest rate that failed (None: none failed, capacity is a lower
    bound). Each end is a verdict at ``level`` confidence (analysis/confidence.py), so the
    bracket [capacity_rps, upper_rps) holds at ≥ 1 − 2(1 − level). ``undecided`` lists the
    rates whose sample could not decide. ``converged`` says whether the search bracket
    closed to ``precision``.
    """

    capacity_rps: float | None
    upper_rps: float | None
    precision: float
    converged: bool
    probes: tuple[Probe, ...]
    note: str = ""
    undecided: tuple[float, ...] = ()
    level: float = CONFIDENCE
    #: the interval [interval_low_rps, interval_high_rps), meant to hold another seed's
    #: capacity (docs/sweeps.md: its measured coverage): the highest rate below the capacity
    #: that passed with a margin (``Probe.sure``; None: none did), and the lowest that failed
    #: with one (None: none did; the interval then ends at ``upper_rps``). Another seed's
    #: search stops anywhere in its own bracket, and the capacity is a rate that just passed
    interval_low_rps: float | None = None
    interval_high_rps: float | None = None

    @property
    def achieved_precision(self) -> float | None:
        if self.capacity_rps and self.upper_rps:
            return (self.upper_rps - self.capacity_rps) / self.capacity_rps
        return None


def bracket(probes: list[Probe] | tuple[Probe, ...]) -> tuple[float | None, float | None, bool]:
    """(highest pass below the lowest rate that did not pass, that rate, non-monotone?) of a
    set of probes. An undecided rate bounds the search like a failure (nothing above it can
    be claimed) but is not reported as one (``capacity_from_probes``)."""
    fails = [p.rate for p in probes if not p.passed]
    upper = min(fails) if fails else None
    passes = [p.rate for p in probes if p.passed and (upper is None or p.rate < upper)]
    lower = max(passes) if passes else None
    non_monotone = upper is not None and any(p.passed and p.rate > upper for p in probes)
    return lower, upper, non_monotone


@dataclass
class CapacitySearch:
    """Bracketing (×2 / ÷2 from ``start``) then bisection until the bracket is within
    ``precision`` (relative to the lower end). Drive it with ``next_rate``/``record``."""

    start: float
    precision: float = 0.1
    max_probes: int = 8
    max_rate: float = 1000.0
    min_rate: float = 0.01
    probes: list[Probe] = field(default_factory=list)

    def record(self, probe: Probe) -> None:
        self.probes.append(probe)

    def next_rate(self) -> float | None:
        """The next rate to probe, or None when done."""
        if len(self.probes) >= self.max_probes:
            return None
        if not self.probes:
            return _round_rate(self.start)
        lower, upper, _ = bracket(self.probes)
        if upper is None:
            nxt = _round_rate(lower * 2.0) if lower else None
            return nxt if nxt is not None and nxt <= self.max_rate else None
        if lower is None:
            nxt = _round_rate(upper / 2.0)
            if nxt < self.min_rate:
                # one last probe at the floor itself, unless it was already tried
                nxt = _round_rate(self.min_rate)
                if nxt >= upper or any(abs(p.rate - nxt) < 1e-9 for p in self.probes):
                    return None
            return nxt
        if upper - lower <= self.precision * lower:
            return None
        mid = _round_rate((lower + upper) / 2.0)
        if mid <= lower or mid >= upper or any(abs(p.rate - mid) < 1e-9 for p in self.probes):
            return None
        return mid

    def result(self) -> CapacityResult:
        return capacity_from_probes(self.probes, self.precision, self.max_rate, self.min_rate)


def capacity_from_probes(
    probes: list[Probe] | tuple[Probe, ...], precision: float, max_rate: float = math.inf, min_rate: float = 0.0
) -> CapacityResult:
    lower, search_upper, non_monotone = bracket(probes)
    failed = [p.rate for p in probes if not p.passed and not p.undecided]
    upper = min(failed) if failed else None
    undecided = tuple(sorted({p.rate for p in probes if p.undecided}))
    converged = (
        lower is not None and search_upper is not None and search_upper - lower <= precision * lower * (1 + 1e-9)
    )
    notes = []
    if lower is None and probes:
        what = "was decided" if all(p.undecided for p in probes) else "met the SLOs"
        notes.append(f"no probed rate {what} (lowest tried {min(p.rate for p in probes):g} req/s)")
    elif search_upper is None and probes:
        notes.append(f"every probed rate met the SLOs; capacity is at least {lower:g} req/s")
    for p in sorted((p for p in probes if p.undecided), key=lambda p: p.rate):
        notes.append(f"undecided at {p.rate:g} req/s: {p.reason or 'its sample cannot decide'}")
    if non_monotone:
        notes.append("a higher rate passed after a lower one did not (noise); the lower bracket is kept")
    sure = [p.rate for p in probes if p.sure and p.passed and lower is not None and p.rate < lower - 1e-9]
    sure_fail = [p.rate for p in probes if p.sure and not p.passed and not p.undecided]
    return CapacityResult(
        lower, upper, precision, converged, tuple(probes), "; ".join(notes), undecided,
        interval_low_rps=max(sure) if sure else None,
        interval_high_rps=min(sure_fail) if sure_fail else upper,
    )  # fmt: skip


def _round_rate(r: float) -> float:
    """Rates to 4 significant digits, so folder names and repeats line up."""
    if r <= 0:
        return r
    return float(f"{r:.4g}")


def passes(attainment: float, saturated: bool, attainment_pct: float) -> bool:
    """The point-estimate rule (no interval): for loads without request counts."""
    return (not saturated) and math.isfinite(attainment) and attainment * 100.0 >= attainment_pct - 1e-9


@dataclass(frozen=True)
class LoadJudgement:
    """A load's verdict from its runs pooled (repeats and re-measurements alike)."""

    verdict: Verdict
    met: int
    judged: int
    attainment: float
    low: float
    high: float
    saturated: bool
    reason: str = ""  # why it failed or is undecided
    untrustworthy: str | None = None  # every run of it was; why
    under_sampled: str | None = None
    #: decided with a margin: its interval at ``sure_level(level)`` (the verdict's z plus a
    #: one-sided 99 % z: 4.3 at 95 %) lies wholly on the verdict's side of the target (or it
    #: saturated), so another run of it, with another seed, would most likely decide the same
    sure: bool = False
    #: under-sampled because too short: how many more requests its longest run needed
    #: (the run's ``more_requests_needed``; 0: not that case) — what sizes the next run
    more_requests: int = 0

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def code(self) -> ReasonCode | None:
        """Why it did not simply pass, as a code (None: it passed)."""
        if self.untrustworthy is not None:
            return ReasonCode.UNTRUSTWORTHY
        if self.verdict == "fail":
            return ReasonCode.SATURATED if self.saturated else ReasonCode.FAILED
        return ReasonCode.UNDECIDED if self.verdict == "undecided" else None

    @property
    def why(self) -> Reason | None:
        """``code`` with the message (``reason``) and the requests a too-short run lacked."""
        code = self.code
        return None if code is None else Reason(code, self.reason, self.more_requests)

    @property
    def undecided(self) -> bool:
        return self.verdict == "undecided"

    @property
    def needs_more(self) -> bool:
        """Would more requests of this load (in one longer run) decide it?"""
        return self.undecided and self.untrustworthy is None


def judge_load(runs: Sequence[Mapping[str, Any]], attainment_pct: float, level: float = CONFIDENCE) -> LoadJudgement:
    """Pool the runs of one load (points.parquet rows) that the client measured truthfully and
    decide it: **fail** when saturated or when the attainment interval lies wholly below the
    target, **pass** when it lies wholly at or above it and some run was long enough to stand
    for its rate, **undecided** otherwise (docs/sweeps.md, Confidence)."""
    target = attainment_pct / 100.0
    trusted = [r for r in runs if not r.get("untrustworthy")]
    if not trusted or untrusted_confirmation(runs):
        why = untrusted_confirmation(runs) or next((str(r["untrustworthy"]) for r in runs if r.get("untrustworthy")), "no run")
        return LoadJudgement("undecided", 0, 0, math.nan, math.nan, math.nan, False, f"untrustworthy: {why}", why)
    sat = any(bool(r.get("saturated")) for r in trusted)
    # runs long and steady enough to stand for the rate decide it alone once there are any
    # (a short or still-growing run's attainment is flattered by its ramp-up); else all do
    steady = [r for r in trusted if not r.get("under_sampled")]
    unsteady = [r for r in trusted if r.get("under_sampled")]
    if steady and unsteady and _size(unsteady) > _size(steady):
        steady = []  # the longest run, the best evidence, did not settle: nor did the load
    longest = None if steady else max(unsteady, key=lambda r: int(r.get("requests") or 0))
    under = None if longest is None else str(longest["under_sampled"])
    more = 0 if longest is None else _count(longest.get("more_requests_needed"))
    p = _Pool.of(steady or trusted, target, level)
    unsettled = ""
    if steady and len(steady) < len(trusted) and p.verdict != "fail":
        # a run that had not settled only flatters (its state still grew): one failing decides
        u = _Pool.of([r for r in trusted if r.get("under_sampled")], target, level)
        if u.verdict == "fail":
            p, unsettled = u, " (runs that had not settled yet)"
    lo, hi = p.interval

    def judged(verdict: Verdict, reason: str = "", sure: bool = False) -> LoadJudgement:
        return LoadJudgement(verdict, p.met, p.judged, p.attainment, lo, hi, sat, reason, None, under, sure, more)

    if sat:
        reasons = [str(r["saturation_reason"]) for r in trusted if r.get("saturation_reason")]
        return judged("fail", "saturated: " + (reasons[0] if reasons else "yes"), sure=True)
    corr = f" (correlation counts them as {p.eff_n:.0f})" if p.eff_n < 0.99 * p.judged else ""
    interval = (f"{100 * p.attainment:.1f}% of {p.judged} met{corr}{unsettled}, "
                f"{100 * level:g}% interval {100 * lo:.1f}-{100 * hi:.1f}%")  # fmt: skip
    if p.verdict == "fail":
        sure = p.eff_n > 0 and wilson_interval(p.eff_met, p.eff_n, sure_level(level))[1] < target - 1e-12
        return judged("fail", f"{interval}, below {attainment_pct:g}%", sure)
    if p.verdict == "pass" and under is None:
        sure = target < 1.0 and p.eff_n > 0 and wilson_interval(p.eff_met, p.eff_n, sure_level(level))[0] >= target - 1e-12
        return judged("pass", sure=sure)
    if p.verdict == "pass":
        return judged("undecided", f"under-sampled: {under}")
    need = requests_to_pass(target, level)
    unit = "jobs" if any(_judged(r) != int(r.get("requests") or 0) for r in trusted) else "requests"
    small = f"; fewer than the {need} {unit} a pass needs at all" if p.judged < need else ""
    return judged("undecided", f"{interval} straddles {attainment_pct:g}%{small}")


@dataclass(frozen=True)
class _Pool:
    """Runs of one load pooled: met / judged, and the effective counts of the interval
    (requests correlated in time count as fewer independent ones: judged / deff, deff the
    request-weighted mean of the runs' own ``attainment_deff``; a run where every request
    met or missed has none to give)."""

    met: int
    judged: int
    eff_met: float
    eff_n: float
    verdict: Verdict
    interval: tuple[float, float]

    @property
    def attainment(self) -> float:
        return self.met / self.judged if self.judged else math.nan

    @classmethod
    def of(cls, runs: Sequence[Mapping[str, Any]], target: float, level: float) -> _Pool:
        met = sum(_met(r) for r in runs)
        judged = sum(_judged(r) for r in runs)
        known = [(_judged(r), _deff(r)) for r in runs if 0 < _met(r) < _judged(r)]
        weight = sum(n for n, _ in known)
        deff = sum(n * d for n, d in known) / weight if weight else 1.0
        eff_n = judged / deff
        eff_met = met / judged * eff_n if judged else 0.0
        interval = wilson_interval(eff_met, eff_n, level) if eff_n > 0 else (math.nan, math.nan)
        return cls(met, judged, eff_met, eff_n, _verdict(met, judged, eff_met, eff_n, target, level), interval)


def _count(v: Any) -> int:
    """A count column's value (0 where absent or NaN: points of older sweeps)."""
    return int(v) if isinstance(v, (int, float)) and math.isfinite(v) else 0


def _size(runs: Sequence[Mapping[str, Any]]) -> int:
    """The most requests of one run among ``runs``."""
    return max(int(r.get("requests") or 0) for r in runs)


def sure_level(level: float) -> float:
    """The two-sided level whose z is ``level``'s plus a one-sided 99 % z (2.326): a load
    passing at it would pass another run at ``level`` with about 99 % probability (chosen by
    measured coverage across seeds, docs/sweeps.md; 95 % gave a narrower, less true interval)."""
    if level <= 0:
        return 0.0
    from statistics import NormalDist

    z = z_value(level) + NormalDist().inv_cdf(0.99)
    return 2.0 * NormalDist().cdf(z) - 1.0


def _deff(row: Mapping[str, Any]) -> float:
    """A run's design effect (``attainment_deff``; 1 where absent: points of older sweeps)."""
    v = row.get("attainment_deff")
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 1.0
    return f if math.isfinite(f) and f >= 1.0 else 1.0


def _verdict(met: int, judged: int, eff_met: float, eff_n: float, target: float, level: float) -> Verdict:
    """``attainment_verdict`` on the effective counts (a 100 % target: every request met)."""
    if target >= 1.0 or eff_n >= judged - 1e-9:
        return attainment_verdict(met, judged, target, level)
    return interval_verdict(*wilson_interval(eff_met, eff_n, level), target)


def _judged(row: Mapping[str, Any]) -> int:
    """The units a run's attainment counts: its jobs when judged per job, else its requests."""
    jobs = row.get("jobs")
    if jobs is not None and isinstance(jobs, (int, float)) and math.isfinite(jobs):
        return int(jobs)
    return int(row.get("requests") or 0)


def _met(row: Mapping[str, Any]) -> int:
    """Requests of a run that met every SLO (points of older sweeps: from attainment)."""
    met = row.get("met")
    if met is not None and not (isinstance(met, float) and math.isnan(met)):
        return int(met)
    att = row.get("attainment")
    n = int(row.get("requests") or 0)
    return int(round(float(att) * n)) if att is not None and math.isfinite(float(att)) else 0
