"""What the HTML report plots, reduced from the Parquet tables to a bounded number of points.

Every per-request or per-token view is sampled or binned here, so the page size depends on
the number of runs, not on the number of requests (a 100k-request run plots the same ~2,000
points a 1k-request run does).

The run's summary is typed (``RunView.summary``, analysis/summary_types.py); the plotted
series (CDFs, server gauges, the TTFT split) are dicts of lists, handed to plotly as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from bench_llm.analysis.load import Run
from bench_llm.analysis.metrics import itl_ms, measured, request_metrics
from bench_llm.analysis.recommend_types import Recommendation, read_recommendation
from bench_llm.analysis.server_metrics import PREFILL_HIST, QUEUE_HIST, common_filter, hist_interval_means
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.smoothness import Deadlines, smoothness_metrics
from bench_llm.analysis.summary import SummaryOptions, summarize
from bench_llm.analysis.summary_types import RunSummary
from bench_llm.results.reader import read_server_metrics, read_server_spans
from bench_llm.results.sweep_layout import CELLS_FILE, RECOMMENDATION_FILE, read_cells_table
from bench_llm.results.sweep_rows import LoadRef

#: Quantile grid of a CDF: fine in the tail, where the interesting part is.
CDF_GRID = np.unique(np.r_[np.linspace(0, 0.9, 91), 1 - np.logspace(-1, -4, 120), 1.0])
TIMELINE_SAMPLE = 30
TIMELINE_MAX_TOKENS = 64
TIME_BINS = 120

#: Common names of server metrics (analysis/server_metrics.py); older spellings accepted.
GAUGES = {
    "waiting": ("waiting", "num_requests_waiting"),
    "running": ("running", "num_requests_running"),
    "kv_cache_usage": ("kv_cache_usage",),
}


@dataclass
class RunView:
    """Everything the report shows about one run (small)."""

    run_id: str
    label: str
    path: str
    meta: dict[str, Any]
    summary: RunSummary
    key: str  # configuration key (sweep cell / load) or ''
    gpus: int
    offered: float | None  # offered load value (rate req/s or concurrency)
    offered_kind: str | None
    cdfs: dict[str, dict[str, Any]] = field(default_factory=dict)  # metric -> {x, p, marks}
    load_series: dict[str, list[float]] | None = None  # t_s, offered_rps, achieved_rps, in_flight
    timeline: list[dict[str, Any]] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    smoothness: dict[str, float] = field(default_factory=dict)
    #: per-class rows of a mixed workload (analysis/classes.py)
    classes: list[dict[str, Any]] = field(default_factory=list)
    #: per-request TTFT split (engine-reported timings): part -> quartiles, fences, mean (ms)
    ttft_parts: dict[str, dict[str, float]] = field(default_factory=dict)
    #: job-level metrics (analysis/jobs.py) when the run's schedule has sessions or graphs
    jobs: Any = None


def _cdf(values: np.ndarray) -> dict[str, Any] | None:
    v = values[np.isfinite(values)]
    if len(v) == 0:
        return None
    xs = np.quantile(v, CDF_GRID)
    marks = {f"p{q}": float(np.percentile(v, q)) for q in (50, 95, 99)}
    return {"x": xs.round(4).tolist(), "p": CDF_GRID.round(6).tolist(), "marks": marks, "n": int(len(v))}


def _dict_at(d: dict[str, Any], key: str) -> dict[str, Any]:
    """``d[key]`` when it is a dict, else an empty one."""
    value = d.get(key)
    return value if isinstance(value, dict) else {}


def _cell_info(meta: dict[str, Any]) -> tuple[int, float | None, str | None]:
    extra = _dict_at(meta, "extra")
    cell = _dict_at(extra, "cell")
    load = LoadRef.from_row(extra)  # a sweep's load, in this or the earlier spelling
    gpus = cell.get("gpus")
    if not isinstance(gpus, int) or gpus < 1:
        prod = 1
        for axis in ("tp", "pp", "dp", "ep", "dcp", "pcp"):
            v = cell.get(axis)
            if isinstance(v, int) and v > 1 and axis in ("tp", "pp", "dp", "pcp"):
                prod *= v
        gpus = prod
    if load is None:
        return gpus, None, None
    return gpus, (load.value if math.isfinite(load.value) else None), load.kind or None


def run_slo(meta: dict[str, Any], override: SLO) -> SLO:
    if override:
        return override
    cfg = _dict_at(meta, "config")
    slo = cfg.get("slo")
    if isinstance(slo, dict) and slo:
        try:
            return SLO.from_dict({k: float(v) for k, v in slo.items()})
        except (ValueError, TypeError):
            return SLO()
    return SLO()


def build_run_view(run: Run, key: str, slo_override: SLO, seed: int = 0) -> RunView:
    meta = run.meta
    slo = run_slo(meta, slo_override)
    table = measured(run.requests)
    summary = summarize(run.requests, SummaryOptions(slo=slo), run.monitor)
    gpus, offered, kind = _cell_info(meta)
    label = key or run.run_id
    view = RunView(run.run_id, label, str(run.path), meta, summary, key, gpus, offered, kind)
    df = request_metrics(table)
    ok = df["ok"].to_numpy(dtype=bool)
    ok_table = table.filter(pa.array(ok))
    for name, values in (
        ("TTFT", df.loc[ok, "ttft_ms"].to_numpy(dtype=float)),
        ("TPOT", df.loc[ok, "tpot_ms"].to_numpy(dtype=float)),
        ("ITL", itl_ms(ok_table)),
        ("E2E", df.loc[ok, "e2e_ms"].to_numpy(dtype=float)),
    ):
        c = _cdf(values)
        if c is not None:
            view.cdfs[name] = c
    if not view.cdfs:
        view.notes.append("no completed requests: latency distributions omitted")
    smooth = smoothness_metrics(ok_table, Deadlines.from_slo(slo.as_dict()))
    if len(smooth) and smooth["fluidity"].notna().any():
        view.smoothness = {
            "fluidity_mean": float(smooth["fluidity"].mean()),
            "fluidity_p5": float(smooth["fluidity"].quantile(0.05)),
            "longest_gap_p50_ms": float(smooth["longest_gap_ms"].quantile(0.5)),
            "longest_gap_p99_ms": float(smooth["longest_gap_ms"].quantile(0.99)),
        }
    view.load_series = _load_series(df, run.monitor)
    view.timeline = _timeline(table, df, seed)
    view.server = _server_views(Path(run.path), df)
    view.ttft_parts = _ttft_parts(table, read_server_spans(Path(run.path)))
    from bench_llm.analysis.classes import class_breakdown

    view.classes = class_breakdown(table, SummaryOptions(slo=slo))
    if not view.server:
        view.notes.append("no server metrics in this run (server_metrics/ absent): queue/prefill split and engine state omitted")
    return view


def _load_series(df: pd.DataFrame, monitor: pa.Table | None) -> dict[str, list[float]] | None:
    intended = df["intended_send_ns"].to_numpy(dtype=float)
    ends = df["end_ns"].to_numpy(dtype=float)
    if len(df) == 0 or not np.isfinite(ends).any():
        return None
    t0 = float(np.nanmin(intended))
    t1 = float(np.nanmax(ends))
    if t1 <= t0:
        return None
    n = TIME_BINS if (t1 - t0) / 1e9 > 2 * TIME_BINS * 0.05 else max(10, int((t1 - t0) / 1e9 / 0.05))
    edges = np.linspace(t0, t1, n + 1)
    width = (t1 - t0) / n / 1e9
    offered = np.histogram(intended, edges)[0] / width
    ok = df["ok"].to_numpy(dtype=bool)
    achieved = np.histogram(ends[ok & np.isfinite(ends)], edges)[0] / width
    send = df["send_ns"].to_numpy(dtype=float)
    mids = (edges[:-1] + edges[1:]) / 2
    # requests in flight at each bin centre: sent before and not yet finished
    s_sorted = np.sort(send[np.isfinite(send)])
    e_sorted = np.sort(np.where(np.isfinite(ends), ends, np.inf)[np.isfinite(send)])
    in_flight = np.searchsorted(s_sorted, mids) - np.searchsorted(e_sorted, mids)
    return {
        "t_s": ((mids - t0) / 1e9).round(3).tolist(),
        "offered_rps": offered.round(3).tolist(),
        "achieved_rps": achieved.round(3).tolist(),
        "in_flight": in_flight.astype(int).tolist(),
    }


def _timeline(table: pa.Table, df: pd.DataFrame, seed: int) -> list[dict[str, Any]]:
    """A sample of requests (evenly spread in send order) with their token arrival times."""
    n = table.num_rows
    if n == 0:
        return []
    send = df["send_ns"].to_numpy(dtype=float)
    valid = np.flatnonzero(np.isfinite(send))
    if len(valid) == 0:
        return []
    t0 = float(np.nanmin(df["intended_send_ns"].to_numpy(dtype=float)))
    order = valid[np.argsort(send[valid], kind="stable")]
    pick = order[np.unique(np.linspace(0, len(order) - 1, min(TIMELINE_SAMPLE, len(order))).astype(int))]
    chunk_ns = table["chunk_ns"]
    chunk_tk = table["chunk_tokens"]
    out = []
    for i in pick.tolist():
        ts = np.asarray(chunk_ns[i].as_py() or [], dtype=float)
        tk = np.asarray(chunk_tk[i].as_py() or [], dtype=float)
        keep = tk > 0
        ts, tk = ts[keep], tk[keep]
        cum = np.cumsum(tk)
        if len(ts) > TIMELINE_MAX_TOKENS:
            sel = np.unique(np.linspace(0, len(ts) - 1, TIMELINE_MAX_TOKENS).astype(int))
            ts, cum = ts[sel], cum[sel]
        end = df["end_ns"].iloc[i]
        out.append(
            {
                "request_id": str(df["request_id"].iloc[i]),
                "send_s": round((send[i] - t0) / 1e9, 6),
                "end_s": round((float(end) - t0) / 1e9, 6) if pd.notna(end) else None,
                "tokens_s": ((ts - t0) / 1e9).round(6).tolist(),
                "cum_tokens": cum.astype(int).tolist(),
                "ok": bool(df["ok"].iloc[i]),
                "error": None if pd.isna(df["error_type"].iloc[i]) else str(df["error_type"].iloc[i]),
            }
        )
    return out


def _ttft_parts(table: pa.Table, spans: pa.Table | None) -> dict[str, dict[str, float]]:
    """Each TTFT part's distribution over requests, reduced to a box (analysis/ttft_split.py)."""
    from bench_llm.analysis.ttft_split import PARTS, request_parts

    parts = request_parts(table, spans)
    out: dict[str, dict[str, float]] = {}
    for name in ("ttft", *PARTS):
        v = parts[f"{name}_ms"].to_numpy(dtype=float) if len(parts) else np.array([])
        v = v[np.isfinite(v)]
        if len(v):
            q = np.percentile(v, [5, 25, 50, 75, 95])
            out[name] = {"p5": q[0], "q1": q[1], "median": q[2], "q3": q[3], "p95": q[4], "mean": float(v.mean()), "n": float(len(v))}
    return out


