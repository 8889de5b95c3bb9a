"""Per-request and per-token metrics. Definitions: docs/metrics.md (one each).

All times come from the client's monotonic timestamps in the requests table; token
counts from ``chunk_tokens`` (whose source each row names in ``token_source``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from bench_llm.core.memory import return_freed_memory

NS_PER_MS = 1e6

_SCALAR_COLUMNS = [
    "run_id",
    "request_id",
    "phase",
    "worker_id",
    "ok",
    "error_type",
    "error_message",
    "intended_send_ns",
    "send_ns",
    "first_byte_ns",
    "first_token_ns",
    "first_content_ns",
    "end_ns",
    "output_tokens",
    "token_source",
    "input_tokens_target",
    "input_tokens_source",
    "max_output_tokens",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "session_id",
    "turn",
    "prefix_group",
    "finish_reason",
    "reasoning_tokens",
    "kind",
    "model",
    "structured_ok",
    "inputs",
    "tool_calls",
    "first_tool_call_ns",
    "images",
    "n",
    "protocol_anomaly",  # read by the record checks (analysis/invariants.py)
]


def measured(table: pa.Table) -> pa.Table:
    """Rows that count: warm-up excluded."""
    keep = pc.equal(table["phase"], "measure")
    if pc.all(keep).as_py() is not False:  # nothing to drop: no copy of the chunk lists
        return table
    return table.filter(keep)


def request_metrics(table: pa.Table) -> pd.DataFrame:
    """One row per request with its latency metrics in milliseconds.

    ttft: first token-carrying chunk − send. ttfo: first answer (non-reasoning) token −
    send. e2e: end of response − send. tpot: (e2e − ttft) / (output_tokens / n − 1), per
    sequence (``n``: sequences per request, 1 unless sampling asked more), for requests with
    at least 2 output tokens per sequence. schedule_lag: send − intended send.
    ttft_from_intended: first token − intended send (includes any client lag).
    max_itl: the longest token-level gap inside the request (stall); NaN with n > 1.
    """
    for cached, frame in list(_METRICS_CACHE):  # (one read of the list: another thread may replace it)
        if cached is table:
            return frame.copy()
    df = _metrics_frame(table.select(scalar_columns(table.column_names)), _max_itl_per_request(table))
    if table.num_rows <= _METRICS_CACHE_ROWS:
        _METRICS_CACHE[:] = [(table, df.copy())]
    return df


#: The last table's ``request_metrics`` (identity-keyed; callers get a copy they may change):
#: a sweep judges each load twice (``point_metrics``, then ``open_loop_saturation``), and
#: pandas costs more than the copy. Only for tables up to this many rows (memory).
_METRICS_CACHE: list[tuple[pa.Table, pd.DataFrame]] = []
_METRICS_CACHE_ROWS = 100_000


def scalar_columns(names: list[str]) -> list[str]:
    """The per-request (non-list) columns the metrics need, of those present."""
    return [c for c in _SCALAR_COLUMNS if c in names]


def scalar_metrics(scalars: pa.Table) -> pd.DataFrame:
    """``request_metrics`` without ``max_itl_ms`` (which needs the chunk lists)."""
    return _metrics_frame(scalars, None)


def _metrics_frame(scalars: pa.Table, max_itl: np.ndarray | None) -> pd.DataFrame:
    """``scalars`` as a DataFrame with the metric columns after its own (``max_itl_ms`` last,
    when given). The metrics are computed on the columns as pandas would hold them (an integer
    column with nulls as float64 with NaN) and added in Arrow, so the frame is built once
    (inserting columns into a DataFrame one by one cost more than the arithmetic)."""

    def col(name: str) -> np.ndarray:
        return np.asarray(scalars.column(name).to_numpy(zero_copy_only=False)).astype("float64")

    send = col("send_ns")
    ft = col("first_token_ns")
    intended = col("intended_send_ns")
    ttft = (ft - send) / NS_PER_MS
    e2e = (col("end_ns") - send) / NS_PER_MS
    per_sequence = col("output_tokens") / sequences(scalars)
    with np.errstate(invalid="ignore", divide="ignore"):  # (np.where evaluates both branches)
        tpot = np.where(per_sequence >= 2, (e2e - ttft) / (per_sequence - 1), np.nan)
    metrics = {
        "ttft_ms": ttft,
        "ttfo_ms": (col("first_content_ns") - send) / NS_PER_MS,
        "e2e_ms": e2e,
        "tpot_ms": tpot,
        "schedule_lag_ms": (send - intended) / NS_PER_MS,
        "ttft_from_intended_ms": (ft - intended) / NS_PER_MS,
    }
    if max_itl is not None:
        metrics["max_itl_ms"] = max_itl
    table = scalars
    for name, values in metrics.items():
        array = pa.array(np.asarray(values, dtype="float64"))
        if name in table.column_names:  # (replaced in place, as pandas would)
            table = table.set_column(table.column_names.index(name), name, array)
        else:
            table = table.append_column(name, array)
    return table.to_pandas()


def sequences(rows: pd.DataFrame | pa.Table | pa.RecordBatch) -> np.ndarray:
    """Sequences generated per request (the ``n`` column; 1 where it is null or absent).

    The one place TPOT and ITL learn of ``n`` > 1 (docs/metrics.md): TPOT is per sequence,
    and the chunks of a request's sequences interleave, so their gaps are no sequence's
    inter-token latency (``per_token_rows``)."""
    if isinstance(rows, pd.DataFrame):
        if "n" not in rows:
            return np.ones(len(rows))
        values = rows["n"].to_numpy(dtype="float64", na_value=np.nan)
    else:
        if "n" not in rows.schema.names:
            return np.ones(rows.num_rows)
        values = np.asarray(rows.column("n").to_numpy(zero_copy_only=False), dtype="float64")
    return np.where(np.isnan(values) | (values < 1), 1.0, values)


def per_token_rows(rows: pa.Table | pa.RecordBatch) -> np.ndarray:
    """The rows whose chunk gaps are inter-token latencies: one sequence per request. With
    n > 1 the sequences' chunks interleave and ITL, chunk gap and max ITL are not measured."""
    return sequences(rows) == 1


