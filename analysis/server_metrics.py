"""The engine's own metrics (scraped /metrics, long format) and the client-vs-server TTFT check.

Reads ``server_metrics/part-*.parquet`` only. A histogram over a window is the difference
of its cumulative buckets between the first and the last scrape of the window, summed over
label sets (DP ranks, models). Quantiles are interpolated linearly inside the bucket that
holds them, as Prometheus' ``histogram_quantile`` does, so they are only as fine as the
engine's buckets; the mean (``_sum``/``_count``) is exact.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from bench_llm.analysis.summary_types import ToJson
from bench_llm.results.reader import read_server_metrics

NS_PER_MS = 1_000_000


@dataclass(frozen=True)
class WindowHistogram:
    """One histogram's observations inside a window."""

    bounds: np.ndarray  # upper bounds (le), ascending, ending with +inf
    counts: np.ndarray  # cumulative counts per bound over the window
    total: float
    sum: float

    @property
    def mean(self) -> float:
        return self.sum / self.total if self.total > 0 else math.nan

    def quantile(self, q: float) -> float:
        return bucket_quantile(self.bounds, self.counts, q)

    def bucket_of(self, q: float) -> tuple[float, float]:
        """The (lower, upper) bounds of the bucket holding quantile ``q``."""
        if self.total <= 0:
            return (math.nan, math.nan)
        rank = q * self.total
        i = int(np.searchsorted(self.counts, rank, side="left"))
        i = min(i, len(self.bounds) - 1)
        lower = 0.0 if i == 0 else float(self.bounds[i - 1])
        return (lower, float(self.bounds[i]))


def bucket_quantile(bounds: np.ndarray, cumulative: np.ndarray, q: float) -> float:
    """Prometheus-style quantile from cumulative bucket counts (linear inside a bucket)."""
    if len(bounds) == 0 or cumulative[-1] <= 0:
        return math.nan
    total = float(cumulative[-1])
    rank = q * total
    i = int(np.searchsorted(cumulative, rank, side="left"))
    if i >= len(bounds):
        i = len(bounds) - 1
    upper = float(bounds[i])
    if math.isinf(upper):  # in the +Inf bucket: the best one can say is the last finite bound
        return float(bounds[i - 1]) if i > 0 else math.nan
    lower = 0.0 if i == 0 else float(bounds[i - 1])
    below = 0.0 if i == 0 else float(cumulative[i - 1])
    in_bucket = float(cumulative[i]) - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket


def load_server_metrics(run_dir: Path) -> pa.Table | None:
    return read_server_metrics(Path(run_dir))


def window_histogram(
    table: pa.Table, common: str, start_ns: int | None = None, end_ns: int | None = None
) -> WindowHistogram | None:
    """The histogram ``common`` between the scrape at/just before ``start_ns`` and the last scrape before ``end_ns``."""
    t = table.filter(pc.equal(table["common"], common))
    if t.num_rows == 0:
        return None
    df = t.select(["ts_ns", "type", "labels", "le", "value"]).to_pandas()
    if end_ns is not None:
        df = df[df["ts_ns"] <= end_ns]
    if df.empty:
        return None
    scrape_times = np.sort(df["ts_ns"].unique())
    if start_ns is None:
        t_first = scrape_times[0]
    else:
        before = scrape_times[scrape_times <= start_ns]
        t_first = before[-1] if len(before) else scrape_times[0]
    t_last = scrape_times[-1]
    first = df[df["ts_ns"] == t_first]
    last = df[df["ts_ns"] == t_last]

    def totals(part: Any, kind: str) -> Any:
        return part[part["type"] == kind].groupby(["labels", "le"] if kind == "histogram_bucket" else ["labels"])["value"].sum()

    b_last = totals(last, "histogram_bucket").groupby(level="le").sum()
    if b_last.empty:
        return None
    b_first = totals(first, "histogram_bucket").groupby(level="le").sum() if t_first != t_last else b_last * 0
    buckets = (b_last - b_first.reindex(b_last.index, fill_value=0.0)).sort_index()
    s_last, s_first = totals(last, "histogram_sum").sum(), totals(first, "histogram_sum").sum()
    c_last, c_first = totals(last, "histogram_count").sum(), totals(first, "histogram_count").sum()
    if t_first == t_last:
        s_first = c_first = 0.0
    bounds = buckets.index.to_numpy(dtype=float)
    counts = np.maximum.accumulate(np.clip(buckets.to_numpy(dtype=float), 0, None))
    total = float(c_last - c_first) if c_last >= c_first else float(counts[-1])
    return WindowHistogram(bounds, counts, total, float(s_last - s_first))