def _server_views(run_dir: Path, df: pd.DataFrame) -> dict[str, Any]:
    table = read_server_metrics(run_dir)
    if table is None or table.num_rows == 0 or "common" not in table.column_names:
        return {}
    t0 = float(np.nanmin(df["intended_send_ns"].to_numpy(dtype=float))) if len(df) else 0.0
    out: dict[str, Any] = {}
    gauges: dict[str, dict[str, list[float]]] = {}
    for name, aliases in GAUGES.items():
        t = common_filter(table, aliases)
        if t.num_rows == 0:
            continue
        g = t.select(["ts_ns", "type", "value"]).to_pandas()
        g = g[g["type"].isin(["gauge", None]) | g["type"].isna()].groupby("ts_ns")["value"].sum().sort_index()
        g = _downsample(g, 400)
        gauges[name] = {"t_s": ((g.index.to_numpy(dtype=float) - t0) / 1e9).round(3).tolist(), "v": g.to_numpy(dtype=float).round(4).tolist()}
    if gauges:
        out["gauges"] = gauges
    split = _ttft_split(table, df, t0)
    if split:
        out["ttft_split"] = split
    return out


def _downsample(s: pd.Series, n: int) -> pd.Series:
    if len(s) <= n:
        return s
    idx = np.unique(np.linspace(0, len(s) - 1, n).astype(int))
    return s.iloc[idx]


