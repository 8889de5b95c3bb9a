"""Is a load's sample long and steady enough to stand for its rate? (docs/sweeps.md, Steady state)

Three questions a sweep asks of one open-loop run before its attainment may pass it:

* **Long enough** (``long_enough``): it sent for at least ``LIFETIMES`` lifetimes of the
  workload's *long* requests (the E2E p90 of the run's successful requests, not the median:
  with heavy-tailed output lengths the long requests set how long the engine takes to fill
  its batch and KV cache). Otherwise: how many more requests it needs.
* **Stationary** (``stationarity``): on the window after one long lifetime of ramp-up, the
  engine's state shows no growth between the window's two halves: requests in flight (from
  the client's records), per-request attainment (misses), and where the engine exports them
  its waiting queue and KV-cache use (``server_metrics``). A load whose state still grows is
  "not stationary": it never passes, and the sweep measures it again, longer.
* **How correlated** (``design_effect``): queued requests are not independent trials; one
  long request slows the batch that every neighbour shares. The variance inflation of the
  attainment is estimated by batch means over time (contiguous batches of requests in send
  order, each at least one long lifetime long), and a verdict uses ``n / deff`` effective
  requests instead of ``n`` (analysis.capacity.judge_load).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: A load must send for at least this many long-request lifetimes (E2E p90).
LIFETIMES = 4.0
#: The lifetime of a long request: this percentile of the successful requests' E2E.
LONG_PERCENTILE = 90.0
#: Growth between the window's halves that makes a load not stationary: requests in flight
#: (client records) and the engine's KV-cache use, relative...
GROWTH_RELATIVE = 0.2
#: ...and at least this many requests in flight (and twice the square root of the first half's:
#: a Poisson count's noise) / this share of the KV cache.
GROWTH_MIN_IN_FLIGHT = 2.0
GROWTH_MIN_KV = 0.05
#: The engine's waiting queue: mean growth of at least this many requests (and doubling).
GROWTH_MIN_WAITING = 2.0
#: Misses: the second half's miss share above the first's by this much, and significant at
#: one-sided 95 % (two-proportion z test).
GROWTH_MIN_MISS = 0.05
Z_ONE_SIDED_95 = 1.645
#: Batch means: at most this many batches, at least this many to estimate anything.
MAX_BATCHES = 30
MIN_BATCHES = 5


def long_lifetime_s(e2e_ms: np.ndarray) -> float:
    """A long request's lifetime in seconds (E2E p90 of the given, successful, requests)."""
    v = e2e_ms[np.isfinite(e2e_ms)]
    return float(np.percentile(v, LONG_PERCENTILE)) / 1000.0 if len(v) else math.nan


def requests_needed(send_span_s: float, life_s: float, n: int) -> int:
    """How many more requests than its ``n`` a run needs to send for ``LIFETIMES`` long-request
    lifetimes at its pace (0: it is long enough, or cannot be judged). A sweep sizes its next
    run by this number (``LoadJudgement.more_requests``), never by ``long_enough``'s wording."""
    if not (math.isfinite(send_span_s) and math.isfinite(life_s)) or life_s <= 0 or n < 2:
        return 0
    need_s = LIFETIMES * life_s
    if send_span_s >= need_s:
        return 0
    return math.ceil(n * need_s / max(send_span_s, 1e-9)) - n  # >= 1: the span is short of need_s


def long_enough(send_span_s: float, life_s: float, n: int) -> str | None:
    """Why a run's sending span is too short to stand for its rate (None: long enough)."""
    more = requests_needed(send_span_s, life_s, n)
    if not more:
        return None
    return (
        f"undecided: {more} more requests needed (sent for {send_span_s:.3g} s, under {LIFETIMES:g} lifetimes "
        f"of a long request, E2E p90 {life_s:.3g} s: no steady state yet)"
    )


def _in_flight(starts: np.ndarray, ends: np.ndarray, a: float, b: float) -> float:
    """Time-averaged number of intervals [start, end) open over [a, b)."""
    overlap = np.clip(np.minimum(ends, b) - np.maximum(starts, a), 0.0, None)
    return float(overlap.sum() / (b - a)) if b > a else math.nan