@dataclass(frozen=True, slots=True)
class TtftCrossCheck(ToJson):
    """The client's TTFT beside the server's TTFT histogram over the same window
    (``ttft_cross_check``); ``*_rel_diff`` are (client - server) / server."""

    metric: str  # "ttft"
    server_count: float
    server_mean_ms: float
    server_p50_ms: float
    server_p90_ms: float
    server_p50_bucket_ms: tuple[float, float]  # the histogram bucket holding the server's p50
    client_count: int
    client_mean_ms: float
    client_p50_ms: float
    client_p90_ms: float
    p50_rel_diff: float
    mean_rel_diff: float
    #: client mean - server mean: the mean of what the client saw beyond the engine's own TTFT,
    #: exact (the server's side is _sum/_count) when both count the same requests; unlike the
    #: p50s it has no bucket to jump across, and unlike mean_rel_diff one slow warm-up request
    #: does not dilute it
    mean_gap_ms: float
    #: the client's TTFTs put into the server's buckets and interpolated the same way
    client_p50_bucketed_ms: float
    p50_rel_diff_bucketed: float
    client_p50_in_server_bucket: bool | None  # None: the server's p50 bucket is unknown


def _rel_diff(client: float, server: float) -> float:
    return (client - server) / server if server and not math.isnan(server) else math.nan


def ttft_cross_check(run_dir: Path, requests: pa.Table) -> TtftCrossCheck | None:
    """The client's TTFT beside the server's TTFT histogram for the same window.

    The window runs from the first to the last scrape (bench scrapes right before the first
    request and right after the last answer), so every request of the run is in both views;
    the client side therefore includes warm-up requests too, as the server's does.
    """
    table = load_server_metrics(run_dir)
    if table is None or table.num_rows == 0:
        return None
    hist = window_histogram(table, "ttft_seconds")
    if hist is None:
        return None
    send = requests["send_ns"].to_numpy(zero_copy_only=False)
    first = requests["first_token_ns"].to_numpy(zero_copy_only=False)
    mask = ~(np.isnan(send.astype(float)) | np.isnan(first.astype(float)))
    client_ms = (first[mask].astype(float) - send[mask].astype(float)) / NS_PER_MS
    if not client_ms.size:  # no request has a client TTFT (a non-streaming run): nothing to compare
        return None
    client_p50 = float(np.percentile(client_ms, 50))
    server_p50 = hist.quantile(0.5) * 1000
    server_mean = hist.mean * 1000
    client_mean = float(client_ms.mean())
    lo, hi = hist.bucket_of(0.5)
    # Like with like: the client's TTFTs put into the server's buckets and interpolated the same
    # way, so the buckets' coarseness cancels out of the comparison.
    idx = np.searchsorted(hist.bounds, client_ms / 1000, side="left")
    binned = np.cumsum(np.bincount(np.minimum(idx, len(hist.bounds) - 1), minlength=len(hist.bounds)))
    bucketed = bucket_quantile(hist.bounds, binned.astype(float), 0.5) * 1000
    return TtftCrossCheck(
        metric="ttft",
        server_count=hist.total,
        server_mean_ms=server_mean,
        server_p50_ms=server_p50,
        server_p90_ms=hist.quantile(0.9) * 1000,
        server_p50_bucket_ms=(lo * 1000, hi * 1000),
        client_count=int(client_ms.size),
        client_mean_ms=client_mean,
        client_p50_ms=client_p50,
        client_p90_ms=float(np.percentile(client_ms, 90)),
        p50_rel_diff=_rel_diff(client_p50, server_p50),
        mean_rel_diff=_rel_diff(client_mean, server_mean),
        mean_gap_ms=client_mean - server_mean,
        client_p50_bucketed_ms=bucketed,
        p50_rel_diff_bucketed=_rel_diff(bucketed, server_p50),
        client_p50_in_server_bucket=bool(lo * 1000 <= client_p50 <= hi * 1000) if not math.isnan(lo) else None,
    )


