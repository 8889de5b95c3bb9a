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
import pyarrow.compute as pc

from bench_llm.analysis.metrics import (
    ChunkGaps,
    OneTokenChunks,
    TokenChunks,
    TokenRanges,
    chunk_gaps,
    concat_ranges,
    reduce_ranges,
    row_max,
    token_chunks,
)

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


def send_ns_float(batch: pa.Table | pa.RecordBatch) -> np.ndarray:
    """``send_ns`` of a batch as float64 ns, NaN where missing."""
    col = batch.column("send_ns")
    return np.asarray(pc.fill_null(pc.cast(col, pa.float64()), np.nan).to_numpy(zero_copy_only=False), dtype=np.float64)


def smoothness_metrics(table: pa.Table, deadlines: Deadlines = Deadlines()) -> pd.DataFrame:
    """Per request (one row per table row, same order): ``fluidity``, ``missed_deadlines``,
    ``longest_gap_ms``. Requests with no tokens or no send time get NaN."""
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for batch in table.select(["send_ns", "chunk_ns", "chunk_tokens"]).to_batches():
        if batch.num_rows:
            chunks = token_chunks(batch)
            parts.append(batch_smoothness(chunks, chunk_gaps(chunks), send_ns_float(batch), deadlines))
    if not parts:
        return pd.DataFrame({"fluidity": np.empty(0), "missed_deadlines": np.empty(0), "longest_gap_ms": np.empty(0)})
    return pd.DataFrame(
        {name: np.concatenate([p[i] for p in parts]) for i, name in enumerate(("fluidity", "missed_deadlines", "longest_gap_ms"))}
    )