def _ttft_split(table: pa.Table, df: pd.DataFrame, t0: float) -> dict[str, Any] | None:
    q = hist_interval_means(table, QUEUE_HIST)
    p = hist_interval_means(table, PREFILL_HIST)
    if q is None and p is None:
        return None
    frames = []
    totals = {}
    for name, res in (("queue", q), ("prefill", p)):
        if res is None:
            continue
        mean, count = res
        frames.append(mean.rename(name))
        totals[name] = float((mean * count).sum() / count.sum() * 1000)
    merged = pd.concat(frames, axis=1).sort_index()
    merged = _downsample(merged, 200)
    # the client's mean TTFT of requests whose first token fell in each scrape interval
    ft = df["first_token_ns"].to_numpy(dtype=float)
    ttft = df["ttft_ms"].to_numpy(dtype=float)
    edges = np.r_[-np.inf, merged.index.to_numpy(dtype=float)]
    which = np.searchsorted(edges, ft, side="left") - 1
    client = []
    for i in range(len(merged)):
        sel = (which == i) & np.isfinite(ttft)
        client.append(round(float(ttft[sel].mean()), 3) if sel.any() else None)
    ok_ttft = ttft[np.isfinite(ttft) & df["ok"].to_numpy(dtype=bool)]
    return {
        "t_s": ((merged.index.to_numpy(dtype=float) - t0) / 1e9).round(3).tolist(),
        "queue_ms": (merged["queue"] * 1000).round(3).where(merged["queue"].notna(), None).tolist() if "queue" in merged else None,
        "prefill_ms": (merged["prefill"] * 1000).round(3).where(merged["prefill"].notna(), None).tolist() if "prefill" in merged else None,
        "client_ttft_ms": client,
        "overall_ms": {**totals, "client_ttft_mean": float(ok_ttft.mean()) if len(ok_ttft) else math.nan},
    }


