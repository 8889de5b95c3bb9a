"""Change points in a noisy series of nightly results: windowed E-divisive means, two passes.

The candidate search is Matteson & James's E-divisive means ("A Nonparametric Approach for
Multiple Change Point Analysis of Multivariate Data", JASA 2014); the two passes (many weak
candidates, then only the strong ones kept) are those of MongoDB's and Apache Otava's
performance CI (Daly et al., ICPE 2020; Fleming et al., "Hunter", ICPE 2023). Written here
from the papers:

* **Candidates.** For a segment ``Z`` the divergence of ``X = Z[:tau]`` and ``Y = Z[tau:kappa]``
  is the energy distance ``2/(nm) Σ|x-y| - 1/C(n,2) Σ|x-x'| - 1/C(m,2) Σ|y-y'|``, scaled by
  ``nm/(n+m)``; the candidate is the ``tau`` of the pair (``tau``, ``kappa``) maximising it, both
  sides at least ``min_size`` points. Searching ``kappa`` (the end of the second segment), not
  only the segment's end, is what finds a change that is reverted a few nights later: the
  regressed nights against the nights before them, without the fixed nights after diluting them.
* **Windows.** The search runs on windows of ``window`` points, half a window apart, and the last
  window ends at the newest point: every window's work and memory are O(window²) however long
  the history, so 1,000 nights cost about 40 small searches, not one 1,000² matrix.
* **Weak pass.** In each window, binary segmentation: the best candidate of any interval is kept
  while the two sides (``Z[:tau]`` against ``Z[tau:kappa]``) differ at ``p <= weak_factor × p_max``;
  the candidates of all windows are pooled.
* **Strong pass.** Each candidate is tested again between its neighbouring candidates; the
  weakest one with ``p > p_max`` (or a neighbour segment shorter than ``min_size``) is dropped
  and its neighbours tested again, until every remaining one passes. Dropping one at a time
  lets a real edge that was masked by a spurious neighbour recover.
* **The test.** Student's two-sample t-test (pooled variance) on the two segments, each first
  clipped to its median ± 3 robust standard deviations (1.4826 × MAD), so one outlier night
  neither makes nor hides a change. The p-value is nominal: the candidate was chosen as the
  best of many splits, so the share of false change points is higher than ``p_max`` says; its
  real cost is measured (docs/reporting.md, "bench trend"), which is why ``p_max`` is small.
* **Where exactly.** A change point found with few nights after it may sit a commit or two
  early or late. Its location is the least-squares split between its neighbours within
  ``LOCATE_RADIUS`` commits of the candidate; every split between the neighbours whose fit is
  within a likelihood ratio of ``location_lr`` of it (Gaussian noise whose variance is the
  larger of the robust and the plain estimate: outliers widen it) is a commit the change may
  equally well have started at: ``first``..``last``. One commit there: the culprit is certain.

Nothing else is assumed about the noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Defaults (docs/reporting.md, "bench trend", measured false-alarm cost there).
P_MAX = 1e-4
WINDOW = 50
MIN_SIZE = 3
WEAK_FACTOR = 10.0
LOCATION_LR = 100.0
_CLIP_SD = 3.0
#: How far (commits) the least-squares location may move from the energy search's candidate.
LOCATE_RADIUS = 2


@dataclass(frozen=True)
class ChangePoint:
    index: int  # first point of the new level (0-based), the likeliest one
    p_value: float
    before: float  # median of the segment before (since the previous change point)
    after: float  # median of the segment after (until the next change point)
    statistic: float  # |t| of the strong pass's test
    first: int = -1  # earliest point the new level may start at (-1: = index)
    last: int = -1  # latest point the new level may start at (-1: = index)

    @property
    def rel_change(self) -> float:
        return (self.after - self.before) / abs(self.before) if self.before else float("inf")

    @property
    def span(self) -> tuple[int, int]:
        return (self.index if self.first < 0 else self.first, self.index if self.last < 0 else self.last)

    @property
    def certain(self) -> bool:
        lo, hi = self.span
        return lo == hi


# -- the test ---------------------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_p_value(t: float, df: float) -> float:
    """Two-sided p-value of Student's t with ``df`` degrees of freedom."""
    if not math.isfinite(t):
        return 0.0
    return _betainc(df / 2.0, 0.5, df / (df + t * t))


