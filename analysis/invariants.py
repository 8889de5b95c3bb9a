"""The invariants of a request record, and the named anomalies of records that break them.

A successful record's stamps are ordered (docs/metrics.md, Record invariants)::

    intended ≤ send ≤ first byte ≤ first token ≤ first content ≤ end

its chunk stamps never go back (no gap is negative), its first chunk arrives no earlier than
its first byte (tokens arrive after bytes) and its last no later than its end. The load
generator stamps so that these hold by construction; a record that still breaks one is an
*anomaly*: counted under the name of the first rule it breaks, and kept out of every metric.
So is a record of a stream that broke its protocol (``requests.protocol_anomaly``: a
cumulative usage count that went down, events after the end-of-stream marker).
Failed records are failures whatever their stamps (their timings feed no metric).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Anomaly names, in the order the rules are checked; code i + 1 in ``RecordChecks.anomaly``.
ANOMALIES: tuple[str, ...] = (
    "sent_before_intended",
    "first_byte_before_send",
    "token_before_first_byte",
    "content_before_token",
    "end_before_last_chunk",
    "negative_gap",
    # the stream itself broke its protocol (the recorder's ``protocol_anomaly``)
    "count_backwards",
    "event_after_end",
)

#: Scalar stamp pairs (earlier, later) per rule, in ``ANOMALIES`` order; chunk rules follow.
_PAIRS: tuple[tuple[str, str], ...] = (
    ("intended_send_ns", "send_ns"),
    ("send_ns", "first_byte_ns"),
    ("first_byte_ns", "first_token_ns"),
    ("first_token_ns", "first_content_ns"),
    ("first_content_ns", "end_ns"),
)
_CODE = {name: i + 1 for i, name in enumerate(ANOMALIES)}
#: Columns ``check_records`` reads (the chunk lists are optional).
CHECK_COLUMNS: tuple[str, ...] = (
    "ok", "intended_send_ns", "send_ns", "first_byte_ns", "first_token_ns", "first_content_ns", "end_ns",
    "protocol_anomaly",
)  # fmt: skip


class RecordChecks(NamedTuple):
    """Per row of a batch: the anomaly code (0: none; else ``ANOMALIES[code - 1]``) and
    whether every token of a successful response with ≥ 2 tokens came in one read."""

    anomaly: np.ndarray  # int8
    one_read: np.ndarray  # bool


def anomaly_name(code: int) -> str | None:
    return ANOMALIES[code - 1] if code else None


def check_records(batch: pa.Table | pa.RecordBatch) -> RecordChecks:
    """The invariants checked on every successful row of ``batch`` (stamps that are absent
    are not compared). Chunk rules need ``chunk_ns`` (and ``chunk_tokens`` for one_read)."""
    rows = batch.num_rows
    names = batch.schema.names
    ok = _bools(batch.column("ok")) if "ok" in names else np.ones(rows, bool)
    code = np.zeros(rows, np.int8)
    for (early, late), name in zip(_PAIRS, ANOMALIES):
        if early in names and late in names:
            broken = pc.fill_null(pc.less(batch.column(late), batch.column(early)), False)
            _mark(code, _bools(broken) & ok, name)
    one_read = np.zeros(rows, bool)
    if "chunk_ns" in names and rows:
        _check_chunks(batch, ok, code, one_read)
    if "protocol_anomaly" in names and rows and batch.column("protocol_anomaly").null_count < rows:
        protocol = batch.column("protocol_anomaly")
        for name in ("count_backwards", "event_after_end"):
            _mark(code, _bools(pc.fill_null(pc.equal(protocol, name), False)) & ok, name)
    code[~ok] = 0
    return RecordChecks(code, one_read & ok)


def _bools(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=bool)


def _mark(code: np.ndarray, broken: np.ndarray, name: str) -> None:
    """Name rows that break ``name`` unless an earlier rule named them already."""
    code[broken & (code == 0)] = _CODE[name]


def _stamps(batch: pa.Table | pa.RecordBatch, column: str) -> np.ndarray:
    """A scalar stamp column as int64 with nulls as int64 min (never compared true below)."""
    arr = batch.column(column)
    return np.asarray(pc.fill_null(arr, np.iinfo(np.int64).min).to_numpy(zero_copy_only=False), np.int64)


def _check_chunks(batch: pa.Table | pa.RecordBatch, ok: np.ndarray, code: np.ndarray, one_read: np.ndarray) -> None:
    ts_arr = batch.column("chunk_ns")
    if isinstance(ts_arr, pa.ChunkedArray):
        ts_arr = ts_arr.combine_chunks()
    offsets = ts_arr.offsets.to_numpy().astype(np.int64)
    offsets -= offsets[0]
    ts = np.asarray(ts_arr.flatten().to_numpy(zero_copy_only=False), np.int64)
    lengths = np.diff(offsets)
    has = lengths > 0
    if not has.any():
        return
    names = batch.schema.names
    first, last = ts[offsets[:-1][has]], ts[offsets[1:][has] - 1]
    rows_with = np.flatnonzero(has)
    if "first_byte_ns" in names:
        fb = _stamps(batch, "first_byte_ns")[rows_with]
        bad = np.zeros(len(code), bool)
        bad[rows_with] = first < fb
        _mark(code, bad & ok, "token_before_first_byte")
    if "end_ns" in names:
        end = _stamps(batch, "end_ns")[rows_with]
        bad = np.zeros(len(code), bool)
        bad[rows_with] = (end != np.iinfo(np.int64).min) & (last > end)
        _mark(code, bad & ok, "end_before_last_chunk")
    if len(ts) > 1:
        back = np.flatnonzero(np.diff(ts) < 0) + 1  # element that is earlier than the one before it
        if len(back):
            row = np.searchsorted(offsets, back, side="right") - 1
            inside = back > offsets[row]  # not the first element of its row
            bad = np.zeros(len(code), bool)
            bad[row[inside]] = True
            _mark(code, bad & ok, "negative_gap")
    if "chunk_tokens" in names:
        tk_arr = batch.column("chunk_tokens")
        if isinstance(tk_arr, pa.ChunkedArray):
            tk_arr = tk_arr.combine_chunks()
        tk = np.asarray(tk_arr.flatten().to_numpy(zero_copy_only=False))
        if len(tk) == len(ts):
            one_read[:] = _one_read(ts, tk, offsets)


def _one_read(ts: np.ndarray, tk: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per row: ≥ 2 tokens, and every token-carrying chunk shares one stamp (one read)."""
    rows = len(offsets) - 1
    out = np.zeros(rows, bool)
    carrying = tk > 0
    if not carrying.any():
        return out
    row = np.repeat(np.arange(rows), np.diff(offsets))[carrying]
    t = ts[carrying]
    tokens = np.bincount(row, weights=tk[carrying], minlength=rows)
    starts = np.r_[0, np.flatnonzero(row[1:] != row[:-1]) + 1]
    lo = np.minimum.reduceat(t, starts)
    hi = np.maximum.reduceat(t, starts)
    same = np.zeros(rows, bool)
    same[row[starts]] = lo == hi
    out[:] = same & (tokens >= 2)
    return out


def anomaly_counts(codes: np.ndarray) -> dict[str, int]:
    """{anomaly name: rows} for the codes present."""
    counts = np.bincount(np.asarray(codes, np.int64), minlength=len(ANOMALIES) + 1)
    return {name: int(counts[i + 1]) for i, name in enumerate(ANOMALIES) if counts[i + 1]}


#: A run whose successful multi-token responses came in one read more often than this share
#: has no measurable ITL or TPOT (their gaps are the client's, not the engine's).
ONE_READ_SHARE_MAX = 0.5


def timing_measurable(one_read: int, multi_token: int) -> bool:
    """Are ITL / TPOT measurable, given how many of ``multi_token`` successful responses
    (≥ 2 output tokens) arrived in one read?"""
    return multi_token == 0 or one_read <= ONE_READ_SHARE_MAX * multi_token
