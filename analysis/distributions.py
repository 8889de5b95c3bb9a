"""A metric's distribution and its percentiles: ``percentiles`` of an array, and
``PooledDistribution``, values pooled batch by batch, kept exactly up to ``EXACT_LIMIT`` and
counted in a fine log histogram beyond (relative error at most ``HISTOGRAM_RELATIVE_ERROR``).
Definitions of the metrics themselves: docs/metrics.md, ``analysis.metrics``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bench_llm.core.memory import return_freed_memory


def percentiles(values: np.ndarray, ps: tuple[float, ...]) -> dict[str, float]:
    """Mean and the requested percentiles (numpy 'linear' interpolation); NaNs ignored."""
    v = values[~np.isnan(values)] if len(values) else values
    if len(v) == 0:
        return {"n": 0, "mean": float("nan"), **{f"p{_pname(p)}": float("nan") for p in ps}}
    qs = np.percentile(v, ps)
    return {"n": int(len(v)), "mean": float(v.mean()), **{f"p{_pname(p)}": float(q) for p, q in zip(ps, qs)}}


def _pname(p: float) -> str:
    return f"{p:g}".replace(".", "_")


def keep_freed_memory() -> None:
    """Let glibc keep freed large blocks for reuse instead of returning them to the OS.

    Per-batch token arrays are otherwise mmapped fresh each time, and first-touch page
    faults (slow on virtual machines) then cost more than the arithmetic itself.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, (1 << 31) - 1)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


#: Pooled token-level values kept exactly up to this many per distribution (8 bytes each).
EXACT_LIMIT = 25_000_000

#: Histogram bins: the top 12 mantissa bits of a float64 (4096 bins per power of two), so a
#: bin's half-width is at most 2**-13 (0.0122 %) of any value in it.
_MANTISSA_BITS = 12
_SHIFT = 52 - _MANTISSA_BITS
_LOW_KEY = int(np.array([2.0**-30], np.float64).view(np.int64)[0]) >> _SHIFT  # 2**-30 ms ≈ 1 ps
_HIGH_KEY = int(np.array([2.0**30], np.float64).view(np.int64)[0]) >> _SHIFT  # 2**30 ms ≈ 12 days
_BINS = _HIGH_KEY - _LOW_KEY + 2  # bin 0: |v| < 2**-30 ms (shown as 0)
HISTOGRAM_RELATIVE_ERROR = 2.0**-13


#: The largest float64 below 2**-30: every smaller magnitude is raised to it, which lands in bin 0.
_TINY = float(np.nextafter(2.0**-30, 0.0))


def _bin_index(magnitude: np.ndarray) -> np.ndarray:
    keys = np.maximum(magnitude, _TINY, dtype=np.float64).view(np.int64)  # float max: one SIMD pass
    keys >>= _SHIFT
    keys -= _LOW_KEY - 1
    if len(keys) and keys.max() > _BINS - 1:
        np.minimum(keys, _BINS - 1, out=keys)
    return keys


def _bin_values() -> np.ndarray:
    """A representative value per bin: the middle of its range."""
    keys = np.arange(_LOW_KEY, _HIGH_KEY + 1, dtype=np.int64)
    lo = (keys << _SHIFT).view(np.float64)
    hi = ((keys + 1) << _SHIFT).view(np.float64)
    return np.r_[0.0, (lo + hi) / 2]


def _weighted_sum(values: np.ndarray, repeats: np.ndarray | None) -> float:
    return float(values.sum() if repeats is None else (values * repeats).sum())


class Binned(NamedTuple):
    """Values counted into the histogram's bins by ``PooledDistribution.bin``."""

    pos: np.ndarray  # counts of values >= 0, per bin
    neg: np.ndarray | None  # ... of -v for values < 0 (None: there were none)
    n: int  # values counted
    total: float


def _clean(
    values: np.ndarray, repeats: np.ndarray | None, placeholders: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, int, float]:
    """(values, repeats, placeholders left in ``values``, count, sum) of what
    ``PooledDistribution.add`` is given: NaNs dropped, and placeholders too where repeats
    are given; repeats of all ones become None."""
    drop = np.empty(0, np.int64) if placeholders is None else placeholders
    added: float | None = _weighted_sum(values, repeats)  # placeholders add 0.0
    if added != added and np.isnan(values).any():  # a NaN sum: NaNs to drop (no extra pass otherwise)
        keep = ~np.isnan(values)
        if len(drop):
            keep[drop] = False
            drop = np.empty(0, np.int64)
        values = values[keep]
        repeats = None if repeats is None else repeats[keep]
        added = None
    if len(drop) and repeats is not None:
        repeats = np.delete(repeats, drop)
        values = np.delete(values, drop)
        drop = np.empty(0, np.int64)
        added = None
    if repeats is not None and (repeats == 1).all():
        repeats = None  # the sum stays: values * 1 is values
    count = (len(values) - len(drop)) if repeats is None else int(repeats.sum())
    if added is None:
        added = _weighted_sum(values, repeats)
    return values, repeats, drop, count, added


