"""Streaming smoothness: per-request fluidity and longest gap. Definitions: docs/metrics.md.

Fluidity follows the deadline-schedule idea of Etalon/Metron (Agrawal et al. 2024): token 1
is due ``ttft_deadline`` after the request was sent, each later token ``token_interval`` after
the previous token's deadline. Early tokens bank slack for later ones (deadlines are chained
to deadlines, not to arrivals). A token that arrives after its deadline is a miss and the
schedule is re-based on that token's arrival, so one stall costs once rather than forever.
fluidity = tokens on time / tokens.

Vectorised form (why it is exact): with token index i (1-based), arrival t_i and
u_i = t_i − i·D_d, the schedule's threshold before token i is c_0 = send + D_p − D_d, raised
to u_k at every miss k. Token i misses iff u_i > max(c_0, u_k for earlier misses k). Tokens
that did not miss had u ≤ the threshold at the time, so the running maximum over *all*
earlier u equals the running maximum over earlier misses: miss_i iff u_i > max(c_0,
cummax(u)_{i−1}). This needs one grouped cumulative maximum instead of a Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

NS_PER_MS = 1e6

#: Deadlines used when the run has no SLO for them (reading-speed-ish decode, 1 s first token).
DEFAULT_TTFT_DEADLINE_MS = 1000.0
DEFAULT_TOKEN_INTERVAL_MS = 50.0


@dataclass(frozen=True, slots=True)
class Deadlines:
    ttft_ms: float = DEFAULT_TTFT_DEADLINE_MS
    token_interval_ms: float = DEFAULT_TOKEN_INTERVAL_MS

    def __post_init__(self) -> None:
        if not (self.ttft_ms > 0 and self.token_interval_ms > 0):
            raise ValueError("fluidity deadlines must be positive")

    @classmethod
    def from_slo(cls, limits: dict[str, float]) -> "Deadlines":
        """TTFT deadline from ``ttft_ms``, per-token interval from ``tpot_ms`` when given."""
        return cls(
            float(limits.get("ttft_ms", DEFAULT_TTFT_DEADLINE_MS)),
            float(limits.get("tpot_ms", DEFAULT_TOKEN_INTERVAL_MS)),
        )


def _token_arrivals(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(arrival ns, row index) of every output token; a k-token chunk gives k equal arrivals."""
    if table.num_rows == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    ts_col = table["chunk_ns"].combine_chunks()
    tk_col = table["chunk_tokens"].combine_chunks()
    ts = ts_col.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    tk = tk_col.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = np.diff(ts_col.offsets.to_numpy())
    row = np.repeat(np.arange(len(lengths)), lengths)
    keep = tk > 0
    ts, tk, row = ts[keep], tk[keep], row[keep]
    return np.repeat(ts, tk), np.repeat(row, tk)


def smoothness_metrics(table: pa.Table, deadlines: Deadlines = Deadlines()) -> pd.DataFrame:
    """Per request (one row per table row, same order): ``fluidity``, ``missed_deadlines``,
    ``longest_gap_ms``. Requests with no tokens or no send time get NaN."""
    n = table.num_rows
    fluidity = np.full(n, np.nan)
    misses = np.full(n, np.nan)
    longest = np.full(n, np.nan)
    arrivals, row = _token_arrivals(table)
    if len(arrivals):
        send = table["send_ns"].to_numpy(zero_copy_only=False)
        send = np.asarray(pd.array(send, dtype="Float64").to_numpy(dtype=float, na_value=np.nan))
        starts = np.r_[0, np.flatnonzero(row[1:] != row[:-1]) + 1]
        counts = np.diff(np.r_[starts, len(row)])
        idx = np.arange(len(row)) - np.repeat(starts, counts) + 1  # 1-based token index
        dd = deadlines.token_interval_ms * NS_PER_MS
        rel = (arrivals - arrivals[np.repeat(starts, counts)]).astype(np.float64)  # precision
        base = arrivals[starts].astype(np.float64)
        c0 = send[row[starts]] + deadlines.ttft_ms * NS_PER_MS - dd - base
        u = rel - idx * dd
        prev_max = pd.Series(u).groupby(row).cummax().groupby(row).shift(1).to_numpy()
        thresh = np.fmax(np.repeat(c0, counts), prev_max)  # fmax: NaN (first token) → c0
        missed = u > thresh
        r = row[starts]
        valid = ~np.isnan(send[r])
        miss_n = np.add.reduceat(missed.astype(np.int64), starts)
        fluidity[r[valid]] = 1.0 - miss_n[valid] / counts[valid]
        misses[r[valid]] = miss_n[valid]
        gaps = np.diff(arrivals).astype(np.float64)
        gaps[row[1:] != row[:-1]] = 0.0
        gaps = np.r_[gaps, 0.0]
        longest[r] = np.maximum.reduceat(gaps, starts) / NS_PER_MS
        longest[r[counts < 2]] = np.nan
    return pd.DataFrame({"fluidity": fluidity, "missed_deadlines": misses, "longest_gap_ms": longest})


def fluidity_reference(send_ns: int, arrivals_ns: list[int], deadlines: Deadlines) -> float:
    """The definition as a plain loop (used by tests to check the vectorised form)."""
    if not arrivals_ns:
        return float("nan")
    due = send_ns + deadlines.ttft_ms * NS_PER_MS
    met = 0
    for t in arrivals_ns:
        if t <= due:
            met += 1
            due += deadlines.token_interval_ms * NS_PER_MS
        else:
            due = t + deadlines.token_interval_ms * NS_PER_MS
    return met / len(arrivals_ns)