class TokenChunks(NamedTuple):
    """The token-carrying chunks of a batch of rows, flattened in row order."""

    ts: np.ndarray  # chunk time (ns, int64)
    tokens: np.ndarray  # tokens in the chunk (> 0)
    row: np.ndarray  # row index within the batch (int32, non-decreasing)
    rows: int  # rows in the batch


class ChunkGaps(NamedTuple):
    """Gaps between consecutive token-carrying chunks of the same request."""

    gap_ns: np.ndarray  # float64
    tokens: np.ndarray  # tokens in the chunk that ends the gap
    row: np.ndarray  # row index within the batch (non-decreasing)


def token_chunks(batch: pa.Table | pa.RecordBatch) -> TokenChunks:
    """Flatten ``chunk_ns``/``chunk_tokens`` of one batch (zero-copy where Arrow allows)."""
    ts_arr, tk_arr = batch.column("chunk_ns"), batch.column("chunk_tokens")
    if isinstance(ts_arr, pa.ChunkedArray):
        ts_arr, tk_arr = ts_arr.combine_chunks(), tk_arr.combine_chunks()
    n = len(ts_arr)
    if n == 0:
        return TokenChunks(np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.int32), 0)
    ts = ts_arr.flatten().to_numpy(zero_copy_only=False)
    tk = tk_arr.flatten().to_numpy(zero_copy_only=False)
    offsets = ts_arr.offsets.to_numpy()
    lengths = np.diff(offsets)
    row = np.repeat(np.arange(n, dtype=np.int32), lengths)
    keep = tk > 0
    if not keep.all():
        ts, tk, row = ts[keep], tk[keep], row[keep]
    return TokenChunks(ts.astype(np.int64, copy=False), tk, row, n)


