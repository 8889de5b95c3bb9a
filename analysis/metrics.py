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
    return table.filter(pc.equal(table["phase"], "measure"))


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


def _gaps(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gaps (ns) between consecutive token-carrying chunks of the same request."""
    ts, tk, row = _flatten(table)
    if len(ts) < 2:
        return np.empty(0), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    same = row[1:] == row[:-1]
    gaps = (ts[1:] - ts[:-1])[same]
    return gaps.astype(np.float64), tk[1:][same], row[1:][same]


def itl_ms(table: pa.Table) -> np.ndarray:
    """Token-level inter-token latency: a chunk of k tokens gives k values of gap/k."""
    gaps, k, _ = _gaps(table)
    if len(gaps) == 0:
        return np.empty(0)
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
        order = np.lexsort((per_token, row))
        # last entry per row in (row, value) order is that row's max
        last = np.r_[row[order][1:] != row[order][:-1], True]
        out[row[order][last]] = per_token[order][last] / NS_PER_MS
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
