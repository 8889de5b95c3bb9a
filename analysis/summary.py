"""The run summary: counts, latency percentiles, throughput, goodput, client health."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from analysis.metrics import chunk_gap_ms, itl_ms, measured, percentiles, request_metrics
from analysis.slo import SLO, SLO_METRICS

DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99)
LATENCY_METRICS = ("ttft_ms", "ttfo_ms", "tpot_ms", "itl_ms", "chunk_gap_ms", "e2e_ms", "schedule_lag_ms")

#: The client is judged a bottleneck when its own send lag or event-loop lag passes these.
CLIENT_LAG_P99_MS = 5.0
LOOP_LAG_MAX_MS = 20.0


@dataclass(frozen=True, slots=True)
class SummaryOptions:
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    slo: SLO = SLO()


def slo_mask(df: pd.DataFrame, slo: SLO) -> np.ndarray:
    """True for requests that completed and met every SLO bound.

    A request with fewer than two output tokens has no TPOT and is not judged on it.
    """
    ok = df["ok"].to_numpy(dtype=bool)
    mask = ok.copy()
    for key, limit in slo.limits:
        col = df[SLO_METRICS[key]].to_numpy(dtype=float)
        mask &= np.where(np.isnan(col), key in ("tpot_ms", "itl_max_ms"), col <= limit)
    return mask & ok


def summarize(table: pa.Table, options: SummaryOptions = SummaryOptions(), monitor: pa.Table | None = None) -> dict[str, Any]:
    """Summary of the measured (non-warm-up) requests of ``table``."""
    all_rows = table.num_rows
    table = measured(table)
    df = request_metrics(table)
    ps = options.percentiles
    cancelled = df["error_type"].eq("cancelled").to_numpy()
    counted = df[~cancelled]
    ok_mask = counted["ok"].to_numpy(dtype=bool)
    ok_df = counted[ok_mask]
    n = len(counted)
    errors = counted.loc[~ok_mask, "error_type"].value_counts().to_dict()

    starts = df["intended_send_ns"].to_numpy(dtype=float)
    ends = df["end_ns"].to_numpy(dtype=float)
    window_s = float((np.nanmax(ends) - np.nanmin(starts)) / 1e9) if len(df) and np.isfinite(ends).any() else 0.0
    out_tokens = float(ok_df["output_tokens"].sum())
    prompt = ok_df["prompt_tokens"].astype("float64").fillna(ok_df["input_tokens_target"].astype("float64"))
    in_tokens = float(prompt.sum())

    ok_table = table.filter(pa.array(df["ok"].to_numpy(dtype=bool)))
    latency: dict[str, dict[str, float]] = {}
    for name in ("ttft_ms", "ttfo_ms", "tpot_ms", "e2e_ms", "schedule_lag_ms", "ttft_from_intended_ms", "max_itl_ms"):
        latency[name] = percentiles(ok_df[name].to_numpy(dtype=float), ps)
    latency["itl_ms"] = percentiles(itl_ms(ok_table), ps)
    latency["chunk_gap_ms"] = percentiles(chunk_gap_ms(ok_table), ps)

    summary: dict[str, Any] = {
        "requests": {
            "rows": all_rows,
            "warmup_excluded": all_rows - table.num_rows,
            "measured": n,
            "ok": int(ok_mask.sum()),
            "failed": int(n - ok_mask.sum()),
            "cancelled_at_end": int(cancelled.sum()),
            "error_rate": float((n - ok_mask.sum()) / n) if n else 0.0,
            "errors": {str(k): int(v) for k, v in errors.items()},
        },
        "window_s": window_s,
        "throughput": {
            "requests_per_s": float(len(ok_df) / window_s) if window_s > 0 else 0.0,
            "output_tokens_per_s": out_tokens / window_s if window_s > 0 else 0.0,
            "total_tokens_per_s": (out_tokens + in_tokens) / window_s if window_s > 0 else 0.0,
        },
        "latency": latency,
        "tokens": _token_accounting(ok_df),
        "percentiles": list(ps),
    }
    if options.slo:
        meets = slo_mask(counted, options.slo)
        summary["slo"] = {
            "objectives": options.slo.as_dict(),
            "met": int(meets.sum()),
            "attainment": float(meets.sum() / n) if n else 0.0,
            "goodput_rps": float(meets.sum() / window_s) if window_s > 0 else 0.0,
        }
    summary["client"] = _client_health(df, monitor)
    summary["smoothness"] = _smoothness(ok_table, options.slo)
    return summary


def _smoothness(ok_table: pa.Table, slo: SLO) -> dict[str, Any]:
    """Fluidity and longest gap per request (analysis/smoothness.py, docs/metrics.md)."""
    from analysis.smoothness import Deadlines, smoothness_metrics

    deadlines = Deadlines.from_slo(slo.as_dict())
    sm = smoothness_metrics(ok_table, deadlines)
    return {
        "deadlines_ms": {"ttft": deadlines.ttft_ms, "token_interval": deadlines.token_interval_ms},
        "fluidity": percentiles(sm["fluidity"].to_numpy(dtype=float), (1, 5, 10, 50)),
        "longest_gap_ms": percentiles(sm["longest_gap_ms"].to_numpy(dtype=float), (50, 90, 95, 99)),
    }


def _token_accounting(ok_df: pd.DataFrame) -> dict[str, Any]:
    sources = ok_df["token_source"].value_counts().to_dict()
    comp = ok_df["completion_tokens"].astype("float64")
    has = ~comp.isna()
    mismatch = int((comp[has] != ok_df.loc[has, "output_tokens"].astype("float64")).sum())
    short = int((ok_df["output_tokens"] < ok_df["max_output_tokens"]).sum())
    return {
        "sources": {str(k): int(v) for k, v in sources.items()},
        "chunk_vs_server_mismatches": mismatch,
        "shorter_than_requested": short,
    }


def _client_health(df: pd.DataFrame, monitor: pa.Table | None) -> dict[str, Any]:
    lag = df["schedule_lag_ms"].to_numpy(dtype=float)
    lag = lag[~np.isnan(lag)]
    health: dict[str, Any] = {
        "schedule_lag_p99_ms": float(np.percentile(lag, 99)) if len(lag) else float("nan"),
    }
    warnings = []
    if len(lag) and health["schedule_lag_p99_ms"] > CLIENT_LAG_P99_MS:
        warnings.append(
            f"client saturated: send lag p99 {health['schedule_lag_p99_ms']:.1f} ms > {CLIENT_LAG_P99_MS:g} ms"
        )
    if monitor is not None and monitor.num_rows:
        loop = monitor["loop_lag_ns"].to_numpy(zero_copy_only=False).astype(float) / 1e6
        health["loop_lag_p99_ms"] = float(np.percentile(loop, 99))
        health["loop_lag_max_ms"] = float(loop.max())
        if health["loop_lag_p99_ms"] > LOOP_LAG_MAX_MS:
            warnings.append(f"client saturated: event-loop lag p99 {health['loop_lag_p99_ms']:.1f} ms")
    health["warnings"] = warnings
    return health