def chunk_gaps(chunks: TokenChunks) -> ChunkGaps:
    ts, tk, row = chunks.ts, chunks.tokens, chunks.row
    if len(ts) < 2:
        return ChunkGaps(np.empty(0), np.empty(0, dtype=np.int32), np.empty(0, dtype=np.int32))
    same = row[1:] == row[:-1]
    gaps = np.subtract(ts[1:], ts[:-1], dtype=np.int64)[same].astype(np.float64)
    return ChunkGaps(gaps, tk[1:][same], row[1:][same])


def itl_values_ms(gaps: ChunkGaps) -> np.ndarray:
    """Token-level ITL values: a chunk of k tokens gives k values of gap/k."""
    if len(gaps.gap_ns) == 0:
        return np.empty(0)
    if (gaps.tokens == 1).all():  # one token per chunk (the common case): no repeat needed
        return gaps.gap_ns / NS_PER_MS
    return np.repeat(gaps.gap_ns / gaps.tokens, gaps.tokens) / NS_PER_MS


def row_max(values: np.ndarray, row: np.ndarray, rows: int) -> np.ndarray:
    """Per-row maximum of ``values`` (``row`` non-decreasing); NaN for rows without values."""
    out = np.full(rows, np.nan)
    if len(values):
        starts = np.r_[0, np.flatnonzero(row[1:] != row[:-1]) + 1]
        out[row[starts]] = np.maximum.reduceat(values, starts)
    return out


def max_itl_ms(gaps: ChunkGaps, rows: int) -> np.ndarray:
    """Per row: the longest token-level gap (gap / tokens of the chunk that ends it), ms."""
    return row_max(gaps.gap_ns / gaps.tokens, gaps.row, rows) / NS_PER_MS

#: The last table's gaps (identity-keyed): report code asks for them more than once.
_GAPS_CACHE: list[tuple[pa.Table, ChunkGaps]] = []


def clear_cache() -> None:
    _GAPS_CACHE.clear()
    _METRICS_CACHE.clear()


def _gaps(table: pa.Table) -> ChunkGaps:
    """Chunk gaps of a whole table, computed record batch by record batch, rows in table order."""
    if _GAPS_CACHE and _GAPS_CACHE[0][0] is table:
        return _GAPS_CACHE[0][1]
    parts: list[ChunkGaps] = []
    row0 = 0
    columns = ["chunk_ns", "chunk_tokens", *(["n"] if "n" in table.column_names else [])]
    for batch in table.select(columns).to_batches():
        if batch.num_rows:
            g = chunk_gaps(token_chunks(batch))
            single = per_token_rows(batch)
            if not single.all():  # n > 1: no inter-token latency
                keep = single[g.row]
                g = ChunkGaps(g.gap_ns[keep], g.tokens[keep], g.row[keep])
            parts.append(ChunkGaps(g.gap_ns, g.tokens, g.row + row0))
        row0 += batch.num_rows
    if not parts:
        result = ChunkGaps(np.empty(0), np.empty(0, dtype=np.int32), np.empty(0, dtype=np.int32))
    elif len(parts) == 1:
        result = parts[0]
    else:
        result = ChunkGaps(*(np.concatenate([p[i] for p in parts]) for i in range(3)))
    _GAPS_CACHE[:] = [(table, result)]
    return result


def itl_ms(table: pa.Table) -> np.ndarray:
    """Token-level inter-token latency: a chunk of k tokens gives k values of gap/k."""
    return itl_values_ms(_gaps(table))


def chunk_gap_ms(table: pa.Table) -> np.ndarray:
    """Raw gaps between consecutive token-carrying chunks (one value per chunk)."""
    return _gaps(table).gap_ns / NS_PER_MS


def _max_itl_per_request(table: pa.Table) -> np.ndarray:
    return max_itl_ms(_gaps(table), table.num_rows)


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


class OneTokenChunks(NamedTuple):
    """A batch whose token-carrying chunks all carry one token (the common case), kept as
    flat times plus per-row offsets: no per-chunk row index is needed."""

    ts: np.ndarray  # times of the token-carrying chunks (int64 ns), row after row
    offsets: np.ndarray  # row r's chunks are ts[offsets[r]:offsets[r + 1]] (int64, rows + 1)