def _grew(a: float, b: float, relative: float, minimum: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and b - a >= minimum and b > (1.0 + relative) * a


def stationarity(
    intended_ns: np.ndarray,
    send_ns: np.ndarray,
    end_ns: np.ndarray,
    met: np.ndarray | None,
    life_s: float,
    server: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> str | None:
    """Why a run's state still grows (None: stationary, or too little to tell).

    ``intended_ns``/``send_ns``/``end_ns``: per request (NaN where absent); ``met``: per
    request, met every SLO (None: no SLO); ``life_s``: a long request's lifetime (the
    ramp-up skipped); ``server``: per engine series name (``waiting``, ``kv_cache_usage``),
    its scrape times (ns, same clock) and values."""
    t = intended_ns[np.isfinite(intended_ns)]
    if len(t) < 20 or not math.isfinite(life_s):
        return None
    t0, t1 = float(t.min()), float(t.max())
    a = t0 + life_s * 1e9
    if t1 <= a:  # nothing left after the ramp-up: long_enough says so
        return None
    mid = (a + t1) / 2.0
    why: list[str] = []
    live = np.isfinite(send_ns) & np.isfinite(end_ns)
    fa = _in_flight(send_ns[live], end_ns[live], a, mid)
    fb = _in_flight(send_ns[live], end_ns[live], mid, t1)
    # (in flight fluctuates about as a Poisson count: growth must also clear twice its sd)
    if _grew(fa, fb, GROWTH_RELATIVE, max(GROWTH_MIN_IN_FLIGHT, 2.0 * math.sqrt(max(fa, 0.0)))):
        why.append(f"requests in flight grew {fa:.0f} -> {fb:.0f}")
    if met is not None:
        first = (intended_ns >= a) & (intended_ns < mid)
        second = intended_ns >= mid
        na, nb = int(first.sum()), int(second.sum())
        if na >= 10 and nb >= 10:
            ma, mb = 1.0 - float(met[first].mean()), 1.0 - float(met[second].mean())
            pooled = (ma * na + mb * nb) / (na + nb)
            se = math.sqrt(max(pooled * (1 - pooled), 1e-12) * (1 / na + 1 / nb))
            if mb - ma >= GROWTH_MIN_MISS and (mb - ma) / se >= Z_ONE_SIDED_95:
                why.append(f"misses grew {100 * ma:.1f}% -> {100 * mb:.1f}%")
    for name, (ts, values) in (server or {}).items():
        ts = np.asarray(ts, dtype=float)
        values = np.asarray(values, dtype=float)
        va = _mean(values[(ts >= a) & (ts < mid)])
        vb = _mean(values[(ts >= mid) & (ts <= t1)])
        if name == "kv_cache_usage" and _grew(va, vb, GROWTH_RELATIVE, GROWTH_MIN_KV):
            why.append(f"KV-cache use grew {va:.2f} -> {vb:.2f}")
        elif name == "waiting" and _grew(va, vb, 1.0, GROWTH_MIN_WAITING):
            why.append(f"waiting queue grew {va:.1f} -> {vb:.1f}")
    if not why:
        return None
    return "not stationary: " + "; ".join(why) + " between the halves of the window after the ramp-up"


def _mean(v: np.ndarray) -> float:
    v = v[np.isfinite(v)]
    return float(v.mean()) if len(v) else math.nan


def design_effect(intended_ns: np.ndarray, met: np.ndarray, life_s: float) -> float:
    """Variance inflation of the attainment from correlation over time (batch means): the
    requests in send order cut into contiguous batches, each at least one long lifetime of
    sending (between MIN_BATCHES and MAX_BATCHES of them); ``deff`` = the batches' variance
    of attainment times the batch size, over p(1 − p). 1 where it cannot be estimated (too
    few batches, or every request met or missed); never below 1."""
    keep = np.isfinite(intended_ns)
    t = intended_ns[keep]
    m = np.asarray(met, dtype=float)[keep]
    n = len(t)
    p = float(m.mean()) if n else math.nan
    if n < 2 * MIN_BATCHES or not 0.0 < p < 1.0:
        return 1.0
    m = m[np.argsort(t, kind="stable")]
    span_s = (float(t.max()) - float(t.min())) / 1e9
    by_time = int(span_s / life_s) if math.isfinite(life_s) and life_s > 0 else MAX_BATCHES
    k = max(MIN_BATCHES, min(MAX_BATCHES, by_time, n // 2))
    size = n // k
    if size < 2:
        return 1.0
    batches = m[: size * k].reshape(k, size).mean(axis=1)
    var = float(batches.var(ddof=1))
    return max(1.0, var * size / (p * (1.0 - p)))


def server_series(table: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``waiting`` (summed over label sets per scrape) and ``kv_cache_usage`` (0..1, the mean over label sets) of a
    run's ``server_metrics`` table, as (scrape times ns, values); only those present."""
    if table is None or table.num_rows == 0 or "common" not in table.column_names:
        return {}
    import pyarrow.compute as pc

    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in ("waiting", "kv_cache_usage"):
        rows = table.filter(pc.equal(table["common"], name))
        if "le" in rows.column_names:
            rows = rows.filter(pc.is_null(rows["le"]))
        if rows.num_rows == 0:
            continue
        ts = rows["ts_ns"].to_numpy().astype(float)
        v = rows["value"].to_numpy(zero_copy_only=False).astype(float)
        uniq, inv = np.unique(ts, return_inverse=True)
        summed = np.zeros(len(uniq))
        np.add.at(summed, inv, np.nan_to_num(v))
        if name == "kv_cache_usage":  # per replica: their mean share
            counts = np.bincount(inv, minlength=len(uniq))
            summed = summed / np.maximum(counts, 1)
            if len(summed) and np.nanmax(summed) > 1.5:
                summed = summed / 100.0
        out[name] = (uniq, summed)
    return out
