"""Was the client itself the bottleneck? ``client_health`` judges a run's client from its send
lag (per request) and its worker processes' monitor samples (event-loop lag, CPU, silences),
overall and per time window (docs/instrument.md). The run summary (``analysis.summary``) carries it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from bench_llm.analysis.summary_types import ClientHealth, ClientWindow

#: The client is judged a bottleneck when its own send lag or event-loop lag passes these.
CLIENT_LAG_P99_MS = 5.0
LOOP_LAG_MAX_MS = 20.0
#: ... or when a client process is busy for this fraction of one core.
CLIENT_CPU_BUSY = 0.9
#: ... or when a client process wrote no monitor sample for this long (seconds, and ten of its
#: usual sample intervals): its event loop did not run (starved of CPU), so the windows the
#: silence spans cannot be judged on its samples.
CLIENT_SILENT_S = 1.0


def client_health(df: pd.DataFrame, monitor: pa.Table | None) -> ClientHealth:
    """Was the client itself the bottleneck? Overall figures, then per time window.

    Signals (docs/instrument.md): schedule lag (send minus intended send, per request),
    event-loop lag and process CPU (client_monitor samples, per worker process), and
    sent versus offered requests. A window is flagged "client saturated" when its send
    lag p99 passes CLIENT_LAG_P99_MS, its event-loop lag passes LOOP_LAG_MAX_MS, or a
    client process was busy for CLIENT_CPU_BUSY of a core or more.
    """
    lag = df["schedule_lag_ms"].to_numpy(dtype=float)
    lag_ok = ~np.isnan(lag)
    lag_p99 = float(np.percentile(lag[lag_ok], 99)) if lag_ok.any() else float("nan")
    warnings = []
    if lag_ok.any() and lag_p99 > CLIENT_LAG_P99_MS:
        warnings.append(f"client saturated: send lag p99 {lag_p99:.1f} ms > {CLIENT_LAG_P99_MS:g} ms")
    loop_p99 = loop_max = None
    loop_ms = np.empty(0)
    mon_ts = np.empty(0)
    cpu = np.empty(0)
    workers = np.empty(0, dtype=np.int64)
    if monitor is not None and monitor.num_rows:
        loop_ms = monitor["loop_lag_ns"].to_numpy(zero_copy_only=False).astype(float) / 1e6
        mon_ts = monitor["ts_ns"].to_numpy(zero_copy_only=False).astype(np.int64)
        cpu = monitor["cpu_s"].to_numpy(zero_copy_only=False).astype(float)
        workers = monitor["worker_id"].to_numpy(zero_copy_only=False).astype(np.int64)
        if np.isfinite(loop_ms).any():
            loop_p99 = float(np.nanpercentile(loop_ms, 99))
            loop_max = float(np.nanmax(loop_ms))
            if loop_p99 > LOOP_LAG_MAX_MS:
                warnings.append(f"client saturated: event-loop lag p99 {loop_p99:.1f} ms")
    windows = _client_windows(df, lag, mon_ts, loop_ms, cpu, workers)
    busy = [w.cpu_busy for w in windows if w.cpu_busy == w.cpu_busy]
    if busy and max(busy) >= CLIENT_CPU_BUSY:
        warnings.append(f"client saturated: a client process used {100 * max(busy):.0f}% of a core")
    intended = df["intended_send_ns"].to_numpy(dtype=float)
    silent = _silent_spans(mon_ts, workers, float(np.nanmin(intended)) if np.isfinite(intended).any() else 0.0)
    for w, start_s, length_s in silent:
        warnings.append(f"client saturated: worker {w} silent for {length_s:.1f} s from {start_s:g} s "
                        "(no monitor sample: its event loop did not run)")
    flagged = [w for w in windows if w.saturated]
    if flagged:
        spans = ", ".join(f"{w.start_s:g}-{w.end_s:g} s" for w in flagged[:6]) + (", ..." if len(flagged) > 6 else "")
        warnings.append(f"client saturated in {len(flagged)} of {len(windows)} windows ({spans}): timings there include client delay")
    return ClientHealth(
        schedule_lag_p99_ms=lag_p99,
        loop_lag_p99_ms=loop_p99,
        loop_lag_max_ms=loop_max,
        windows=windows,
        cpu_busy_max=max(busy) if busy else float("nan"),
        saturated_windows=len(flagged),
        silent_workers=sorted({w for w, _, _ in silent}),
        warnings=warnings,
        saturated=bool(warnings),
    )


def _silent_spans(mon_ts: np.ndarray, workers: np.ndarray, t0: float) -> list[tuple[int, float, float]]:
    """(worker, start s from ``t0``, length s) of every gap of at least CLIENT_SILENT_S
    (and ten of the worker's usual sample intervals) between two monitor samples of one
    worker process that ends after ``t0`` (the measured period; a worker's closing sample
    ends its last gap)."""
    out = []
    for w in np.unique(workers):
        ts = np.sort(mon_ts[workers == w]).astype(np.float64)
        gaps = np.diff(ts)
        if not len(gaps):
            continue
        # the cadence is the run's setting (every s seconds: silent after 10 s), read from
        # the shorter gaps: a starved worker's are mostly long, its short ones still show it
        limit = max(CLIENT_SILENT_S * 1e9, 10 * float(np.percentile(gaps, 10)))
        for k in np.nonzero((gaps >= limit) & (ts[1:] > t0))[0]:
            out.append((int(w), round((ts[k] - t0) / 1e9, 3), float(gaps[k] / 1e9)))
    return out


def _client_windows(
    df: pd.DataFrame, lag: np.ndarray, mon_ts: np.ndarray, loop_ms: np.ndarray, cpu: np.ndarray, workers: np.ndarray
) -> list[ClientWindow]:
    """Per-window client signals over the measured period (windows of 1-10 s)."""
    intended = df["intended_send_ns"].to_numpy(dtype=float)
    send = df["send_ns"].to_numpy(dtype=float)
    if not len(intended) or not np.isfinite(intended).any():
        return []
    t0 = float(np.nanmin(intended))
    ends = df["end_ns"].to_numpy(dtype=float)
    t1 = float(np.nanmax(np.concatenate([ends[np.isfinite(ends)], intended[np.isfinite(intended)]])))
    span_s = max((t1 - t0) / 1e9, 1e-3)
    width_s = min(10.0, max(1.0, span_s / 10))
    n = max(1, int(np.ceil(span_s / width_s)))
    width = width_s * 1e9
    w_int = np.clip(((intended - t0) // width), 0, n - 1)
    w_send = np.where(np.isfinite(send), np.clip((send - t0) // width, 0, n - 1), -1)
    offered = np.bincount(w_int[np.isfinite(w_int)].astype(np.int64), minlength=n)
    sent = np.bincount(w_send[w_send >= 0].astype(np.int64), minlength=n)
    out: list[ClientWindow] = []
    # each window's send lags, from one sort (not a scan of every request per window)
    finite_lag = np.isfinite(lag)
    lag_w = w_int[finite_lag].astype(np.int64)
    order = np.argsort(lag_w, kind="stable")
    lag_sorted = lag[finite_lag][order]
    lag_bounds = np.searchsorted(lag_w[order], np.arange(n + 1))
    per_worker = [(mon_ts[workers == w], cpu[workers == w]) for w in np.unique(workers)]
    silent = _silent_spans(mon_ts, workers, t0)
    for i in range(n):
        lo, hi = t0 + i * width, t0 + (i + 1) * width
        lags = lag_sorted[lag_bounds[i] : lag_bounds[i + 1]]
        lag_p99 = float(np.percentile(lags, 99)) if len(lags) else float("nan")
        in_win = (mon_ts >= lo) & (mon_ts < hi)
        loop_max = float(np.nanmax(loop_ms[in_win])) if in_win.any() and np.isfinite(loop_ms[in_win]).any() else float("nan")
        busy = float("nan")
        for ts_w, cpu_w in per_worker:
            # CPU over the window from this worker's samples bracketing it
            k = np.nonzero((ts_w >= lo) & (ts_w < hi))[0]
            if len(k) == 0:
                continue
            a = k[0] - 1 if k[0] > 0 else k[0]
            b = k[-1]
            if b > a and ts_w[b] > ts_w[a]:
                frac = float((cpu_w[b] - cpu_w[a]) / ((ts_w[b] - ts_w[a]) / 1e9))
                busy = frac if busy != busy else max(busy, frac)
        why = []
        if lag_p99 > CLIENT_LAG_P99_MS:
            why.append(f"send lag p99 {lag_p99:.1f} ms")
        if loop_max > LOOP_LAG_MAX_MS:
            why.append(f"event-loop lag {loop_max:.0f} ms")
        if busy >= CLIENT_CPU_BUSY:
            why.append(f"client CPU {100 * busy:.0f}% of a core")
        for w, start_s, length_s in silent:  # a worker without a sample here is itself a finding
            if start_s * 1e9 + t0 < hi and (start_s + length_s) * 1e9 + t0 > lo:
                why.append(f"worker {w} silent for {length_s:.1f} s")
        out.append(
            ClientWindow(
                start_s=round(i * width_s, 3),
                end_s=round((i + 1) * width_s, 3),
                offered=int(offered[i]),
                sent=int(sent[i]),
                send_lag_p99_ms=lag_p99,
                loop_lag_max_ms=loop_max,
                cpu_busy=busy,
                saturated=bool(why),
                why=why,
            )
        )
    return out
