"""The numbers a sweep keeps for one load run (``point_metrics``: a ``points.parquet`` row).

Two quantities, named differently on purpose (docs/metrics.md, docs/sweeps.md):

* **SLO attainment** of one run: the fraction of its measured requests that completed and met
  every SLO bound. Here *every* measured request counts: a failed request, or one cancelled
  because it was still running at the drain deadline, is a miss (cancelled requests are
  the slowest ones; leaving them out would flatter an overloaded configuration).
* **Single-run goodput** (vLLM ``--goodput`` style): requests meeting every SLO per second of
  that run's window.

Capacity (DistServe's goodput) is the capacity search's (analysis/capacity.py); saturation
and the client-trust checks are analysis/capacity_saturation.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from bench_llm.analysis.capacity_client import client_limited
from bench_llm.analysis.capacity_saturation import admission_rejections, nanmedian, span_rate, untrustworthy
from bench_llm.analysis.capacity_steady import (
    design_effect,
    long_enough,
    long_lifetime_s,
    requests_needed,
    server_series,
    stationarity,
)
from bench_llm.analysis.client_health import client_health
from bench_llm.analysis.confidence import wilson_interval
from bench_llm.analysis.failures import error_line, top_errors
from bench_llm.analysis.invariants import check_records, timing_measurable
from bench_llm.analysis.jobs import judged_by_jobs
from bench_llm.analysis.load import Run
from bench_llm.analysis.metrics import measured, request_metrics
from bench_llm.analysis.server_signals import ServerSignals
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.slo_judge import slo_outcomes
from bench_llm.analysis.summary import approximate_prompts, prompt_length_accounting
from bench_llm.analysis.totals import judged_mask, run_totals


def _top_error(failed: pd.DataFrame) -> str | None:
    """The most frequent error of a load's failed requests, as one line (cancellations at
    the end of the load are not errors)."""
    failed = failed[failed["error_type"].ne("cancelled")]
    if failed.empty:
        return None
    messages = failed["error_message"] if "error_message" in failed else [None] * len(failed)
    return error_line(top_errors(failed["error_type"], messages, limit=1))


_NAN = float("nan")


@dataclass(frozen=True, slots=True)
class PointMetrics:
    """The numbers a sweep keeps for one load run (``point_metrics``): flat, NaN where not
    measurable. ``as_row()`` is its ``points.parquet`` row (the configuration columns are
    the sweep's); the field order is the column order."""

    requests: int
    ok: int
    failed: int  # failed or cancelled at the drain deadline
    cancelled: int
    anomalies: int
    window_s: float
    offered_rps: float
    measured_offered_rps: float
    admitted_rps: float
    throughput_rps: float
    output_tokens_per_s: float
    max_in_flight: int
    rejected_at_admission: int
    top_error: str | None
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p90_ms: float
    tpot_p99_ms: float
    e2e_p50_ms: float
    e2e_p90_ms: float
    e2e_p99_ms: float
    ttft_from_intended_p50_ms: float
    ttft_from_intended_p90_ms: float
    ttft_from_intended_p99_ms: float
    input_tokens_mean: float
    output_tokens_mean: float
    one_read_share: float
    met: float
    attainment: float
    attainment_low: float
    attainment_high: float
    #: variance inflation of the attainment from correlation over time (batch means,
    #: analysis/capacity_steady.py): the interval and the verdict count requests / deff
    attainment_deff: float
    goodput_rps: float
    #: per SLO bound (``ttft_ms`` …): share of judged requests missing it; columns ``miss_share_<bound>``
    miss_share: dict[str, float]
    under_sampled: str | None
    client_saturated: bool
    untrustworthy: str | None
    #: why the client's saturation makes this run client-limited (analysis/capacity_client.py;
    #: also in ``untrustworthy``); None: it is not
    client_limited: str | None = None
    #: judged per job (a job bound in the SLO, analysis/jobs.py): the jobs judged; ``met`` counts jobs then
    jobs: float = _NAN
    server_queue_time_mean_ms: float = _NAN
    server_kv_cache_usage_max: float = _NAN
    server_preemptions: float = _NAN
    server_waiting_max: float = _NAN
    server_waiting_growth: float = _NAN
    #: the prompts sent against the lengths asked for (analysis.summary.prompt_length_accounting)
    prompt_ratio_p50: float = _NAN
    prompt_exact_share: float = _NAN
    prompt_approximate: str | None = None
    #: a run too short to stand for its rate: how many more requests a run needs
    #: (``capacity_steady.requests_needed``; 0: long enough, or ``under_sampled`` says otherwise)
    more_requests_needed: int = 0

    def as_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "miss_share":
                row.update({f"miss_share_{k}": v for k, v in value.items()})
            else:
                row[name] = value
        return row


def point_metrics(
    run: Run, slo: SLO, signals: ServerSignals | None = None, server: pa.Table | None = None
) -> PointMetrics:
    """The numbers a sweep keeps for one load run (``request_point_metrics``); with a job bound
    in the SLO, judged per job (``analysis.jobs.judged_by_jobs``)."""
    point = request_point_metrics(run, slo, signals, server)
    return judged_by_jobs(point, run.path, slo) if slo.job_limits else point


def request_point_metrics(
    run: Run, slo: SLO, signals: ServerSignals | None = None, server: pa.Table | None = None
) -> PointMetrics:
    """The numbers a sweep keeps for one load run (flat; NaN where not measurable).

    ``server``: the run's ``server_metrics`` table (its waiting queue and KV-cache use feed
    the steady-state test, analysis/capacity_steady.py). A rate load's ``under_sampled`` says
    why it cannot stand for its rate: sent for too few long-request lifetimes, or its state
    still grew (not stationary); its interval counts requests / ``attainment_deff``.

    Totals, attainment and goodput are ``analysis.totals.run_totals``'s; anomalous records
    (analysis/invariants.py) are counted and feed nothing else. ``untrustworthy`` says why
    the client could not measure this load truthfully (None: it could)."""
    table = measured(run.requests)
    df = request_metrics(table)
    checks = check_records(table)
    df["anomaly"] = checks.anomaly
    keep = judged_mask(df)
    ok = df["ok"].to_numpy(dtype=bool) & keep
    met = slo_outcomes(df, slo)["met"] if slo and len(df) else None
    totals = run_totals(df, met)
    kept = df[keep]  # (one filtered copy, read by every figure below)
    intended = kept["intended_send_ns"].to_numpy(dtype=float)
    offered = (run.meta.get("workload") or {}).get("rate")
    okdf = df[ok]
    latency = _latency_percentiles(okdf)
    prompt = okdf["prompt_tokens"].astype("float64").fillna(okdf["input_tokens_target"].astype("float64"))
    multi = int((okdf["output_tokens"].to_numpy() >= 2).sum())
    one_read = int(checks.one_read[ok].sum())
    if not timing_measurable(one_read, multi):  # not the engine's gaps: no TPOT figure
        latency.update({f"tpot_p{q}_ms": _NAN for q in (50, 90, 99)})
    attainment = (_NAN, _NAN, _NAN)
    goodput = _NAN
    deff = _NAN
    miss_share: dict[str, float] = {}
    life_s = long_lifetime_s(okdf["e2e_ms"].to_numpy(dtype=float))
    met_kept = None
    if met is not None and totals.judged:
        res = slo_outcomes(kept, slo)
        met_kept = res["met"]
        deff = design_effect(intended, met_kept, life_s) if offered else 1.0
        attainment = (totals.attainment, *wilson_interval(float(totals.met or 0) / deff, totals.judged / deff))
        goodput = totals.goodput_rps
        miss_share = {key: float(res[f"miss_{key}"].mean()) for key, _ in slo.request_limits}
    send_span = (np.nanmax(intended) - np.nanmin(intended)) / 1e9 if len(intended) else _NAN
    short = None
    more = 0
    if offered:
        more = requests_needed(float(send_span), life_s, len(kept))
        short = long_enough(float(send_span), life_s, len(kept)) or stationarity(
            intended,
            kept["send_ns"].to_numpy(dtype=float),
            kept["end_ns"].to_numpy(dtype=float),
            met_kept,
            life_s,
            server_series(server),
        )
    health = client_health(kept, run.monitor)
    measured_offered = span_rate(intended)
    lag_p50 = nanmedian(kept["schedule_lag_ms"].to_numpy(dtype=float))
    sig = signals or {}
    lengths = prompt_length_accounting(okdf)  # the prompts sent against the lengths asked for
    return PointMetrics(
        requests=totals.judged,
        ok=totals.ok,
        failed=totals.failed + totals.cancelled,
        cancelled=totals.cancelled,
        anomalies=totals.anomalies,
        window_s=totals.window_s,
        offered_rps=float(offered) if offered else _NAN,
        measured_offered_rps=measured_offered,
        admitted_rps=span_rate(kept["first_token_ns"].to_numpy(dtype=float)),
        throughput_rps=totals.requests_per_s,
        output_tokens_per_s=totals.output_tokens_per_s,
        max_in_flight=_max_in_flight(kept),
        rejected_at_admission=admission_rejections(kept),
        top_error=_top_error(df[keep & ~ok]) if (keep & ~ok).any() else None,
        **latency,
        input_tokens_mean=float(prompt.mean()) if len(okdf) else _NAN,
        output_tokens_mean=float(okdf["output_tokens"].mean()) if len(okdf) else _NAN,
        one_read_share=one_read / multi if multi else _NAN,
        met=float(totals.met) if totals.met is not None else _NAN,
        attainment=attainment[0],
        attainment_low=attainment[1],
        attainment_high=attainment[2],
        attainment_deff=deff,
        goodput_rps=goodput,
        miss_share=miss_share,
        under_sampled=short,
        client_saturated=health.saturated,
        untrustworthy=_either(
            untrustworthy(totals.anomalies, totals.measured, health, slo, measured_offered, lag_p50, run.meta.get("clock")),
            client_limited(health),
        ),
        client_limited=client_limited(health),
        **{f"server_{key}": float(sig.get(key, _NAN)) for key in _SERVER_SIGNALS},
        prompt_ratio_p50=lengths.ratio_p50,
        prompt_exact_share=lengths.exact_share,
        prompt_approximate=approximate_prompts(lengths, words=_word_prompts(okdf)),
        more_requests_needed=more,
    )


def _either(*why: str | None) -> str | None:
    """The reasons given, joined (None: none)."""
    return "; ".join(dict.fromkeys(w for w in why if w)) or None


def _word_prompts(okdf: pd.DataFrame) -> bool:
    """Every successful request's prompt was a word approximation (``input_tokens_source``)."""
    return bool(len(okdf)) and "input_tokens_source" in okdf and bool(okdf["input_tokens_source"].eq("approx").all())


#: The server signals a point keeps (``server_signals``), as ``server_<name>`` columns.
_SERVER_SIGNALS = ("queue_time_mean_ms", "kv_cache_usage_max", "preemptions", "waiting_max", "waiting_growth")


def _latency_percentiles(okdf: pd.DataFrame) -> dict[str, float]:
    """``<metric>_p<q>_ms`` of the successful requests (TTFT, TPOT, E2E, TTFT from intended send)."""
    out: dict[str, float] = {}
    for name in ("ttft_ms", "tpot_ms", "e2e_ms", "ttft_from_intended_ms"):
        vals = okdf[name].to_numpy(dtype=float)
        v = vals[~np.isnan(vals)]
        # (one call for the three: each percentile is computed as its own call computes it)
        qs = [float(x) for x in np.percentile(v, (50, 90, 99))] if len(v) else [float("nan")] * 3
        for q, x in zip((50, 90, 99), qs):
            out[f"{name[:-3]}_p{q}_ms"] = x
    return out


def _max_in_flight(df: pd.DataFrame) -> int:
    s = df["send_ns"].to_numpy(dtype=float)
    e = df["end_ns"].to_numpy(dtype=float)
    keep = np.isfinite(s) & np.isfinite(e)
    return max_in_flight(s[keep], e[keep])


def max_in_flight(starts: np.ndarray, ends: np.ndarray) -> int:
    """Most intervals [start, end) open at once: an end at the same instant as a start
    comes first (the request that ended freed its slot for the one sent then)."""
    if not len(starts):
        return 0
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([np.ones(len(starts), np.int64), -np.ones(len(ends), np.int64)])
    order = np.lexsort((deltas, times))
    return max(0, int(np.cumsum(deltas[order]).max()))