def gauge_series(table: pa.Table, common: str) -> Any:
    """A gauge summed over label sets, per scrape (pandas Series indexed by ts_ns)."""
    t = table.filter(pc.equal(table["common"], common))
    df = t.select(["ts_ns", "type", "value"]).to_pandas()
    return df[df["type"] == "gauge"].groupby("ts_ns")["value"].sum()


def prefix_cache_hit_rate(table: pa.Table) -> float | None:
    """The engine's prefix-cache hit rate over the run: hit tokens / queried tokens from its
    counters (vLLM), else the mean of its own hit-rate gauge (SGLang); None when it exports
    neither, NaN when it queried nothing in the window."""
    q = table.filter(pc.equal(table["common"], "prefix_cache_queries"))
    h = table.filter(pc.equal(table["common"], "prefix_cache_hits"))
    if q.num_rows and h.num_rows:
        dq = pc.sum(pc.fill_null(q["delta"], 0)).as_py() or 0
        dh = pc.sum(pc.fill_null(h["delta"], 0)).as_py() or 0
        return float(dh / dq) if dq else math.nan
    g = gauge_series(table, "prefix_cache_hit_rate")
    return float(g.mean()) if len(g) else None


@dataclass(frozen=True, slots=True)
class SpecDecodeAcceptance(ToJson):
    """Speculative decoding over the run, from the engine's own counters (docs/metrics.md,
    "Speculative decoding acceptance"): each count is its counter's increase between the first
    and the last scrape, summed over label sets (DP ranks)."""

    drafts: float  # verification steps: one per sequence per decode step that checked drafts
    draft_tokens: float
    accepted_tokens: float
    #: accepted draft tokens / draft tokens (NaN: no drafts in the window)
    acceptance_rate: float
    #: accepted draft tokens / drafts, the step's own token not counted (NaN: no drafts)
    accepted_per_step: float
    #: steps whose accepted drafts reached position i (0-based) / drafts; () when not exported
    by_position: tuple[float, ...]
    #: each draft's acceptance given that the ones before it were accepted (a chain stops at its
    #: first rejection): accepted / (accepted + steps that ended on a rejection), the steps that
    #: accepted all k drafts being the last position's count; what ``bench sim serve --spec-accept``
    #: takes. None without the per-position counter; NaN with no drafts
    chain_acceptance: float | None

    @property
    def acceptance_length(self) -> float:
        """Tokens a verification step yields on average: its own plus the accepted drafts."""
        return 1.0 + self.accepted_per_step


def _counter_increase(table: pa.Table, common: str) -> float | None:
    """The increase of the counter ``common`` over the scraped window (Σ of its deltas, which
    count a reset's value as the increase); None when the engine does not export it."""
    t = table.filter(pc.equal(table["common"], common))
    if not t.num_rows:
        return None
    return float(pc.sum(pc.fill_null(t["delta"], 0)).as_py() or 0)


