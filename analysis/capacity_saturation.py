"""Saturation of one load, and whether the client measured it truthfully.

Saturation of one open-loop run: the rate at which requests got their first token fell
behind the offered rate, or the time from intended send to first token kept growing over
the run (queue building without bound), or the server's waiting queue grew. A closed-loop
run is saturated when the engine refused requests or when more concurrency bought (almost)
no more throughput. ``untrustworthy`` says why the client could not measure a load
truthfully (anomalous records, a saturated client whose delay matters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from bench_llm.analysis.capacity_steady import long_enough, long_lifetime_s, requests_needed
from bench_llm.analysis.load import Run
from bench_llm.analysis.metrics import measured, request_metrics
from bench_llm.analysis.server_signals import ServerSignals
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.slo_judge import slo_outcomes
from bench_llm.analysis.summary_types import ClientHealth
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


@dataclass(frozen=True)
class Saturation:
    saturated: bool
    reasons: tuple[str, ...] = ()
    #: not saturated, but what the timing tests saw cannot be judged on this run (too short,
    #: or every SLO met): why, and what a longer run needs ("undecided: N more requests needed")
    undecided: str | None = None
    #: with ``undecided`` for a run too short: how many more requests a run needs (0: not that)
    undecided_more: int = 0

    def __str__(self) -> str:
        return "; ".join(self.reasons) if self.reasons else "not saturated"


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


def nanmedian(v: np.ndarray) -> float:
    v = v[~np.isnan(v)]
    return float(np.median(v)) if len(v) else float("nan")


def span_rate(ns: np.ndarray) -> float:
    v = np.sort(ns[np.isfinite(ns)])
    if len(v) < 2 or v[-1] <= v[0]:
        return float("nan")
    return float((len(v) - 1) / ((v[-1] - v[0]) / 1e9))


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


def open_loop_saturation(run: Run, signals: ServerSignals | None = None, slo: SLO | None = None) -> Saturation:
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
        offered = span_rate(intended)
        admitted = span_rate(df["first_token_ns"].to_numpy(dtype=float))
        if math.isfinite(offered) and math.isfinite(admitted) and admitted < ADMISSION_RATIO_MIN * offered:
            soft.append(f"first tokens at {admitted:.2f} req/s behind the offered {offered:.2f} req/s")
        else:
            behind = _completions_behind(df, intended, ok, offered, paced)
            if behind:
                soft.append(behind)
        order = np.argsort(intended, kind="stable")
        lag = df["ttft_from_intended_ms"].to_numpy(dtype=float)[order]
        third = n // 3
        early, late = nanmedian(lag[:third]), nanmedian(lag[-third:])
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
        more = requests_needed(float(send_span), life_s, n) if short else 0
        return Saturation(False, (), f"{why}; " + "; ".join(soft), more)
    return Saturation(True, tuple(soft))


def _paced_lifetimes(df: pd.DataFrame, intended: np.ndarray, ok: np.ndarray) -> np.ndarray | None:
    """Each request's lifetime in seconds on a server keeping up: the early requests' pace
    (median TTFT, and median TPOT per output token after the first; the first third by
    intended send, before any queue) at its own output length. None: no pace measured."""
    if not ok.any():
        return None
    early = intended <= np.nanpercentile(intended, 100.0 / 3.0)
    ttft = nanmedian(df.loc[early & ok, "ttft_ms"].to_numpy(dtype=float)) / 1000.0
    tpot = nanmedian(df.loc[early & ok, "tpot_ms"].to_numpy(dtype=float)) / 1000.0
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

