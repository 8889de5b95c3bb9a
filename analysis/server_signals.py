"""A load's server-side signals (optional): queue time, KV-cache usage, preemptions and the
waiting queue's growth, from the run's scraped /metrics (the points' ``server_*`` columns)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa

#: A load's server signals by name (``queue_time_mean_ms``, ``kv_cache_usage_max``,
#: ``preemptions``, ``waiting_max``, ``waiting_growth``): only those the scrape had.
ServerSignals = Mapping[str, float]


def server_signals(table: pa.Table | None) -> dict[str, float]:
    """Queue time, KV-cache usage, preemptions and queue growth from scraped /metrics.

    Reads bench's common names (``common`` column, adapters/metrics_map.py): ``waiting``,
    ``kv_cache_usage``, ``preemptions``, ``queue_seconds`` (histogram). Returns only what
    is present, so a run without server metrics degrades to the client's view.
    """
    if table is None or table.num_rows == 0 or "common" not in table.column_names:
        return {}
    plain = _plain_server_signals(table)
    if plain is not None:
        return plain
    return _frame_server_signals(table)


def _frame_server_signals(table: pa.Table) -> dict[str, float]:
    """``server_signals`` in pandas: any table (missing columns, null labels or types)."""
    cols = [c for c in ("ts_ns", "metric", "common", "type", "labels", "le", "value") if c in table.column_names]
    df = table.select(cols).to_pandas()
    df = df[df["common"].notna()]
    if "type" not in df:
        df["type"] = None
    out: dict[str, float] = {}

    def series(*names: str) -> pd.DataFrame:
        rows = df[df["common"].isin(names)]
        if "le" in rows:
            rows = rows[rows["le"].isna()]
        return rows

    kv = series("kv_cache_usage")
    if len(kv):
        v = kv["value"].astype(float)
        out["kv_cache_usage_max"] = float(v.max() / 100.0 if v.max() > 1.5 else v.max())
    pre = series("preemptions", "num_preemptions")
    if len(pre):
        out["preemptions"] = float(_counter_increase(pre))
    wait = series("waiting", "num_requests_waiting")
    if len(wait):
        w = wait.groupby("ts_ns")["value"].sum().sort_index().to_numpy(dtype=float)
        out["waiting_max"] = float(w.max())
        third = max(1, len(w) // 3)
        if len(w) >= 6:
            out["waiting_growth"] = float(np.mean(w[-third:]) - np.mean(w[:third]))
    q = series("queue_seconds", "queue_time_seconds")
    if len(q):
        metric = q["metric"].astype(str)
        qs = q[(q["type"] == "histogram_sum") | metric.str.endswith("_sum")]
        qc = q[(q["type"] == "histogram_count") | metric.str.endswith("_count")]
        s, c = _counter_increase(qs), _counter_increase(qc)
        if c > 0:
            out["queue_time_mean_ms"] = float(1000.0 * s / c)
    return out


#: The ``common`` names ``server_signals`` reads.
_SIGNAL_NAMES = (("kv_cache_usage",), ("preemptions", "num_preemptions"), ("waiting", "num_requests_waiting"),
                 ("queue_seconds", "queue_time_seconds"))  # fmt: skip


def _plain_server_signals(table: pa.Table) -> dict[str, float] | None:
    """``_frame_server_signals``'s figures, bit for bit, in numpy (a sweep reads one table per
    load, and pandas costs ~20 ms on a few hundred rows), for the common table: every column
    there, labels, metric and type set on the rows read, and one ``waiting`` value per
    scrape time. None for any other table (the pandas path then applies)."""
    import pyarrow.compute as pc

    names = ("ts_ns", "metric", "common", "type", "labels", "le", "value")
    if any(c not in table.column_names for c in names):
        return None
    read = pc.and_(pc.is_in(table["common"], value_set=pa.array([n for g in _SIGNAL_NAMES for n in g])),
                   pc.is_null(table["le"]))  # fmt: skip
    rows = table.select(names).filter(read)
    if any(rows[c].null_count for c in ("ts_ns", "metric", "common", "type", "labels")):
        return None
    common = np.asarray(rows["common"].to_pylist(), dtype=object)
    ts = rows["ts_ns"].to_numpy()
    value = rows["value"].to_numpy(zero_copy_only=False).astype(float)
    labels = np.asarray(rows["labels"].to_pylist(), dtype=object)
    kv, pre, wait, queue = (np.isin(common, np.asarray(g, dtype=object)) for g in _SIGNAL_NAMES)
    if wait.any() and len(np.unique(ts[wait])) != int(wait.sum()):
        return None  # several waiting gauges per scrape: pandas sums them (compensated)
    out: dict[str, float] = {}
    if kv.any():
        v = value[kv]
        v = v[~np.isnan(v)]
        top = v.max() if len(v) else np.nan  # pandas' max skips NaN
        out["kv_cache_usage_max"] = float(top / 100.0 if top > 1.5 else top)
    if pre.any():
        out["preemptions"] = float(_plain_counter_increase(ts[pre], value[pre], labels[pre]))
    if wait.any():
        order = np.argsort(ts[wait])
        v = value[wait][order]
        w = np.where(np.isnan(v), 0.0, 0.0 + v)  # a group's sum of one value (NaN skipped: 0.0)
        out["waiting_max"] = float(w.max())
        third = max(1, len(w) // 3)
        if len(w) >= 6:
            out["waiting_growth"] = float(np.mean(w[-third:]) - np.mean(w[:third]))
    if queue.any():
        metric = np.asarray(rows["metric"].to_pylist(), dtype=object)[queue]
        kind = np.asarray(rows["type"].to_pylist(), dtype=object)[queue]
        is_sum = np.array([k == "histogram_sum" or m.endswith("_sum") for k, m in zip(kind, metric)], dtype=bool)
        is_count = np.array([k == "histogram_count" or m.endswith("_count") for k, m in zip(kind, metric)], dtype=bool)
        qt, qv, ql = ts[queue], value[queue], labels[queue]
        s = _plain_counter_increase(qt[is_sum], qv[is_sum], ql[is_sum])
        c = _plain_counter_increase(qt[is_count], qv[is_count], ql[is_count])
        if c > 0:
            out["queue_time_mean_ms"] = float(1000.0 * s / c)
    return out


def _plain_counter_increase(ts: np.ndarray, value: np.ndarray, labels: np.ndarray) -> float:
    """``_counter_increase`` on arrays (labels all set): label sets in sorted order, each
    ordered by time as pandas' ``sort_values`` orders it (numpy quicksort), last minus first."""
    total = 0.0
    for label in sorted(set(labels.tolist())):
        idx = np.flatnonzero(labels == label)
        v = value[idx][np.argsort(ts[idx], kind="quicksort")]
        total += float(max(v[-1] - v[0], 0.0)) if len(v) > 1 else 0.0
    return total


def _counter_increase(rows: pd.DataFrame) -> float:
    """Increase of a cumulative counter over the run, summed over label sets."""
    if rows.empty:
        return 0.0
    total = 0.0
    key = "labels" if "labels" in rows else None
    groups = rows.groupby(key, dropna=False) if key else [(None, rows)]
    for _, g in groups:
        v = g.sort_values("ts_ns")["value"].astype(float).to_numpy()
        total += float(max(v[-1] - v[0], 0.0)) if len(v) > 1 else 0.0
    return total

