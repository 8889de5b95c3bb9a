"""How sure an attainment figure is, and what a load's sample can decide (docs/sweeps.md).

Attainment is a share of independent pass/miss outcomes, so its interval is the Wilson score
interval of a binomial proportion: it stays inside [0, 1] and keeps its coverage at 0 and 100 %
and for small samples, where the normal approximation does not. A load *passes* only when the
whole interval is at or above the target, *fails* only when it is wholly below, and is
*undecided* otherwise (more requests narrow it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

#: Confidence level of every attainment interval and probe verdict.
CONFIDENCE = 0.95

Verdict = Literal["pass", "fail", "undecided"]


def z_value(level: float = CONFIDENCE) -> float:
    """The two-sided normal quantile for ``level`` (1.96 at 95 %; 0 at level 0, where the
    interval is the point estimate itself)."""
    if not 0 <= level < 1:
        raise ValueError("confidence level must be in [0, 1)")
    return NormalDist().inv_cdf(0.5 + level / 2) if level > 0 else 0.0


def wilson_interval(successes: float, trials: float, level: float = CONFIDENCE) -> tuple[float, float]:
    """The Wilson score interval of ``successes / trials``; (nan, nan) without trials. The
    counts may be effective ones (requests / design effect, analysis/capacity_steady.py)."""
    if trials <= 0:
        return float("nan"), float("nan")
    if not 0 <= successes <= trials:
        raise ValueError(f"{successes} successes out of {trials} trials")
    z = z_value(level)
    p = successes / trials
    z2n = z * z / trials
    centre = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * math.sqrt(p * (1 - p) / trials + z2n / (4 * trials))
    lo, hi = centre - half, centre + half
    # exact at the ends: all successes have upper bound 1, none lower bound 0
    return (0.0 if successes == 0 else max(0.0, lo)), (1.0 if successes == trials else min(1.0, hi))


def attainment_verdict(met: int, judged: int, target: float, level: float = CONFIDENCE) -> Verdict:
    """pass / fail / undecided of ``met`` of ``judged`` requests against ``target`` (0..1).
    A target of 100 % cannot be shown by an interval: every request must meet it."""
    lo, hi = wilson_interval(met, judged, level)
    if target >= 1.0 and math.isfinite(lo):
        return "pass" if met == judged else "fail"
    return interval_verdict(lo, hi, target)


def interval_verdict(lo: float, hi: float, target: float) -> Verdict:
    """pass when the whole interval ``[lo, hi]`` is at or above ``target``, fail when it is
    wholly below, undecided otherwise (and without an interval: nan)."""
    if not math.isfinite(lo):
        return "undecided"
    if lo >= target - 1e-12:
        return "pass"
    if hi < target - 1e-12:
        return "fail"
    return "undecided"


def requests_to_pass(target: float, level: float = CONFIDENCE) -> int:
    """The fewest requests with which a load can pass ``target`` at all (every one met):
    n / (n + z²) ≥ target."""
    if not 0 < target < 1:
        return 1
    z2 = z_value(level) ** 2
    return max(1, math.ceil(target * z2 / (1 - target) - 1e-9))


@dataclass(frozen=True)
class Separation:
    """Is the best configuration separated from the runner-up, or within noise?"""

    separated: bool
    text: str


def separation(
    best: str, best_bracket: tuple[float | None, float | None], other: str, other_bracket: tuple[float | None, float | None]
) -> Separation:
    """Two capacity brackets (lower = highest pass, upper = lowest fail, per GPU or not, as the
    caller compares): separated when the best's proven lower end is at or above the
    runner-up's proven upper end; otherwise within noise."""
    b_lo, _ = best_bracket
    _, o_hi = other_bracket
    if b_lo is not None and o_hi is not None and b_lo >= o_hi - 1e-12:
        return Separation(True, f"{best} is separated from {other}: {best} passed {b_lo:.3g} where {other} failed at {o_hi:.3g}")
    why = "no load of the runner-up failed" if o_hi is None else f"{other} fails only at {o_hi:.3g}, above {best}'s {b_lo or 0:.3g}"
    return Separation(False, f"{best} and {other} are too close to call ({why})")