def batch_smoothness(
    chunks: TokenChunks, gaps: ChunkGaps, send: np.ndarray, deadlines: Deadlines
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fluidity, missed deadlines, longest gap ms) per row of one batch.

    Takes the batch's token chunks and chunk gaps as analysis/metrics.py computed them for
    ITL, so the chunk lists are flattened once per batch.
    """
    n = chunks.rows
    fluidity = np.full(n, np.nan)
    misses = np.full(n, np.nan)
    if len(chunks.ts) == 0:
        return fluidity, misses, np.full(n, np.nan)
    tokens = np.bincount(chunks.row, weights=chunks.tokens, minlength=n)
    # a row's longest gap is its longest chunk gap; tokens sharing one chunk are 0 apart
    longest = row_max(gaps.gap_ns, gaps.row, n)
    longest = np.where(tokens >= 2, np.nan_to_num(longest, nan=0.0), np.nan) / NS_PER_MS
    if (chunks.tokens == 1).all():
        arrivals, row = chunks.ts, chunks.row
    else:
        arrivals, row = np.repeat(chunks.ts, chunks.tokens), np.repeat(chunks.row, chunks.tokens)
    starts = np.r_[0, np.flatnonzero(row[1:] != row[:-1]) + 1]
    counts = np.diff(np.r_[starts, len(row)])
    r = row[starts]
    valid = ~np.isnan(send[r])
    miss_n = np.zeros(len(starts), np.int64)
    late = _may_miss(arrivals, starts, send[r], deadlines) & valid
    if late.any():
        # only requests with a token behind the un-rebased schedule can miss: the rest are 0
        if late.all():
            sub_arr, sub_row, sub_starts, sub_counts = arrivals, row, starts, counts
        else:
            tok = np.repeat(late, counts)
            sub_arr, sub_row, sub_counts = arrivals[tok], row[tok], counts[late]
            sub_starts = np.r_[0, np.cumsum(sub_counts)[:-1]]
        missed = _missed_integer(sub_arr, sub_starts, sub_counts, send[r[late]], deadlines)
        if missed is None:
            missed = _missed_float(sub_arr, sub_row, sub_starts, sub_counts, send[r[late]], deadlines)
        miss_n[late] = np.add.reduceat(missed.astype(np.int64), sub_starts)
    fluidity[r[valid]] = 1.0 - miss_n[valid] / counts[valid]
    misses[r[valid]] = miss_n[valid]
    return fluidity, misses, longest


def _may_miss(
    arrivals: np.ndarray, starts: np.ndarray, send: np.ndarray, deadlines: Deadlines, ends: np.ndarray | None = None
) -> np.ndarray:
    """Per request: does a token arrive after ``send + D_p + (i − 1)·D_d`` (its deadline if
    nothing before it missed)? When none does, nothing is ever re-based and the request has
    no miss; when one does, the first such token is a miss. True where unsure (NaN send,
    values beyond float64's exact integers). A request's tokens are ``arrivals[starts[k]:
    starts[k + 1]]``, or ``arrivals[starts[k]:ends[k]]`` when ``ends`` is given."""
    dd_f = deadlines.token_interval_ms * NS_PER_MS
    dp_f = deadlines.ttft_ms * NS_PER_MS
    exact = dd_f.is_integer() and dp_f.is_integer() and max(dd_f, dp_f) < 2**40 and len(arrivals) < 2**31
    if not exact or len(arrivals) == 0 or arrivals.max() >= 2**52 or arrivals.min() <= -(2**52):
        return np.ones(len(starts), bool)  # integers beyond exact float64 range: decide per token
    z = arrivals - _steps(int(dd_f), len(arrivals))  # t − (index in batch)·D_d
    dd = int(dd_f)
    top = np.maximum.reduceat(z, starts) if ends is None else reduce_ranges(np.maximum, z, starts, ends)
    worst = top + starts * dd  # max over the request of t_i − i·D_d
    return ~(worst <= send + (dp_f - dd))


_STEPS: list[tuple[int, np.ndarray]] = []


def _steps(dd: int, n: int) -> np.ndarray:
    """``dd * [1, 2, …, n]`` (int64), kept for the next batch of the same deadline: sized to
    the next power of two, so batches of about the same number of tokens (the summary's)
    share one array of at most twice a batch's (1024 rows x 257 tokens: 4 MB), not a fixed
    16 MB that would stay beside every summary."""
    entry = _STEPS[0] if _STEPS else None  # read once: another thread may replace it
    if entry is None or entry[0] != dd or len(entry[1]) < n:
        entry = (dd, dd * np.arange(1, (1 << max(n - 1, 0).bit_length()) + 1, dtype=np.int64))
        _STEPS[:] = [entry]
    return entry[1][:n]


def _missed_float(
    arrivals: np.ndarray, row: np.ndarray, starts: np.ndarray, counts: np.ndarray, send: np.ndarray, deadlines: Deadlines
) -> np.ndarray:
    """Per token: did it miss its deadline (module docstring), in float64 with a grouped cummax."""
    idx = np.arange(len(row)) - np.repeat(starts, counts) + 1  # 1-based token index
    dd = deadlines.token_interval_ms * NS_PER_MS
    rel = (arrivals - arrivals[np.repeat(starts, counts)]).astype(np.float64)  # precision
    base = arrivals[starts].astype(np.float64)
    c0 = send + deadlines.ttft_ms * NS_PER_MS - dd - base
    u = rel - idx * dd
    prev_max = pd.Series(u).groupby(row).cummax().groupby(row).shift(1).to_numpy()
    thresh = np.fmax(np.repeat(c0, counts), prev_max)  # fmax: NaN (first token) → c0
    return u > thresh


def _missed_integer(
    arrivals: np.ndarray, starts: np.ndarray, counts: np.ndarray, send: np.ndarray, deadlines: Deadlines
) -> np.ndarray | None:
    """``_missed_float`` in int64 when the deadlines are whole nanoseconds (the same result,
    since float64 holds these integers exactly), with a segmented cummax done as one global
    ``maximum.accumulate`` over keys that put each request above the one before it.
    None when that does not fit in 63 bits (the caller then uses the float form)."""
    dd_f = deadlines.token_interval_ms * NS_PER_MS
    dp_f = deadlines.ttft_ms * NS_PER_MS
    if not (dd_f.is_integer() and dp_f.is_integer()) or max(dd_f, dp_f) > 2**40:
        return None
    dd, dp = int(dd_f), int(dp_f)
    seg_of = np.repeat(np.arange(len(starts), dtype=np.int64), counts)
    base = arrivals[starts]
    idx = np.arange(1, len(arrivals) + 1, dtype=np.int64) - np.repeat(starts, counts)
    u = arrivals - base[seg_of] - idx * dd
    send_ok = ~np.isnan(send)
    if send_ok.any() and np.abs(send[send_ok]).max() >= 2**53:
        return None
    first_u = u[starts]
    c0 = np.where(send_ok, np.nan_to_num(send).astype(np.int64) + (dp - dd) - base, first_u)
    v = u.copy()
    v[starts] = np.maximum(first_u, c0)
    off = np.minimum.reduceat(v, starts)
    w = v - off[seg_of]
    shift = int(w.max()).bit_length()
    if shift + int(len(starts)).bit_length() > 62:
        return None
    cm = np.maximum.accumulate(w + (seg_of << shift)) - (seg_of << shift) + off[seg_of]
    thresh = np.empty_like(u)
    thresh[1:] = cm[:-1]
    thresh[starts] = c0
    return u > thresh


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


def one_token_fluidity(chunks: OneTokenChunks, send: np.ndarray, deadlines: Deadlines) -> tuple[np.ndarray, np.ndarray]:
    """(fluidity, missed deadlines) per row when every chunk carries one token
    (``batch_smoothness`` without per-token row indices; the same numbers)."""
    ts, off = chunks.ts, chunks.offsets
    rows = len(off) - 1
    fluidity = np.full(rows, np.nan)
    misses = np.full(rows, np.nan)
    counts_all = np.diff(off)
    nonempty = counts_all > 0
    if not nonempty.any():
        return fluidity, misses
    r = np.flatnonzero(nonempty)
    starts, counts = off[:-1][nonempty], counts_all[nonempty]
    valid = ~np.isnan(send[r])
    miss_n = np.zeros(len(r), np.int64)
    late = _may_miss(ts, starts, send[r], deadlines) & valid
    if late.any():
        miss_n[late] = _missed_per_row(ts[np.repeat(late, counts)], counts[late], r[late], send, deadlines)
    fluidity[r[valid]] = 1.0 - miss_n[valid] / counts[valid]
    misses[r[valid]] = miss_n[valid]
    return fluidity, misses


def token_range_fluidity(
    ranges: TokenRanges, send: np.ndarray, deadlines: Deadlines, longest_ns: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(fluidity, missed deadlines) per row of a ``TokenRanges`` batch (``one_token_fluidity``
    on the chunk lists in place; the same numbers).

    ``longest_ns``: each row's longest gap between tokens (NaN with fewer than two), as
    ``token_range_gaps`` gives it. A row whose first token is on time and whose gaps are all
    within the token interval meets every deadline (each token is then at most one interval
    after the previous one's deadline), so only the other rows' tokens are looked at."""
    ts, start, end = ranges
    rows = len(start)
    fluidity = np.full(rows, np.nan)
    misses = np.full(rows, np.nan)
    counts_all = end - start
    r = np.flatnonzero(counts_all > 0)
    if not len(r):
        return fluidity, misses
    starts, counts = start[r], counts_all[r]
    valid = ~np.isnan(send[r])
    miss_n = np.zeros(len(r), np.int64)
    check = valid & ~_calm_rows(ts[starts], send[r], longest_ns, r, deadlines)
    if check.all():
        late = _may_miss(ts, starts, send[r], deadlines, ends=starts + counts)
    else:
        late = np.zeros(len(r), bool)
        if check.any():
            sub_counts = counts[check]
            sub_arr = ts[concat_ranges(starts[check], starts[check] + sub_counts)]
            late[check] = _may_miss(sub_arr, np.cumsum(sub_counts) - sub_counts, send[r[check]], deadlines)
    late &= valid
    if late.any():
        sub_arr = ts[concat_ranges(starts[late], starts[late] + counts[late])]
        miss_n[late] = _missed_per_row(sub_arr, counts[late], r[late], send, deadlines)
    fluidity[r[valid]] = 1.0 - miss_n[valid] / counts[valid]
    misses[r[valid]] = miss_n[valid]
    return fluidity, misses


def _missed_per_row(
    sub_arr: np.ndarray, sub_counts: np.ndarray, rows: np.ndarray, send: np.ndarray, deadlines: Deadlines
) -> np.ndarray:
    """Missed deadlines per request, from the tokens of the requests ``rows`` (rows of the
    batch) laid back to back in ``sub_arr``, ``sub_counts`` tokens each."""
    sub_starts = np.r_[0, np.cumsum(sub_counts)[:-1]]
    missed = _missed_integer(sub_arr, sub_starts, sub_counts, send[rows], deadlines)
    if missed is None:
        sub_row = np.repeat(rows, sub_counts)
        missed = _missed_float(sub_arr, sub_row, sub_starts, sub_counts, send[rows], deadlines)
    return np.add.reduceat(missed.astype(np.int64), sub_starts)


def _calm_rows(
    first: np.ndarray, send: np.ndarray, longest_ns: np.ndarray | None, rows: np.ndarray, deadlines: Deadlines
) -> np.ndarray:
    """Per request (``rows`` of the batch): first token by ``send + D_p`` and no gap over
    ``D_d``, decided exactly (whole-nanosecond deadlines, times within float64's exact
    integers); False where that cannot be said, so that the request is looked at token by token."""
    dd_f = deadlines.token_interval_ms * NS_PER_MS
    dp_f = deadlines.ttft_ms * NS_PER_MS
    calm = np.zeros(len(rows), bool)
    if longest_ns is None or not (dd_f.is_integer() and dp_f.is_integer() and max(dd_f, dp_f) < 2**40):
        return calm
    fine = (np.abs(first) < 2**52) & (np.abs(send) < 2**52)  # NaN send: False
    with np.errstate(invalid="ignore"):
        calm = fine & (first.astype(np.float64) <= send + dp_f) & ~(longest_ns[rows] > dd_f)
    return calm