def spec_decode_acceptance(table: pa.Table) -> SpecDecodeAcceptance | None:
    """Speculative decoding's acceptance over the run, or None when the engine exports no
    speculative counters (no speculative decoding, or an engine without such counters)."""
    drafts = _counter_increase(table, "spec_decode_drafts")
    draft_tokens = _counter_increase(table, "spec_decode_draft_tokens")
    accepted = _counter_increase(table, "spec_decode_accepted_tokens")
    if drafts is None or draft_tokens is None or accepted is None:
        return None
    per_pos: dict[int, float] = {}
    t = table.filter(pc.equal(table["common"], "spec_decode_accepted_tokens_per_pos"))
    for labels, delta in zip(t["labels"].to_pylist(), t["delta"].to_pylist()):
        pos = json.loads(labels or "{}").get("position")
        if pos is not None and str(pos).isdigit():
            per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + float(delta or 0.0)
    k = max(per_pos, default=-1) + 1  # the engine registers every position 0..k-1
    by_position = tuple(per_pos.get(i, 0.0) / drafts if drafts else math.nan for i in range(k))
    chain: float | None = None
    if k:
        trials = accepted + drafts - per_pos.get(k - 1, 0.0)  # accepted drafts + first rejections
        chain = accepted / trials if trials else math.nan
    return SpecDecodeAcceptance(
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted_tokens=accepted,
        acceptance_rate=accepted / draft_tokens if draft_tokens else math.nan,
        accepted_per_step=accepted / drafts if drafts else math.nan,
        by_position=by_position,
        chain_acceptance=chain,
    )


def server_summary(run_dir: Path, requests: pa.Table) -> dict[str, Any] | None:
    """What `bench summary` shows about the engine's own view of the run."""
    table = load_server_metrics(run_dir)
    if table is None or table.num_rows == 0:
        return None
    out: dict[str, Any] = {"scrapes": int(len(set(table["ts_ns"].to_pylist())))}
    for name in ("waiting", "running", "kv_cache_usage"):
        s = gauge_series(table, name)
        if len(s):
            out[f"{name}_max"] = float(s.max())
            out[f"{name}_mean"] = float(s.mean())
    rate = prefix_cache_hit_rate(table)
    if rate is not None:
        out["prefix_cache_hit_rate"] = rate
    spec = spec_decode_acceptance(table)
    if spec is not None:
        out["spec_decode"] = spec
    p = table.filter(pc.equal(table["common"], "preemptions"))
    if p.num_rows:
        out["preemptions"] = float(pc.sum(pc.fill_null(p["delta"], 0)).as_py() or 0)
    check = ttft_cross_check(run_dir, requests)
    if check is not None:
        out["ttft_check"] = check
    return out


#: The common names of the engines' queue-time and prefill-time histograms (the TTFT split reads
#: them, and the report draws them).
QUEUE_HIST = ("queue_seconds", "queue_time_seconds")
PREFILL_HIST = ("prefill_seconds", "prefill_time_seconds")


def common_filter(table: pa.Table, names: tuple[str, ...]) -> pa.Table:
    """The rows of a server-metrics table whose common metric name is one of ``names``."""
    mask = pc.is_in(table["common"], value_set=pa.array(list(names)))
    return table.filter(pc.fill_null(mask, False))


def hist_interval_means(table: pa.Table, aliases: tuple[str, ...]) -> tuple[pd.Series, pd.Series] | None:
    """Mean observation (seconds) per scrape interval, from _sum/_count deltas."""
    t = common_filter(table, aliases)
    if t.num_rows == 0:
        return None
    d = t.select(["ts_ns", "type", "delta"]).to_pandas()
    s = d[d["type"] == "histogram_sum"].groupby("ts_ns")["delta"].sum()
    c = d[d["type"] == "histogram_count"].groupby("ts_ns")["delta"].sum()
    both = pd.concat([s.rename("sum"), c.rename("count")], axis=1).dropna()
    both = both[both["count"] > 0]
    if both.empty:
        return None
    return both["sum"] / both["count"], both["count"]