def one_token_chunks(batch: pa.Table | pa.RecordBatch) -> OneTokenChunks | None:
    """``OneTokenChunks`` of a batch, or None when some chunk carries more than one token."""
    ts_arr, tk_arr = batch.column("chunk_ns"), batch.column("chunk_tokens")
    if isinstance(ts_arr, pa.ChunkedArray):
        ts_arr, tk_arr = ts_arr.combine_chunks(), tk_arr.combine_chunks()
    if len(ts_arr) == 0:
        return None
    ts = ts_arr.flatten().to_numpy(zero_copy_only=False)
    tk = tk_arr.flatten().to_numpy(zero_copy_only=False)
    offsets = ts_arr.offsets.to_numpy().astype(np.int64)
    offsets -= offsets[0]
    if len(tk) != len(ts) or not np.array_equal(tk_arr.offsets.to_numpy() - tk_arr.offsets.to_numpy()[0], offsets):
        return None
    if tk.dtype.kind not in "iu" or ts.dtype.kind not in "iu" or (len(tk) and (tk.max() > 1 or tk.min() < 0)):
        return None  # nulls inside the lists, or multi-token chunks: the general path
    drop = np.flatnonzero(tk == 0)  # role-only, empty and usage-only frames: usually few
    if len(drop):
        ts = np.delete(ts, drop)
        offsets = offsets - np.searchsorted(drop, offsets)
    return OneTokenChunks(ts.astype(np.int64, copy=False), offsets)


def one_token_gaps(chunks: OneTokenChunks) -> tuple[np.ndarray, np.ndarray]:
    """(chunk gaps in row order as int64 ns, per-row longest gap in ns as float64, NaN for
    rows with fewer than two chunks). With one token per chunk the longest gap is also the
    row's max ITL."""
    ts, off = chunks.ts, chunks.offsets
    rows = len(off) - 1
    longest = np.full(rows, np.nan)
    if len(ts) < 2:
        return np.empty(0, np.int64), longest
    d = np.diff(ts)
    inner = off[1:-1]
    boundary = np.unique(inner[(inner > 0) & (inner < len(ts))]) - 1  # gaps that cross rows
    gaps = np.delete(d, boundary) if len(boundary) else d.copy()
    d[boundary] = np.iinfo(np.int64).min
    n = np.diff(off)
    has = n >= 2
    if has.any():
        longest[has] = np.maximum.reduceat(d, off[:-1][has]).astype(np.float64)
    return gaps, longest


def one_token_gap_rows_ok(chunks: OneTokenChunks, ok: np.ndarray) -> np.ndarray:
    """Per gap (in ``one_token_gaps`` order): does it belong to an ``ok`` row?"""
    return np.repeat(ok, np.maximum(np.diff(chunks.offsets) - 1, 0))


def concat_ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``np.r_[lo[0]:hi[0], lo[1]:hi[1], ...]`` (int64) without a Python loop; empty ranges skipped."""
    lo = np.asarray(lo, np.int64)
    n = np.maximum(np.asarray(hi, np.int64) - lo, 0)
    total = int(n.sum())
    if total == 0:
        return np.empty(0, np.int64)
    first = np.cumsum(n) - n  # where each range starts in the output
    return np.arange(total, dtype=np.int64) + np.repeat(lo - first, n)


def reduce_ranges(ufunc: np.ufunc, values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``ufunc.reduce`` of ``values[lo[i]:hi[i]]`` for each i; the ranges must be non-empty,
    in order and not overlapping (one ``reduceat`` over the interleaved bounds)."""
    if len(lo) == 0:
        return np.empty(0, values.dtype)
    idx = np.empty(2 * len(lo), np.int64)
    idx[0::2] = lo
    idx[1::2] = hi
    if idx[-1] >= len(values):  # the last range runs to the end: reduceat's last segment does
        idx = idx[:-1]
    return ufunc.reduceat(values, idx)[0::2]


