"""Change points in a noisy series of nightly results: E-divisive means.

The method of Matteson & James ("A Nonparametric Approach for Multiple Change Point Analysis
of Multivariate Data", JASA 2014), as MongoDB's performance CI (Daly et al., ICPE 2020) and
Apache Otava use it, written here from the paper:

* for a split at ``tau`` of a segment ``Z`` into ``X = Z[:tau]`` and ``Y = Z[tau:]`` the
  divergence is the energy distance
  ``E = 2/(mn) Σ|x−y|^a − 1/C(m,2) Σ|x−x'|^a − 1/C(n,2) Σ|y−y'|^a``, scaled by ``mn/(m+n)``;
  the candidate is the split maximising it (both sides at least ``min_size`` points);
* its significance is a permutation test: the same maximum over shuffles of the segment, the
  p-value the share of shuffles reaching the observed one;
* significant splits are applied and both halves searched again (binary segmentation), until
  no split is significant.

Nothing assumes normality or a noise level: a single outlier raises the within-segment terms
as much as the between term, so it rarely makes a split, while a lasting shift of the level
does. A change smaller than ``min_change`` (relative, between the two segments' medians) is
not reported: statistically real but too small to act on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Defaults (docs/reporting.md, "bench trend").
P_MAX = 0.01
PERMUTATIONS = 499
MIN_SIZE = 4


@dataclass(frozen=True)
class ChangePoint:
    index: int  # first point of the new level (0-based)
    p_value: float
    before: float  # median of the segment before
    after: float  # median of the segment after
    statistic: float

    @property
    def rel_change(self) -> float:
        return (self.after - self.before) / abs(self.before) if self.before else float("inf")


def _split_stats(z: np.ndarray, min_size: int, alpha: float) -> np.ndarray:
    """The scaled energy divergence of every split ``tau`` of each row of ``z`` (shape
    (rows, n)); NaN where a side would have fewer than ``min_size`` points."""
    rows, n = z.shape
    d = np.abs(z[:, :, None] - z[:, None, :]) ** alpha
    p = np.zeros((rows, n + 1, n + 1))
    p[:, 1:, 1:] = d.cumsum(axis=1).cumsum(axis=2)  # p[r, i, j] = Σ d[r, :i, :j]
    out = np.full((rows, n + 1), np.nan)
    t = np.arange(min_size, n - min_size + 1)
    if len(t) == 0:
        return out
    m, k = t.astype(float), (n - t).astype(float)
    left = p[:, t, t]  # Σ over X×X
    between = p[:, t, n] - left  # Σ over X×Y
    right = p[:, n, n][:, None] - 2 * p[:, t, n] + left  # Σ over Y×Y
    e = 2 * between / (m * k) - left / (m * (m - 1)) - right / (k * (k - 1))
    out[:, t] = m * k / n * e
    return out


def _best_split(z: np.ndarray, min_size: int, alpha: float) -> tuple[int, float]:
    stats = _split_stats(z[None, :], min_size, alpha)[0]
    if not np.isfinite(stats).any():
        return -1, float("nan")
    t = int(np.nanargmax(stats))
    return t, float(stats[t])


def _p_value(z: np.ndarray, observed: float, min_size: int, alpha: float, permutations: int, rng: np.random.Generator) -> float:
    shuffled = rng.permuted(np.broadcast_to(z, (permutations, len(z))), axis=1)
    best = np.nanmax(_split_stats(shuffled, min_size, alpha), axis=1)
    return float((np.sum(best >= observed) + 1) / (permutations + 1))


def e_divisive(
    values: np.ndarray | list[float],
    p_max: float = P_MAX,
    permutations: int = PERMUTATIONS,
    min_size: int = MIN_SIZE,
    min_change: float = 0.0,
    alpha: float = 1.0,
    seed: int = 0,
) -> list[ChangePoint]:
    """Significant change points of ``values`` (in order of the series). NaNs are not allowed:
    drop missing points first."""
    z = np.asarray(values, dtype=float)
    if not np.isfinite(z).all():
        raise ValueError("the series has missing values; drop them first")
    rng = np.random.default_rng(seed)
    found: list[ChangePoint] = []
    pending = [(0, len(z))]
    while pending:
        lo, hi = pending.pop()
        seg = z[lo:hi]
        if len(seg) < 2 * min_size or np.ptp(seg) == 0:
            continue
        t, stat = _best_split(seg, min_size, alpha)
        if t < 0:
            continue
        p = _p_value(seg, stat, min_size, alpha, permutations, rng)
        if p > p_max:
            continue
        cp = ChangePoint(lo + t, p, float(np.median(seg[:t])), float(np.median(seg[t:])), stat)
        if abs(cp.rel_change) >= min_change:
            found.append(cp)
        # search both sides either way: a small change may hide a large one next to it
        pending += [(lo, lo + t), (lo + t, hi)]
    found.sort(key=lambda c: c.index)
    return _with_local_medians(z, found)


def _with_local_medians(z: np.ndarray, points: list[ChangePoint]) -> list[ChangePoint]:
    """Before/after medians between neighbouring change points (what a reader compares)."""
    edges = [0] + [c.index for c in points] + [len(z)]
    return [
        ChangePoint(c.index, c.p_value, float(np.median(z[edges[i] : c.index])), float(np.median(z[c.index : edges[i + 2]])), c.statistic)
        for i, c in enumerate(points)
    ]