def _clip(x: np.ndarray) -> np.ndarray:
    med = float(np.median(x))
    scale = 1.4826 * float(np.median(np.abs(x - med)))
    return np.clip(x, med - _CLIP_SD * scale, med + _CLIP_SD * scale) if scale > 0 else x


def two_sample(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(p-value, |t|) of Student's t-test of the outlier-clipped segments."""
    n, m = len(x), len(y)
    if n < 2 or m < 2:
        return 1.0, 0.0
    x, y = _clip(x), _clip(y)
    ss = float(np.sum((x - x.mean()) ** 2) + np.sum((y - y.mean()) ** 2))
    diff = float(y.mean() - x.mean())
    if ss <= 0.0:
        return (0.0, math.inf) if diff != 0.0 else (1.0, 0.0)
    df = n + m - 2
    t = diff / math.sqrt(ss / df * (1.0 / n + 1.0 / m))
    return t_p_value(t, df), abs(t)


# -- the candidate search ---------------------------------------------------------------------


def energy_q(z: np.ndarray, min_size: int) -> np.ndarray:
    """``q[tau, kappa]``: the scaled energy divergence of ``z[:tau]`` and ``z[tau:kappa]``
    (shape (len+1, len+1)); -inf where a side has fewer than ``min_size`` points."""
    size = len(z)
    p = np.zeros((size + 1, size + 1))
    p[1:, 1:] = np.abs(z[:, None] - z[None, :]).cumsum(axis=0).cumsum(axis=1)  # p[i, j] = Σ d[:i, :j]
    t = np.arange(size + 1)[:, None]
    k = np.arange(size + 1)[None, :]
    diag = np.diagonal(p)
    within_x = diag[t]  # Σ over X×X (ordered pairs)
    between = p[t, k] - within_x  # Σ over X×Y
    within_y = diag[k] - 2 * p[t, k] + within_x  # Σ over Y×Y
    n, m = t.astype(float), (k - t).astype(float)
    ok = (n >= max(2, min_size)) & (m >= max(2, min_size))
    with np.errstate(divide="ignore", invalid="ignore"):
        e = 2 * between / (n * m) - within_x / (n * (n - 1)) - within_y / (m * (m - 1))
        q = n * m / (n + m) * e
    return np.where(ok, q, -np.inf)


def _candidate(z: np.ndarray, min_size: int) -> tuple[int, int, float] | None:
    if len(z) < 2 * min_size:
        return None
    q = energy_q(z, min_size)
    flat = int(np.argmax(q))
    t, k = divmod(flat, q.shape[1])
    return (t, k, float(q[t, k])) if np.isfinite(q[t, k]) else None


def _weak_pass(z: np.ndarray, lo: int, hi: int, p_weak: float, min_size: int) -> list[int]:
    """Binary segmentation of ``z[lo:hi]``: the candidates whose two sides differ at ``p_weak``."""
    found: list[int] = []
    intervals = [(lo, hi)]
    cache: dict[tuple[int, int], tuple[int, int, float] | None] = {}
    while True:
        best: tuple[float, int, int, int, int] | None = None
        for a, b in intervals:
            if (a, b) not in cache:
                cache[(a, b)] = _candidate(z[a:b], min_size)
            c = cache[(a, b)]
            if c is not None and (best is None or c[2] > best[0]):
                best = (c[2], a, b, c[0], c[1])
        if best is None:
            return found
        _, a, b, t, k = best
        if two_sample(z[a : a + t], z[a + t : a + k])[0] > p_weak:
            return found
        found.append(a + t)
        intervals = [iv for iv in intervals if iv != (a, b)] + [(a, a + t), (a + t, b)]


def _window_starts(n: int, window: int) -> list[int]:
    if n <= window:
        return [0]
    step = max(1, window // 2)
    starts = list(range(0, n - window + 1, step))
    if starts[-1] != n - window:
        starts.append(n - window)  # the newest points always end a window
    return starts


def _strong_pass(z: np.ndarray, candidates: list[int], p_max: float, min_size: int) -> list[tuple[int, float, float]]:
    """Drop the weakest candidate until all pass ``p_max`` between their neighbours."""
    cps = sorted(set(candidates))

    def test(i: int) -> tuple[float, float]:
        a = cps[i - 1] if i > 0 else 0
        b = cps[i + 1] if i + 1 < len(cps) else len(z)
        x, y = z[a : cps[i]], z[cps[i] : b]
        if len(x) < min_size or len(y) < min_size:
            return 1.0, 0.0
        return two_sample(x, y)

    stats = [test(i) for i in range(len(cps))]
    while cps:
        worst = max(range(len(cps)), key=lambda i: stats[i][0])
        if stats[worst][0] <= p_max:
            break
        del cps[worst], stats[worst]
        for i in (worst - 1, worst):
            if 0 <= i < len(cps):
                stats[i] = test(i)
    return [(c, p, t) for c, (p, t) in zip(cps, stats)]


def _locate(z: np.ndarray, a: int, at: int, b: int, min_size: int, location_lr: float) -> tuple[int, int, int]:
    """The least-squares split of ``z[a:b]`` near ``at`` and the span of splits as likely
    (within ``location_lr``): (best, first, last), absolute indices."""
    seg = z[a:b]
    ks = np.arange(1, len(seg))
    c1, c2 = np.cumsum(seg), np.cumsum(seg**2)
    left_n, right_n = ks.astype(float), (len(seg) - ks).astype(float)
    left_s, right_s = c1[ks - 1], c1[-1] - c1[ks - 1]
    sse = (c2[-1]) - left_s**2 / left_n - right_s**2 / right_n
    near = np.abs(ks - (at - a)) <= LOCATE_RADIUS
    best = int(ks[near][int(np.argmin(sse[near]))])
    x, y = seg[:best], seg[best:]
    resid = np.concatenate([x - np.median(x), y - np.median(y)])
    # the noise's variance: the robust one, or the plain one when outliers make it larger (they
    # move the least-squares fit as much as they move its mean square)
    scale2 = max((1.4826 * float(np.median(np.abs(resid)))) ** 2, float(sse[best - 1]) / max(1, len(seg) - 2))
    if scale2 <= 0:
        return a + best, a + best, a + best
    close = ks[(sse - sse[best - 1]) / scale2 <= 2 * math.log(location_lr)]
    return a + best, a + int(close.min()), a + int(close.max())


def e_divisive(
    values: np.ndarray | list[float],
    p_max: float = P_MAX,
    window: int = WINDOW,
    min_size: int = MIN_SIZE,
    weak_factor: float = WEAK_FACTOR,
    location_lr: float = LOCATION_LR,
) -> list[ChangePoint]:
    """Significant change points of ``values`` (in order of the series). NaNs are not allowed:
    drop missing points first."""
    z = np.asarray(values, dtype=float)
    if not np.isfinite(z).all():
        raise ValueError("the series has missing values; drop them first")
    if min_size < 2 or window < 2 * min_size:
        raise ValueError(f"need min_size >= 2 and window >= 2 × min_size (got {min_size}, {window})")
    n = len(z)
    if n < 2 * min_size or np.ptp(z) == 0:
        return []
    p_weak = min(0.5, p_max * weak_factor)
    weak: list[int] = []
    for s in _window_starts(n, window):
        weak += _weak_pass(z, s, min(n, s + window), p_weak, min_size)
    strong = _strong_pass(z, weak, p_max, min_size)
    edges = [0] + [c for c, _, _ in strong] + [n]
    out = []
    for i, (c, p, t) in enumerate(strong):
        best, first, last = _locate(z, edges[i], c, edges[i + 2], min_size, location_lr)
        out.append(ChangePoint(best, p, float(np.median(z[edges[i] : best])), float(np.median(z[best : edges[i + 2]])), t, first, last))
    return out
