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
