"""Per-request and per-token metrics. Definitions: docs/metrics.md (one each).

All times come from the client's monotonic timestamps in the requests table; token
counts from ``chunk_tokens`` (whose source each row names in ``token_source``).
"""

from __future__ import annotations

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
    "intended_send_ns",
    "send_ns",
    "first_byte_ns",
    "first_token_ns",
    "first_content_ns",
    "end_ns",
    "output_tokens",
    "token_source",
    "input_tokens_target",
    "max_output_tokens",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "session_id",
    "prefix_group",
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
    send. e2e: end of response − send. tpot: (e2e − ttft) / (output_tokens − 1), for
    requests with at least 2 output tokens. schedule_lag: send − intended send.
    ttft_from_intended: first token − intended send (includes any client lag).
    max_itl: the longest token-level gap inside the request (stall).
    """
    cols = [c for c in _SCALAR_COLUMNS if c in table.column_names]
    df = table.select(cols).to_pandas()
    send = df["send_ns"].astype("float64")
    ft = df["first_token_ns"].astype("float64")
    df["ttft_ms"] = (ft - send) / NS_PER_MS
    df["ttfo_ms"] = (df["first_content_ns"].astype("float64") - send) / NS_PER_MS
    df["e2e_ms"] = (df["end_ns"].astype("float64") - send) / NS_PER_MS
    out = df["output_tokens"].astype("float64")
    df["tpot_ms"] = np.where(out >= 2, (df["e2e_ms"] - df["ttft_ms"]) / (out - 1), np.nan)
    df["schedule_lag_ms"] = (send - df["intended_send_ns"].astype("float64")) / NS_PER_MS
    df["ttft_from_intended_ms"] = (ft - df["intended_send_ns"].astype("float64")) / NS_PER_MS
    df["max_itl_ms"] = _max_itl_per_request(table)
    return df


def _flatten(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(timestamps, tokens, row index) of every chunk that carries tokens."""
    ts_col = table["chunk_ns"].combine_chunks()
    tk_col = table["chunk_tokens"].combine_chunks()
    ts = ts_col.flatten().to_numpy(zero_copy_only=False)
    tk = tk_col.flatten().to_numpy(zero_copy_only=False)
    offsets = ts_col.offsets.to_numpy()
    lengths = np.diff(offsets)
    row = np.repeat(np.arange(len(lengths)), lengths)
    keep = tk > 0
    return ts[keep].astype(np.int64), tk[keep].astype(np.int64), row[keep]


#: The last table's gaps (identity-keyed): the summary asks for them three times.
_GAPS_CACHE: list[tuple[pa.Table, tuple[np.ndarray, np.ndarray, np.ndarray]]] = []


def clear_cache() -> None:
    _GAPS_CACHE.clear()


def _keep_freed_memory() -> None:
    """Let glibc keep freed large blocks for reuse instead of returning them to the OS.

    Large per-token arrays are otherwise mmapped fresh each time, and first-touch page
    faults (slow on virtual machines) then cost more than the arithmetic itself.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, (1 << 31) - 1)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def _batch_gaps(ts_arr: pa.ListArray, tk_arr: pa.ListArray, row0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ts = ts_arr.flatten().to_numpy(zero_copy_only=False)
    tk = tk_arr.flatten().to_numpy(zero_copy_only=False)
    offsets = ts_arr.offsets.to_numpy()
    lengths = np.diff(offsets)
    keep = tk > 0
    if keep.all():
        ts_k, tk_k = ts, tk
        row = np.repeat(np.arange(row0, row0 + len(lengths), dtype=np.int32), lengths)
    else:
        ts_k, tk_k = ts[keep], tk[keep]
        row = np.repeat(np.arange(row0, row0 + len(lengths), dtype=np.int32), lengths)[keep]
    if len(ts_k) < 2:
        return np.empty(0), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    same = row[1:] == row[:-1]
    gaps = np.subtract(ts_k[1:], ts_k[:-1], dtype=np.int64)[same].astype(np.float64)
    return gaps, tk_k[1:][same], row[1:][same]  # int32 tokens and rows: memory for 1e8+ chunks


def _gaps(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gaps (ns) between consecutive token-carrying chunks of the same request.

    Computed record batch by record batch (no whole-table copy), rows in table order.
    """
    if _GAPS_CACHE and _GAPS_CACHE[0][0] is table:
        return _GAPS_CACHE[0][1]
    if table.num_rows > 100_000:
        _keep_freed_memory()
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    row0 = 0
    for batch in table.select(["chunk_ns", "chunk_tokens"]).to_batches():
        if batch.num_rows:
            parts.append(_batch_gaps(batch.column(0), batch.column(1), row0))
        row0 += batch.num_rows
    if not parts:
        result = (np.empty(0), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
    elif len(parts) == 1:
        result = parts[0]
    else:
        result = (
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
        )
    _GAPS_CACHE[:] = [(table, result)]
    return result


def itl_ms(table: pa.Table) -> np.ndarray:
    """Token-level inter-token latency: a chunk of k tokens gives k values of gap/k."""
    gaps, k, _ = _gaps(table)
    if len(gaps) == 0:
        return np.empty(0)
    if (k == 1).all():  # one token per chunk (the common case): no repeat needed
        return gaps / NS_PER_MS
    return np.repeat(gaps / k, k) / NS_PER_MS


def chunk_gap_ms(table: pa.Table) -> np.ndarray:
    """Raw gaps between consecutive token-carrying chunks (one value per chunk)."""
    gaps, _, _ = _gaps(table)
    return gaps / NS_PER_MS


def _max_itl_per_request(table: pa.Table) -> np.ndarray:
    out = np.full(table.num_rows, np.nan)
    gaps, k, row = _gaps(table)
    if len(gaps):
        per_token = gaps / k
        # rows come in table order, so each row's gaps are one contiguous run
        starts = np.r_[0, np.flatnonzero(row[1:] != row[:-1]) + 1]
        out[row[starts]] = np.maximum.reduceat(per_token, starts) / NS_PER_MS
    return out


def percentiles(values: np.ndarray, ps: tuple[float, ...]) -> dict[str, float]:
    """Mean and the requested percentiles (numpy 'linear' interpolation); NaNs ignored."""
    v = values[~np.isnan(values)] if len(values) else values
    if len(v) == 0:
        return {"n": 0, "mean": float("nan"), **{f"p{_pname(p)}": float("nan") for p in ps}}
    qs = np.percentile(v, ps)
    return {"n": int(len(v)), "mean": float(v.mean()), **{f"p{_pname(p)}": float(q) for p, q in zip(ps, qs)}}


def _pname(p: float) -> str:
    return f"{p:g}".replace(".", "_")