class TokenRanges(NamedTuple):
    """A batch whose token-carrying chunks all carry one token and sit together in each row:
    zero-token frames (role-only, empty, usage-only) only before a row's first token or after
    its last, as engines send them. Row r's tokens arrived at ``ts[start[r]:end[r]]``; the
    chunk lists are used in place (nothing is copied or deleted)."""

    ts: np.ndarray  # every chunk time of the batch (int64 ns), row after row
    start: np.ndarray  # int64 per row
    end: np.ndarray  # int64 per row (== start: no token)


def token_ranges(batch: pa.Table | pa.RecordBatch) -> TokenRanges | None:
    """``TokenRanges`` of a batch, or None (multi-token chunks, zero-token frames between two
    token-carrying ones, nulls inside the lists): the other paths then apply."""
    ts_arr, tk_arr = batch.column("chunk_ns"), batch.column("chunk_tokens")
    if isinstance(ts_arr, pa.ChunkedArray):
        ts_arr, tk_arr = ts_arr.combine_chunks(), tk_arr.combine_chunks()
    rows = len(ts_arr)
    if rows == 0:
        return None
    ts = ts_arr.flatten().to_numpy(zero_copy_only=False)
    tk = tk_arr.flatten().to_numpy(zero_copy_only=False)
    offsets = ts_arr.offsets.to_numpy().astype(np.int64)
    offsets -= offsets[0]
    tk_off = tk_arr.offsets.to_numpy()
    if len(tk) != len(ts) or len(ts) != offsets[-1] or not np.array_equal(tk_off - tk_off[0], offsets):
        return None
    if tk.dtype.kind not in "iu" or ts.dtype.kind != "i":
        return None  # nulls inside the lists
    start, end = offsets[:-1].copy(), offsets[1:].copy()
    other = np.flatnonzero(tk != 1)
    if len(other):
        if tk[other].any():
            return None  # a chunk of several (or a negative number of) tokens
        row = np.searchsorted(offsets, other, side="right") - 1
        first = np.r_[True, row[1:] != row[:-1]]
        group = np.cumsum(first) - 1  # which row-group of zeros each zero belongs to
        group_start = np.flatnonzero(first)
        group_end = np.r_[group_start[1:], len(other)]
        rank = np.arange(len(other)) - group_start[group]  # zeros before it in its row
        rank_back = group_end[group] - 1 - np.arange(len(other))  # zeros after it in its row
        leading = other - offsets[row] == rank
        trailing = offsets[row + 1] - 1 - other == rank_back
        if not (leading | trailing).all():
            return None  # a zero-token frame between tokens
        start += np.bincount(row[leading], minlength=rows)
        end -= np.bincount(row[trailing & ~leading], minlength=rows)
    return TokenRanges(ts.astype(np.int64, copy=False), start, end)


def token_range_gaps(ranges: TokenRanges, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(gaps, excluded, longest) of a ``TokenRanges`` batch, where ``gaps[j] = ts[j + 1] − ts[j]``
    (int64 ns) for every pair of neighbouring chunks, except at ``excluded``: the pairs that are
    no gap between two tokens of one ``ok`` row, set to 0 (placeholders for
    ``PooledDistribution.add``). ``longest``: per row, ok or not, the longest gap (ns, float64;
    NaN for rows with fewer than two tokens), which with one token per chunk is also its max ITL.
    The gaps of the ok rows, placeholders removed, are ``one_token_gaps``'s, in the same order."""
    ts, start, end = ranges
    rows = len(start)
    longest = np.full(rows, np.nan)
    if len(ts) < 2:
        return np.empty(0, np.int64), np.empty(0, np.int64), longest
    gaps = np.diff(ts)
    has = (end - start) >= 2
    if has.any():
        longest[has] = reduce_ranges(np.maximum, gaps, start[has], end[has] - 1).astype(np.float64)
    sel = has & ok
    lo, hi = start[sel], end[sel] - 1  # the kept gaps: gaps[lo[i]:hi[i]]
    excluded = concat_ranges(np.r_[0, hi], np.r_[lo, len(gaps)])
    gaps[excluded] = 0
    return gaps, excluded, longest