def _bin_counts(
    values: np.ndarray, repeats: np.ndarray | None, zeros_to_ignore: int = 0
) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-bin counts of ``values`` >= 0 and of -v for values < 0 (None when there are
    none), less ``zeros_to_ignore`` placeholder zeros (0.0 falls in bin 0)."""
    neg_counts = None
    if len(values) and values.min() < 0:
        neg = values < 0
        w = None if repeats is None else repeats[neg]
        neg_counts = np.bincount(_bin_index(-values[neg]), weights=w, minlength=_BINS).astype(np.int64)
        values = values[~neg]
        repeats = None if repeats is None else repeats[~neg]
    counts = np.bincount(_bin_index(values), weights=repeats, minlength=_BINS).astype(np.int64, copy=False)
    counts[0] -= zeros_to_ignore
    return counts, neg_counts


class PooledDistribution:
    """Token-level values pooled over a run, fed batch by batch.

    Exact (the values themselves, numpy 'linear' percentiles) while at most ``exact_limit``
    values have been added; past that, a log-linear histogram (``_bin_index``) whose
    percentiles are within HISTOGRAM_RELATIVE_ERROR (0.0122 %) of the exact ones. The mean
    is a running sum either way. Which method applies depends on the total count alone.
    """

    def __init__(self, exact_limit: int = EXACT_LIMIT) -> None:
        self.exact_limit = exact_limit
        self.n = 0
        self.total = 0.0
        self._parts: list[np.ndarray] = []
        self._pos: np.ndarray | None = None  # histogram counts of values >= 0
        self._neg: np.ndarray | None = None  # ... of -v for values < 0
        #: (values given, values kept or None, their bin counts or None, count, sum) of the
        #: last ``add``, for ``same_as``
        self._last: tuple[np.ndarray, np.ndarray | None, np.ndarray | None, int, float] | None = None

    @property
    def method(self) -> str:
        return "exact" if self._pos is None else "histogram"

    def add(
        self,
        values: np.ndarray,
        repeats: np.ndarray | None = None,
        same_as: "PooledDistribution | None" = None,
        placeholders: np.ndarray | None = None,
    ) -> None:
        """Add ``values`` (each ``repeats`` times when given; NaNs ignored). ``same_as``: a
        distribution that was just given the very same array (its bins are reused).
        ``placeholders``: indices of entries of ``values`` that are 0.0 and stand for no value
        (left in place to spare a copy of ``values``); they are neither kept nor counted."""
        if len(values) == 0:
            return
        if same_as is not None and same_as._last is not None and same_as._last[0] is values and repeats is None:
            _, kept, counts, count, last_added = same_as._last
            if self._pos is None and self.n + count <= self.exact_limit and kept is not None:
                self._parts.append(kept)
            elif self._pos is not None and counts is not None:
                self._pos += counts
            else:
                count = -1
            if count >= 0:
                self.n += count
                self.total += last_added
                self._last = None
                return
        self._last = None
        source = values
        values, repeats, drop, count, added = _clean(values, repeats, placeholders)
        self.n += count
        self.total += added
        if self._pos is None and self.n <= self.exact_limit:
            if repeats is not None:
                kept = np.repeat(values, repeats)
            elif len(drop):
                kept = np.delete(values, drop)
            else:
                kept = values.copy()
            self._parts.append(kept)
            self._last = (source, kept, None, count, added)
            return
        if self._pos is None:
            self._pos = np.zeros(_BINS, np.int64)
            self._neg = np.zeros(_BINS, np.int64)
            for part in self._parts:
                self._count(part, None)
            self._parts = []
        counts = self._count(values, repeats, len(drop))
        self._last = (source, None, counts, count, added)

    def _count(self, values: np.ndarray, repeats: np.ndarray | None, zeros_to_ignore: int = 0) -> np.ndarray | None:
        """Count ``values`` into the bins, less ``zeros_to_ignore`` placeholder zeros. Returns
        the positive bins' counts of this call when they alone changed (for ``same_as``)."""
        assert self._pos is not None and self._neg is not None
        pos, neg = _bin_counts(values, repeats, zeros_to_ignore)
        self._pos += pos
        if neg is not None:
            self._neg += neg
        return None if neg is not None or repeats is not None else pos

    @staticmethod
    def bin(values: np.ndarray, repeats: np.ndarray | None = None, placeholders: np.ndarray | None = None) -> Binned:
        """``values`` (as ``add`` takes them) counted into the histogram's bins, without
        touching any distribution: thread-safe, so the counting can run beside the caller.
        ``add_binned`` then adds them in O(bins)."""
        values, repeats, drop, count, added = _clean(values, repeats, placeholders)
        pos, neg = _bin_counts(values, repeats, len(drop))
        return Binned(pos, neg, count, added)

    def add_binned(self, binned: Binned) -> bool:
        """Add values counted by ``bin``, if this distribution is a histogram already (the
        same result as ``add`` of those values); False, changing nothing, while it is exact."""
        if self._pos is None or self._neg is None:
            return False
        self._pos += binned.pos
        if binned.neg is not None:
            self._neg += binned.neg
        self.n += binned.n
        self.total += binned.total
        self._last = None
        return True

    def values(self) -> np.ndarray:
        """The pooled values (exact method only)."""
        if self._pos is not None:
            raise ValueError("values are not kept past the exact limit")
        if self._parts is _CONSUMED:
            raise ValueError("values were consumed by final_summaries")
        return np.concatenate(self._parts) if self._parts else np.empty(0)

    def summary(self, ps: tuple[float, ...]) -> dict[str, float]:
        """Like ``percentiles`` on the pooled values (exact, or within the stated bound)."""
        if self._pos is None:
            return percentiles(self.values(), ps)
        return self._histogram_summary(ps)

    def _histogram_summary(self, ps: tuple[float, ...]) -> dict[str, float]:
        assert self._neg is not None
        if self.n == 0:
            return percentiles(np.empty(0), ps)
        reps = _bin_values()
        value = np.r_[-reps[::-1], reps]
        cum = np.cumsum(np.r_[self._neg[::-1], self._pos])
        h = (self.n - 1) * np.asarray(ps, dtype=np.float64) / 100
        lo = np.floor(h)
        at = lambda rank: value[np.searchsorted(cum, rank, side="right")]  # noqa: E731
        qs = at(lo) + (h - lo) * (at(np.minimum(lo + 1, self.n - 1)) - at(lo))
        return {"n": int(self.n), "mean": self.total / self.n, **{f"p{_pname(p)}": float(q) for p, q in zip(ps, qs)}}


