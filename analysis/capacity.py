"""Capacity under SLOs, from the Parquet results alone.

Two quantities, named differently on purpose (docs/metrics.md, docs/sweeps.md):

* **SLO attainment** of one run: the fraction of its measured requests that completed and met
  every SLO bound. Here *every* measured request counts: a failed request, or one cancelled
  because it was still running at the drain deadline, is a miss (cancelled requests are
  the slowest ones; leaving them out would flatter an overloaded configuration).
* **Single-run goodput** (vLLM ``--goodput`` style): requests meeting every SLO per second of
  that run's window.
* **Capacity** (DistServe's goodput): the highest offered request rate at which attainment is
  at least the target (default 90 %) and the load is not saturated, found by bracketing and
  bisection to a stated relative precision. Reported per configuration and per GPU.

Saturation of one open-loop run: the rate at which requests got their first token fell
behind the offered rate, or the time from intended send to first token kept growing over
the run (queue building without bound), or the server's waiting queue grew.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from bench_llm.analysis.capacity_steady import (
    design_effect,
    long_enough,
    long_lifetime_s,
    server_series,
    stationarity,
)
from bench_llm.analysis.client_health import client_health
from bench_llm.analysis.confidence import (
    CONFIDENCE,
    Verdict,
    attainment_verdict,
    requests_to_pass,
    wilson_interval,
    z_value,
)
from bench_llm.analysis.failures import error_line, top_errors
from bench_llm.analysis.invariants import check_records, timing_measurable
from bench_llm.analysis.jobs import judged_by_jobs
from bench_llm.analysis.load import Run
from bench_llm.analysis.metrics import measured, request_metrics
from bench_llm.analysis.slo import SLO, SLO_METRICS
from bench_llm.analysis.summary import approximate_prompts, prompt_length_accounting
from bench_llm.analysis.summary_types import ClientHealth
from bench_llm.analysis.totals import judged_mask, run_totals
from bench_llm.core.rejections import ADMISSION_ERRORS as REJECTION_TYPES
from bench_llm.core.rejections import describe_rejections

#: Open loop: first tokens must keep up with at least this share of the offered rate.
ADMISSION_RATIO_MIN = 0.85
#: Queue growth: the late third's median TTFT-from-intended above this multiple of the early third's...
QUEUE_GROWTH_RATIO = 2.0
#: ...and above it by at least this many milliseconds (ignores noise on very fast TTFTs).
QUEUE_GROWTH_MIN_MS = 100.0
#: Share of measured requests failed or cancelled at the drain deadline that marks saturation.
FAILED_SHARE_MAX = 0.10
#: Fewest measured requests for the rate/trend tests to be meaningful.
MIN_REQUESTS_FOR_TESTS = 9
#: Error types of requests an engine refused to admit (core/rejections.py: TGI's "overloaded",
#: HTTP 429 and 503, SGLang's abort with status 503). Any of them saturates the load.
ADMISSION_ERRORS = tuple(REJECTION_TYPES)


# -- per-run metrics ---------------------------------------------------------------------


def slo_outcomes(df: pd.DataFrame, slo: SLO) -> dict[str, np.ndarray]:
    """Per request: ``met`` (completed and met every bound) and ``miss_<name>`` per bound.

    A request with fewer than two output tokens has no TPOT and is not judged on it; a
    request that did not complete misses everything it has no value for.
    """
    ok = df["ok"].to_numpy(dtype=bool)
    met = ok.copy()
    out: dict[str, np.ndarray] = {}
    for key, limit in slo.request_limits:
        col = df[SLO_METRICS[key]].to_numpy(dtype=float)
        no_value_ok = key in ("tpot_ms", "itl_max_ms")
        good = np.where(np.isnan(col), no_value_ok & ok, col <= limit)
        out[f"miss_{key}"] = ~good
        met &= good
    out["met"] = met
    return out


@dataclass(frozen=True)
class Saturation:
    saturated: bool
    reasons: tuple[str, ...] = ()
    #: not saturated, but what the timing tests saw cannot be judged on this run (too short,
    #: or every SLO met): why, and what a longer run needs ("undecided: N more requests needed")
    undecided: str | None = None

    def __str__(self) -> str:
        return "; ".join(self.reasons) if self.reasons else "not saturated"


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
    run: Run, slo: SLO, signals: dict[str, Any] | None = None, server: pa.Table | None = None
) -> PointMetrics:
    """The numbers a sweep keeps for one load run (``request_point_metrics``); with a job bound
    in the SLO, judged per job (``analysis.jobs.judged_by_jobs``)."""
    point = request_point_metrics(run, slo, signals, server)
    return judged_by_jobs(point, run.path, slo) if slo.job_limits else point


def request_point_metrics(
    run: Run, slo: SLO, signals: dict[str, Any] | None = None, server: pa.Table | None = None
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
    if offered:
        short = long_enough(float(send_span), life_s, len(kept)) or stationarity(
            intended,
            kept["send_ns"].to_numpy(dtype=float),
            kept["end_ns"].to_numpy(dtype=float),
            met_kept,
            life_s,
            server_series(server),
        )
    health = client_health(kept, run.monitor)
    measured_offered = _span_rate(intended)
    lag_p50 = _nanmedian(kept["schedule_lag_ms"].to_numpy(dtype=float))
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
        admitted_rps=_span_rate(kept["first_token_ns"].to_numpy(dtype=float)),
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
        untrustworthy=untrustworthy(
            totals.anomalies, totals.measured, health, slo, measured_offered, lag_p50, run.meta.get("clock")
        ),
        **{f"server_{key}": float(sig.get(key, _NAN)) for key in _SERVER_SIGNALS},
        prompt_ratio_p50=lengths.ratio_p50,
        prompt_exact_share=lengths.exact_share,
        prompt_approximate=approximate_prompts(lengths, words=_word_prompts(okdf)),
    )


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


#: A load with more than this share of anomalous records was not measured truthfully.
ANOMALY_SHARE_MAX = 0.01
#: A saturated client's own delay decides nothing while it stays under this share of the
#: tightest SLO bound a delay lands on directly (TTFT, TTFO, E2E, max ITL)...
CLIENT_LAG_SLO_SHARE = 0.1
#: ...and while its median send lag stays under this many mean inter-arrival times (a client
#: further behind its schedule offered a lighter load than the one named).
CLIENT_BEHIND_ARRIVALS = 1.0


def untrustworthy(
    anomalies: int,
    measured_rows: int,
    health: ClientHealth,
    slo: SLO = SLO(),
    offered_rps: float = math.nan,
    send_lag_p50_ms: float = math.nan,
    clock: str | None = None,
) -> str | None:
    """Why the client could not measure a load truthfully (None: it could).

    Records that break the invariants (more than ANOMALY_SHARE_MAX of them), or a saturated
    client (analysis.summary.client_health) whose delay matters here: it ran behind the
    schedule (``offered_rps``: its rate) for most of the load, or its lag is large against
    the SLO so that removing it could change the verdict — the send lag p99, and with the
    user clock (reads stamped when the client gets round to them) the event-loop lag p99
    too. A busy client whose lag is small against the bounds being judged still measures the
    verdict truthfully."""
    why = []
    if measured_rows and anomalies > ANOMALY_SHARE_MAX * measured_rows:
        why.append(f"{anomalies} of {measured_rows} records anomalous")
    if health.saturated:
        lag = _finite(health.schedule_lag_p99_ms)
        if clock == "user":
            lag = max(lag, _finite(health.loop_lag_p99_ms))
        bounds = [v for k, v in slo.limits if k in ("ttft_ms", "ttfo_ms", "e2e_ms", "itl_max_ms")]
        arrival_ms = 1000.0 / offered_rps if math.isfinite(offered_rps) and offered_rps > 0 else math.inf
        if _finite(send_lag_p50_ms) > CLIENT_BEHIND_ARRIVALS * arrival_ms:
            why.append(f"client saturated: half its sends {send_lag_p50_ms:.0f} ms or more behind the schedule")
        elif not bounds or lag >= CLIENT_LAG_SLO_SHARE * min(bounds):
            limit = f" against an SLO bound of {min(bounds):g} ms" if bounds else ""
            why.append(f"client saturated (its lag p99 {lag:.1f} ms{limit}): " + "; ".join(health.warnings))
    return "; ".join(why) or None


def _finite(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return 0.0
    return f if math.isfinite(f) else 0.0


def _nanmedian(v: np.ndarray) -> float:
    v = v[~np.isnan(v)]
    return float(np.median(v)) if len(v) else float("nan")


def _span_rate(ns: np.ndarray) -> float:
    v = np.sort(ns[np.isfinite(ns)])
    if len(v) < 2 or v[-1] <= v[0]:
        return float("nan")
    return float((len(v) - 1) / ((v[-1] - v[0]) / 1e9))


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


def admission_rejections(df: pd.DataFrame) -> int:
    """Requests the engine refused at admission (:data:`ADMISSION_ERRORS`)."""
    return int(df["error_type"].isin(ADMISSION_ERRORS).sum()) if len(df) else 0


def _admission_reason(df: pd.DataFrame) -> list[str]:
    """The hook counting admission rejections: one reason with their number, by type."""
    if not admission_rejections(df):
        return []
    counts = df.loc[df["error_type"].isin(ADMISSION_ERRORS), "error_type"].value_counts()
    return [describe_rejections({str(k): int(n) for k, n in counts.items()}, len(df))]


def admission_saturation(run: Run) -> Saturation:
    """A closed-loop run is saturated, whatever its latencies, when the engine refused requests."""
    reasons = _admission_reason(request_metrics(measured(run.requests)))
    return Saturation(bool(reasons), tuple(reasons))


def open_loop_saturation(run: Run, signals: dict[str, Any] | None = None, slo: SLO | None = None) -> Saturation:
    """Is this open-loop run past what the engine sustains? (See the module docstring.)

    The one saturation rule of a rate load. Each test judges the run against the workload's
    own lengths: completions are compared with when each request would end, at its own
    output length, on a server keeping up (the early requests' TTFT and TPOT). Two guards:
    a run whose every request met every SLO of ``slo`` is never saturated, and a run too
    short to judge (under ``LIFETIMES`` lifetimes of its long requests, E2E p90 at the
    pace of a server keeping up, not queue-inflated) is not either;
    for both, what the tests saw becomes ``undecided`` ("N more requests needed"), which a
    sweep measures again, longer. Requests refused at admission and failures saturate
    whatever the guards say."""
    df = request_metrics(measured(run.requests))
    n = len(df)
    if n == 0:
        return Saturation(False)
    hard: list[str] = _admission_reason(df)
    bad = (~df["ok"].to_numpy(dtype=bool)).sum()
    if bad / n > FAILED_SHARE_MAX:
        hard.append(f"{bad} of {n} requests failed or were still queued at the drain deadline")
    soft: list[str] = []  # what the load's timing says; subject to the guards
    intended = df["intended_send_ns"].to_numpy(dtype=float)
    ok = df["ok"].to_numpy(dtype=bool)
    send_span = (np.nanmax(intended) - np.nanmin(intended)) / 1e9 if n else float("nan")
    # the workload's long requests at the pace of a server keeping up (not queue-inflated)
    paced = _paced_lifetimes(df, intended, ok)
    life_s = long_lifetime_s(1000.0 * paced[ok]) if paced is not None else math.nan
    if n >= MIN_REQUESTS_FOR_TESTS:
        offered = _span_rate(intended)
        admitted = _span_rate(df["first_token_ns"].to_numpy(dtype=float))
        if math.isfinite(offered) and math.isfinite(admitted) and admitted < ADMISSION_RATIO_MIN * offered:
            soft.append(f"first tokens at {admitted:.2f} req/s behind the offered {offered:.2f} req/s")
        else:
            behind = _completions_behind(df, intended, ok, offered, paced)
            if behind:
                soft.append(behind)
        order = np.argsort(intended, kind="stable")
        lag = df["ttft_from_intended_ms"].to_numpy(dtype=float)[order]
        third = n // 3
        early, late = _nanmedian(lag[:third]), _nanmedian(lag[-third:])
        if (
            np.isfinite(early)
            and np.isfinite(late)
            and late > QUEUE_GROWTH_RATIO * early
            and late - early > QUEUE_GROWTH_MIN_MS
        ):
            soft.append(f"queueing grew: median TTFT {early:,.0f} ms early in the run, {late:,.0f} ms late")
    growth = (signals or {}).get("waiting_growth")
    if growth is not None and math.isfinite(growth) and growth >= 4:
        soft.append(f"server waiting queue grew by {growth:.0f} requests over the run")
    if hard or not soft:
        return Saturation(bool(hard), tuple(hard + soft))
    all_met = bool(slo) and bool(slo_outcomes(df, slo)["met"].all()) if slo is not None else False
    short = long_enough(float(send_span), life_s, n)
    if all_met or short:
        why = short or "undecided: every request met every SLO"
        return Saturation(False, (), f"{why}; " + "; ".join(soft))
    return Saturation(True, tuple(soft))


def _paced_lifetimes(df: pd.DataFrame, intended: np.ndarray, ok: np.ndarray) -> np.ndarray | None:
    """Each request's lifetime in seconds on a server keeping up: the early requests' pace
    (median TTFT, and median TPOT per output token after the first; the first third by
    intended send, before any queue) at its own output length. None: no pace measured."""
    if not ok.any():
        return None
    early = intended <= np.nanpercentile(intended, 100.0 / 3.0)
    ttft = _nanmedian(df.loc[early & ok, "ttft_ms"].to_numpy(dtype=float)) / 1000.0
    tpot = _nanmedian(df.loc[early & ok, "tpot_ms"].to_numpy(dtype=float)) / 1000.0
    if not math.isfinite(ttft):
        return None
    tokens = np.nan_to_num(df["output_tokens"].to_numpy(dtype=float))
    return ttft + np.maximum(tokens - 1.0, 0.0) * (tpot if math.isfinite(tpot) else 0.0)


def _completions_behind(
    df: pd.DataFrame, intended: np.ndarray, ok: np.ndarray, offered: float, paced: np.ndarray | None
) -> str | None:
    """Completions behind a server keeping up: the successful requests finish at
    ``achieved`` req/s, where each ending at its intended send plus its ``paced`` lifetime
    (``_paced_lifetimes``) would give ``expected``."""
    if paced is None or not ok.any() or not math.isfinite(offered):
        return None
    t0 = np.nanmin(intended)
    expected_window = (np.nanmax(intended[ok] + 1e9 * paced[ok]) - t0) / 1e9
    window = (np.nanmax(df["end_ns"].to_numpy(dtype=float)[ok]) - t0) / 1e9
    if not (window > 0 and expected_window > 0):
        return None
    achieved, expected = ok.sum() / window, ok.sum() / expected_window
    if achieved < ADMISSION_RATIO_MIN * expected:
        return (
            f"completions at {achieved:.2f} req/s behind the {expected:.2f} req/s a server keeping up "
            f"with {offered:.2f} req/s would reach at these output lengths"
        )
    return None


def closed_loop_plateau(prev_throughput: float, prev_conc: int, throughput: float, conc: int) -> Saturation:
    """Closed loop: more concurrency that buys (almost) no more throughput is saturation."""
    if conc <= prev_conc or not (prev_throughput > 0):
        return Saturation(False)
    gain = throughput / prev_throughput
    if gain < 1.0 + 0.1 * (conc / prev_conc - 1.0):
        return Saturation(
            True,
            (f"throughput plateau: {throughput:.2f} req/s at concurrency {conc} vs {prev_throughput:.2f} at {prev_conc}",),
        )
    return Saturation(False)


# -- server-side signals (optional) -------------------------------------------------------


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


# -- capacity search ----------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """One load's verdict. ``passed`` False with ``undecided`` True: the sample could not
    decide (its interval straddles the target, it was under-sampled, or the client could not
    measure it truthfully; ``reason`` says which)."""

    rate: float
    passed: bool
    attainment: float = float("nan")
    saturated: bool = False
    undecided: bool = False
    reason: str = ""
    #: decided with a margin: another run of it (another seed) would reach the same verdict
    #: with about 99 % probability (``LoadJudgement.sure``); such a pass below the capacity is
    #: the lower end of the capacity's interval, such a failure above it the upper end
    sure: bool = False


@dataclass(frozen=True)
class CapacityResult:
    """``capacity_rps`` is the highest probed rate that passed below the lowest that did not
    pass (failed or undecided).

    ``upper_rps`` is the lowest rate that failed (None: none failed, capacity is a lower
    bound). Each end is a verdict at ``level`` confidence (analysis/confidence.py), so the
    bracket [capacity_rps, upper_rps) holds at ≥ 1 − 2(1 − level). ``undecided`` lists the
    rates whose sample could not decide. ``converged`` says whether the search bracket
    closed to ``precision``.
    """

    capacity_rps: float | None
    upper_rps: float | None
    precision: float
    converged: bool
    probes: tuple[Probe, ...]
    note: str = ""
    undecided: tuple[float, ...] = ()
    level: float = CONFIDENCE
    #: the interval [interval_low_rps, interval_high_rps), meant to hold another seed's
    #: capacity (docs/sweeps.md: its measured coverage): the highest rate below the capacity
    #: that passed with a margin (``Probe.sure``; None: none did), and the lowest that failed
    #: with one (None: none did; the interval then ends at ``upper_rps``). Another seed's
    #: search stops anywhere in its own bracket, and the capacity is a rate that just passed
    interval_low_rps: float | None = None
    interval_high_rps: float | None = None

    @property
    def achieved_precision(self) -> float | None:
        if self.capacity_rps and self.upper_rps:
            return (self.upper_rps - self.capacity_rps) / self.capacity_rps
        return None


def bracket(probes: list[Probe] | tuple[Probe, ...]) -> tuple[float | None, float | None, bool]:
    """(highest pass below the lowest rate that did not pass, that rate, non-monotone?) of a
    set of probes. An undecided rate bounds the search like a failure (nothing above it can
    be claimed) but is not reported as one (``capacity_from_probes``)."""
    fails = [p.rate for p in probes if not p.passed]
    upper = min(fails) if fails else None
    passes = [p.rate for p in probes if p.passed and (upper is None or p.rate < upper)]
    lower = max(passes) if passes else None
    non_monotone = upper is not None and any(p.passed and p.rate > upper for p in probes)
    return lower, upper, non_monotone


@dataclass
class CapacitySearch:
    """Bracketing (×2 / ÷2 from ``start``) then bisection until the bracket is within
    ``precision`` (relative to the lower end). Drive it with ``next_rate``/``record``."""

    start: float
    precision: float = 0.1
    max_probes: int = 8
    max_rate: float = 1000.0
    min_rate: float = 0.01
    probes: list[Probe] = field(default_factory=list)

    def record(self, probe: Probe) -> None:
        self.probes.append(probe)

    def next_rate(self) -> float | None:
        """The next rate to probe, or None when done."""
        if len(self.probes) >= self.max_probes:
            return None
        if not self.probes:
            return _round_rate(self.start)
        lower, upper, _ = bracket(self.probes)
        if upper is None:
            nxt = _round_rate(lower * 2.0) if lower else None
            return nxt if nxt is not None and nxt <= self.max_rate else None
        if lower is None:
            nxt = _round_rate(upper / 2.0)
            if nxt < self.min_rate:
                # one last probe at the floor itself, unless it was already tried
                nxt = _round_rate(self.min_rate)
                if nxt >= upper or any(abs(p.rate - nxt) < 1e-9 for p in self.probes):
                    return None
            return nxt
        if upper - lower <= self.precision * lower:
            return None
        mid = _round_rate((lower + upper) / 2.0)
        if mid <= lower or mid >= upper or any(abs(p.rate - mid) < 1e-9 for p in self.probes):
            return None
        return mid

    def result(self) -> CapacityResult:
        return capacity_from_probes(self.probes, self.precision, self.max_rate, self.min_rate)


def capacity_from_probes(
    probes: list[Probe] | tuple[Probe, ...], precision: float, max_rate: float = math.inf, min_rate: float = 0.0
) -> CapacityResult:
    lower, search_upper, non_monotone = bracket(probes)
    failed = [p.rate for p in probes if not p.passed and not p.undecided]
    upper = min(failed) if failed else None
    undecided = tuple(sorted({p.rate for p in probes if p.undecided}))
    converged = (
        lower is not None and search_upper is not None and search_upper - lower <= precision * lower * (1 + 1e-9)
    )
    notes = []
    if lower is None and probes:
        notes.append(f"no probed rate met the SLOs (lowest tried {min(p.rate for p in probes):g} req/s)")
    elif search_upper is None and probes:
        notes.append(f"every probed rate met the SLOs; capacity is at least {lower:g} req/s")
    for p in sorted((p for p in probes if p.undecided), key=lambda p: p.rate):
        notes.append(f"undecided at {p.rate:g} req/s: {p.reason or 'its sample cannot decide'}")
    if non_monotone:
        notes.append("a higher rate passed after a lower one did not (noise); the lower bracket is kept")
    sure = [p.rate for p in probes if p.sure and p.passed and lower is not None and p.rate < lower - 1e-9]
    sure_fail = [p.rate for p in probes if p.sure and not p.passed and not p.undecided]
    return CapacityResult(
        lower, upper, precision, converged, tuple(probes), "; ".join(notes), undecided,
        interval_low_rps=max(sure) if sure else None,
        interval_high_rps=min(sure_fail) if sure_fail else upper,
    )  # fmt: skip


def _round_rate(r: float) -> float:
    """Rates to 4 significant digits, so folder names and repeats line up."""
    if r <= 0:
        return r
    return float(f"{r:.4g}")


def passes(attainment: float, saturated: bool, attainment_pct: float) -> bool:
    """The point-estimate rule (no interval): for loads without request counts."""
    return (not saturated) and math.isfinite(attainment) and attainment * 100.0 >= attainment_pct - 1e-9


@dataclass(frozen=True)
class LoadJudgement:
    """A load's verdict from its runs pooled (repeats and re-measurements alike)."""

    verdict: Verdict
    met: int
    judged: int
    attainment: float
    low: float
    high: float
    saturated: bool
    reason: str = ""  # why it failed or is undecided
    untrustworthy: str | None = None  # every run of it was; why
    under_sampled: str | None = None
    #: decided with a margin: its interval at ``sure_level(level)`` (the verdict's z plus a
    #: one-sided 99 % z: 4.3 at 95 %) lies wholly on the verdict's side of the target (or it
    #: saturated), so another run of it, with another seed, would most likely decide the same
    sure: bool = False

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def undecided(self) -> bool:
        return self.verdict == "undecided"

    @property
    def needs_more(self) -> bool:
        """Would more requests of this load (in one longer run) decide it?"""
        return self.undecided and self.untrustworthy is None


def judge_load(runs: Sequence[Mapping[str, Any]], attainment_pct: float, level: float = CONFIDENCE) -> LoadJudgement:
    """Pool the runs of one load (points.parquet rows) that the client measured truthfully and
    decide it: **fail** when saturated or when the attainment interval lies wholly below the
    target, **pass** when it lies wholly at or above it and some run was long enough to stand
    for its rate, **undecided** otherwise (docs/sweeps.md, Confidence)."""
    target = attainment_pct / 100.0
    trusted = [r for r in runs if not r.get("untrustworthy")]
    if not trusted:
        why = next((str(r["untrustworthy"]) for r in runs if r.get("untrustworthy")), "no run")
        return LoadJudgement("undecided", 0, 0, math.nan, math.nan, math.nan, False, f"untrustworthy: {why}", why)
    sat = any(bool(r.get("saturated")) for r in trusted)
    # runs long and steady enough to stand for the rate decide it alone once there are any
    # (a short or still-growing run's attainment is flattered by its ramp-up); else all do
    steady = [r for r in trusted if not r.get("under_sampled")]
    unsteady = [r for r in trusted if r.get("under_sampled")]
    if steady and unsteady and _size(unsteady) > _size(steady):
        steady = []  # the longest run, the best evidence, did not settle: nor did the load
    under = None if steady else str(max(unsteady, key=lambda r: int(r.get("requests") or 0))["under_sampled"])
    p = _Pool.of(steady or trusted, target, level)
    unsettled = ""
    if steady and len(steady) < len(trusted) and p.verdict != "fail":
        # a run that had not settled only flatters (its state still grew): one failing decides
        u = _Pool.of([r for r in trusted if r.get("under_sampled")], target, level)
        if u.verdict == "fail":
            p, unsettled = u, " (runs that had not settled yet)"
    lo, hi = p.interval
    common = dict(met=p.met, judged=p.judged, attainment=p.attainment, low=lo, high=hi, saturated=sat,
                  under_sampled=under)  # fmt: skip
    if sat:
        reasons = [str(r["saturation_reason"]) for r in trusted if r.get("saturation_reason")]
        return LoadJudgement("fail", reason="saturated: " + (reasons[0] if reasons else "yes"), sure=True, **common)  # type: ignore[arg-type]
    corr = f" (correlation counts them as {p.eff_n:.0f})" if p.eff_n < 0.99 * p.judged else ""
    interval = (f"{100 * p.attainment:.1f}% of {p.judged} met{corr}{unsettled}, "
                f"{100 * level:g}% interval {100 * lo:.1f}-{100 * hi:.1f}%")  # fmt: skip
    if p.verdict == "fail":
        sure = p.eff_n > 0 and wilson_interval(p.eff_met, p.eff_n, sure_level(level))[1] < target - 1e-12
        return LoadJudgement("fail", reason=f"{interval}, below {attainment_pct:g}%", sure=sure, **common)  # type: ignore[arg-type]
    if p.verdict == "pass" and under is None:
        sure = target < 1.0 and p.eff_n > 0 and wilson_interval(p.eff_met, p.eff_n, sure_level(level))[0] >= target - 1e-12
        return LoadJudgement("pass", sure=sure, **common)  # type: ignore[arg-type]
    if p.verdict == "pass":
        return LoadJudgement("undecided", reason=f"under-sampled: {under}", **common)  # type: ignore[arg-type]
    need = requests_to_pass(target, level)
    unit = "jobs" if any(_judged(r) != int(r.get("requests") or 0) for r in trusted) else "requests"
    small = f"; fewer than the {need} {unit} a pass needs at all" if p.judged < need else ""
    return LoadJudgement("undecided", reason=f"{interval} straddles {attainment_pct:g}%{small}", **common)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Pool:
    """Runs of one load pooled: met / judged, and the effective counts of the interval
    (requests correlated in time count as fewer independent ones: judged / deff, deff the
    request-weighted mean of the runs' own ``attainment_deff``; a run where every request
    met or missed has none to give)."""

    met: int
    judged: int
    eff_met: float
    eff_n: float
    verdict: Verdict
    interval: tuple[float, float]

    @property
    def attainment(self) -> float:
        return self.met / self.judged if self.judged else math.nan

    @classmethod
    def of(cls, runs: Sequence[Mapping[str, Any]], target: float, level: float) -> _Pool:
        met = sum(_met(r) for r in runs)
        judged = sum(_judged(r) for r in runs)
        known = [(_judged(r), _deff(r)) for r in runs if 0 < _met(r) < _judged(r)]
        weight = sum(n for n, _ in known)
        deff = sum(n * d for n, d in known) / weight if weight else 1.0
        eff_n = judged / deff
        eff_met = met / judged * eff_n if judged else 0.0
        interval = wilson_interval(eff_met, eff_n, level) if eff_n > 0 else (math.nan, math.nan)
        return cls(met, judged, eff_met, eff_n, _verdict(met, judged, eff_met, eff_n, target, level), interval)


def _size(runs: Sequence[Mapping[str, Any]]) -> int:
    """The most requests of one run among ``runs``."""
    return max(int(r.get("requests") or 0) for r in runs)


def sure_level(level: float) -> float:
    """The two-sided level whose z is ``level``'s plus a one-sided 99 % z (2.326): a load
    passing at it would pass another run at ``level`` with about 99 % probability (chosen by
    measured coverage across seeds, docs/sweeps.md; 95 % gave a narrower, less true interval)."""
    if level <= 0:
        return 0.0
    from statistics import NormalDist

    z = z_value(level) + NormalDist().inv_cdf(0.99)
    return 2.0 * NormalDist().cdf(z) - 1.0


def _deff(row: Mapping[str, Any]) -> float:
    """A run's design effect (``attainment_deff``; 1 where absent: points of older sweeps)."""
    v = row.get("attainment_deff")
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 1.0
    return f if math.isfinite(f) and f >= 1.0 else 1.0


def _verdict(met: int, judged: int, eff_met: float, eff_n: float, target: float, level: float) -> Verdict:
    """``attainment_verdict`` on the effective counts (a 100 % target: every request met)."""
    if target >= 1.0 or eff_n >= judged - 1e-9:
        return attainment_verdict(met, judged, target, level)
    lo, hi = wilson_interval(eff_met, eff_n, level)
    if not math.isfinite(lo):
        return "undecided"
    if lo >= target - 1e-12:
        return "pass"
    if hi < target - 1e-12:
        return "fail"
    return "undecided"


def _judged(row: Mapping[str, Any]) -> int:
    """The units a run's attainment counts: its jobs when judged per job, else its requests."""
    jobs = row.get("jobs")
    if jobs is not None and isinstance(jobs, (int, float)) and math.isfinite(jobs):
        return int(jobs)
    return int(row.get("requests") or 0)


def _met(row: Mapping[str, Any]) -> int:
    """Requests of a run that met every SLO (points of older sweeps: from attainment)."""
    met = row.get("met")
    if met is not None and not (isinstance(met, float) and math.isnan(met)):
        return int(met)
    att = row.get("attainment")
    n = int(row.get("requests") or 0)
    return int(round(float(att) * n)) if att is not None and math.isfinite(float(att)) else 0