def read_sweep_tables(path: Path) -> tuple[pd.DataFrame | None, Recommendation | None, list[str]]:
    """cells.parquet and recommendation.json of a sweep folder, with notes on what is missing."""
    notes: list[str] = []
    cells = None
    rec = None
    try:
        table = read_cells_table(path)
        cells = table.to_pandas() if table is not None else None
    except (OSError, pa.ArrowInvalid) as exc:
        notes.append(f"{CELLS_FILE} unreadable ({exc})")
    rec_path = path / RECOMMENDATION_FILE
    if rec_path.exists():
        try:
            rec = read_recommendation(rec_path)
        except (OSError, ValueError, TypeError) as exc:
            notes.append(f"{RECOMMENDATION_FILE} unreadable ({exc})")
    elif cells is not None:
        notes.append(f"no {RECOMMENDATION_FILE} in this sweep (run `bench recommend` to add one)")
    return cells, rec, notes



@dataclass(frozen=True)
class LoadPoint:
    """One configuration at one load, repeats pooled (analysis/bootstrap.py point estimates)."""

    config: str  # the sweep cell, or 'run' for plain runs
    label: str
    gpus: int
    offered: float  # the load asked for (rate or concurrency), else the measured send rate
    offered_kind: str | None
    offered_rps: float  # measured requests sent per second of window
    runs: int
    metrics: dict[str, float]
    saturated: bool = False  # the sweep marked a repeat of this load saturated

    @property
    def asked_rps(self) -> float:
        """The rate the load asked for: the configured rate of a rate load, else the measured
        send rate (a saturated open-loop run stretches its window, so its send rate per second
        of window sinks towards what it achieved and would hide the saturation)."""
        return self.offered if self.offered_kind == "rate" and self.offered > 0 else self.offered_rps


POINT_METRICS = ("tpot_p50_ms", "ttft_p95_ms", "output_tokens_per_s", "requests_per_s", "goodput_rps", "slo_attainment")


def load_points(runs: list[Run], views: list[RunView], slo_override: SLO) -> list[LoadPoint]:
    """Pool the repeats of each configuration and load into one point."""
    from bench_llm.analysis.bootstrap import make_side, point_estimates

    groups: dict[str, list[int]] = {}
    for i, v in enumerate(views):
        groups.setdefault(v.key or f"run:{v.run_id}", []).append(i)
    points = []
    for key, idx in groups.items():
        first = views[idx[0]]
        slo = run_slo(first.meta, slo_override)
        side = make_side([runs[i].requests for i in idx], slo)
        names = [n for n in POINT_METRICS if slo or n not in ("goodput_rps", "slo_attainment")]
        metrics = point_estimates(side, names)
        window = sum(r.window_s for r in side.runs)
        sent_rps = sum(len(r.requests) for r in side.runs) / window if window > 0 else 0.0
        config = first.key.split(" / ")[0] if first.key else "run"
        label = first.key if first.key else first.label
        offered = first.offered if first.offered is not None else sent_rps
        saturated = any(bool(_dict_at(views[i].meta, "extra").get("saturated")) for i in idx)
        points.append(LoadPoint(config, label, first.gpus, offered, first.offered_kind, sent_rps, len(idx), metrics, saturated))
    return points