def final_summaries(dists: list[PooledDistribution], ps: tuple[float, ...]) -> list[dict[str, float]]:
    """``summary(ps)`` of each distribution, the very same figures, in at most the memory of
    the values held: an exact distribution's values are moved into one array part by part
    (each part freed as it is copied, not concatenated beside them), its percentiles taken in
    place, and a distribution pooled from the very same arrays as an earlier one (``same_as``)
    gets that one's figures. Consumes the exact distributions: their ``values()`` are gone."""
    out: list[dict[str, float]] = []
    for i, dist in enumerate(dists):
        same = next((j for j in range(i) if _same_parts(dists[j], dist)), None)
        if same is not None:
            out.append(dict(out[same]))
        elif dist._pos is not None:
            out.append(dist._histogram_summary(ps))
        else:
            sharing = [d for d in dists[i + 1 :] if _same_parts(dist, d)]
            out.append(percentiles_in_place(_gather(dist, sharing), ps))
    for dist in dists:
        if dist._pos is None:
            dist._parts = _CONSUMED
    return out


#: What ``final_summaries`` leaves of an exact distribution's values.
_CONSUMED: list[np.ndarray] = []


def _same_parts(a: PooledDistribution, b: PooledDistribution) -> bool:
    """Whether both are exact and hold the very same arrays (``add(..., same_as=)``)."""
    return (
        a._pos is None and b._pos is None and a._parts is not _CONSUMED and len(a._parts) == len(b._parts)
        and all(x is y for x, y in zip(a._parts, b._parts))
    )  # fmt: skip


def _gather(dist: PooledDistribution, sharing: list[PooledDistribution]) -> np.ndarray:
    """``dist``'s values as one array (``values()``), each part dropped from ``dist`` and from
    the distributions ``sharing`` it as soon as it is copied, so it can be freed."""
    parts = dist._parts
    values = np.empty(sum(len(p) for p in parts), np.float64 if not parts else np.result_type(*parts))
    at = 0
    for k in range(len(parts)):
        n = len(parts[k])
        values[at : at + n] = parts[k]
        at += n
        for d in (dist, *sharing):
            d._parts[k] = _EMPTY
            d._last = None  # it may hold the last part
        if k % 4 == 3:
            return_freed_memory()  # the freed parts' pages, kept by keep_freed_memory()
    return_freed_memory()
    return values


_EMPTY = np.empty(0)


def percentiles_in_place(values: np.ndarray, ps: tuple[float, ...]) -> dict[str, float]:
    """``percentiles(values, ps)``, the same figures, for values without NaNs that may be
    reordered (numpy partitions them in place instead of partitioning a copy)."""
    if len(values) == 0:
        return percentiles(values, ps)
    mean = float(values.mean())  # before the partition reorders the values
    qs = np.percentile(values, ps, overwrite_input=True)
    return {"n": len(values), "mean": mean, **{f"p{_pname(p)}": float(q) for p, q in zip(ps, qs)}}
