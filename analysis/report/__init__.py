"""The self-contained HTML report of runs or a sweep (``bench report``).

One file, plotly.js inline, no network access needed to open it. Built from the Parquet
results alone. Figures whose data is absent are left out with a note saying why.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_llm.analysis.compare import config_key
from bench_llm.analysis.format import anomaly_text, one_read_text
from bench_llm.analysis.headline import build_headline, capacity_text, margin_text
from bench_llm.analysis.jobs import TIME_METRICS, JobSummary, job_summary
from bench_llm.analysis.kinds import kinds_lines
from bench_llm.analysis.load import load_runs
from bench_llm.analysis.recommend_types import Recommendation
from bench_llm.analysis.report import figures as F
from bench_llm.analysis.report.data import RunView, build_run_view, load_points, read_sweep_tables
from bench_llm.analysis.report.model_error import model_error_html
from bench_llm.analysis.report.page import Section, render_page
from bench_llm.analysis.slo import SLO
from bench_llm.core.files import write_text_atomic
from bench_llm.results.sweep_layout import CELLS_FILE, RECOMMENDATION_FILE, is_sweep

#: Runs that get their own detailed section; beyond this the page lists them in the table only.
MAX_RUN_SECTIONS = 24


@dataclass(frozen=True)
class ReportOptions:
    slo: SLO = SLO()
    title: str | None = None
    max_run_sections: int = MAX_RUN_SECTIONS
    seed: int = 0


@dataclass
class ReportInfo:
    path: Path
    bytes: int
    runs: int
    figures: int
    notes: list[str] = field(default_factory=list)


def build_report(results: Path, out: Path, options: ReportOptions = ReportOptions()) -> ReportInfo:
    results = Path(results)
    runs = load_runs(results)
    views = [build_run_view(r, config_key(r.meta), options.slo, options.seed) for r in runs]
    for v in views:
        if not v.key and results.is_dir():
            rel = Path(v.path).resolve().relative_to(results.resolve()) if Path(v.path).resolve() != results.resolve() else None
            v.label = f"{rel} ({v.run_id})" if rel else v.run_id
    views.sort(key=lambda v: (v.key.split(' / ')[0], v.offered if v.offered is not None else math.inf, v.label))
    for v in views[: options.max_run_sections]:
        v.jobs = job_summary(Path(v.path), options.slo)
    sweep = is_sweep(results)
    sections: list[Section] = []
    top_notes: list[str] = []

    if sweep:
        cells, rec, notes = read_sweep_tables(results)
        top_notes += notes
        sections.append(_sweep_section(cells, rec))
        model = model_error_html(results, cells)  # a simulated sweep: its figures with the model's error
        if model is not None:
            sections.append(Section("Model error", html=model[0]))
        split = _sweep_split_section(results)
        if split is not None:
            sections.append(split)
    sections.append(_runs_table_section(views))

    overview = Section("Across runs")
    by_id = {r.run_id: r for r in runs}
    points = load_points([by_id[v.run_id] for v in views], views, options.slo)
    objectives: dict[str, float] = next((v.summary.slo.objectives for v in views if v.summary.slo), {})
    for name, fig in (
        ("latency-throughput", F.latency_vs_throughput(points)),
        ("goodput-load", F.goodput_vs_load(points, objectives)),
        ("achieved-offered", F.achieved_vs_offered(points)),
    ):
        if fig is not None:
            overview.figures.append((name, fig))
    if not any(v.summary.slo for v in views):
        overview.notes.append("no SLO in the runs and none given (--slo): goodput and SLO attainment omitted")
    if len(points) < 2:
        overview.notes.append(
            "one configuration and load: no latency-throughput curve or Pareto front; achieved vs offered load is shown over time in the run's section"
        )
    sections.append(overview)

    for i, v in enumerate(views):
        if i >= options.max_run_sections:
            top_notes.append(
                f"{len(views) - options.max_run_sections} more runs are summarised in the table only "
                f"(detailed sections are limited to {options.max_run_sections})"
            )
            break
        sections.append(_run_section(i, v))

    title = options.title or f"bench report: {results.name or results}"
    n_figs = sum(len(s.figures) for s in sections)
    page = render_page(title, str(results), sections, top_notes, _dt.datetime.now(_dt.timezone.utc))
    out = write_text_atomic(out, page)  # no temporary file left on a failure
    return ReportInfo(out, out.stat().st_size, len(views), n_figs, top_notes)


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return F.esc(v)


def _table(headers: list[str], rows: list[list[str]], cls: str = "") -> str:
    """Headers and cells must already be escaped."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _headline_html(rec: Recommendation) -> str:
    """The first screen: what to deploy, its capacity per GPU with its interval, the margin over
    the runner-up, the limit and what to verify next (analysis/headline.py, also in the text)."""
    h = build_headline(rec)
    if h is None:
        return (
            '<div class="headline none" id="headline"><h3>No configuration is recommended</h3>'
            f"<p>{F.esc(rec.message)}</p></div>"
        )
    plural = "s" if h.gpus != 1 else ""
    cap = f"{h.capacity_per_gpu:.3g}" if h.capacity_per_gpu is not None else "–"
    rows = [
        ["capacity", F.esc(capacity_text(h)) + (f"; {h.capacity_rps:g} req/s in all" if h.capacity_rps is not None else "")],
        ["margin", F.esc(margin_text(h))],
        ["limited by", f"<b>{F.esc(h.limiting_factor)}</b>: {F.esc(h.diagnosis)}"],
        ["verify next", F.esc(h.verify_next)],
        ["why this one", F.esc(h.message)],
    ]
    return (
        '<div class="headline" id="headline">'
        f'<div class="pick"><span class="label">Recommended</span> <span class="name" id="headline-name">{F.esc(h.name)}</span>'
        f' <span class="gpus">{h.gpus} GPU{plural}</span></div>'
        f'<div class="cap"><span class="value" id="headline-capacity">{cap}</span> req/s per GPU within the SLOs</div>'
        + _table(["", ""], rows, "kv")
        + "</div>"
    )


def _evidence_html(rec: Recommendation) -> str:
    """The evidence (the load the pick was measured at) and the SLOs, as tables."""
    h = build_headline(rec)
    parts = []
    slo = rec.slo
    if slo:
        att = rec.attainment_pct
        rows = [[F.esc(k), F.esc(f"≤ {v:g}")] for k, v in slo.items()]
        if att is not None:
            rows.append(["attainment target", F.esc(f"≥ {att:g}% of requests meet every SLO")])
        if rec.target_rate:
            rows.append(["target load", F.esc(f"{rec.target_rate:g} req/s")])
        parts.append("<div class='box'><h3>SLOs</h3>" + _table(["objective", "bound"], rows, "kv") + "</div>")
    ev = h.evidence.to_json() if h and h.evidence else {}
    if ev:
        labels = [
            ("load", "load"), ("requests", "requests"), ("attainment", "SLO attainment"), ("throughput_rps", "served req/s"),
            ("goodput_rps", "goodput req/s"), ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p90_ms", "TTFT p90 ms"),
            ("tpot_p50_ms", "TPOT p50 ms"), ("tpot_p90_ms", "TPOT p90 ms"), ("e2e_p90_ms", "E2E p90 ms"),
            ("saturated", "saturated"), ("runs", "runs"),
        ]  # fmt: skip
        rows = []
        for key, label in labels:
            if key not in ev or ev[key] is None:
                continue
            v = ev[key]
            text = f"{100 * v:.1f}%" if key == "attainment" and isinstance(v, (int, float)) else _fmt(", ".join(v) if isinstance(v, list) else v)
            rows.append([F.esc(label), text])
        parts.append("<div class='box'><h3>Evidence</h3>" + _table(["", ""], rows, "kv") + "</div>")
    return "<div class='row'>" + "".join(parts) + "</div>" if parts else ""


def _sweep_section(cells: Any, rec: Recommendation | None) -> Section:
    sec = Section("Sweep summary")
    parts = []
    if rec is not None:
        parts.append(_headline_html(rec))
        for wr in rec.workloads.values():
            sep = wr.separation
            if sep:
                parts.append(f"<p>{'Separated' if sep.separated else 'Too close to call'}: {F.esc(sep.text)}</p>")
        for key, title in (("untrustworthy", "UNTRUSTWORTHY (the client could not measure it truthfully)"), ("undecided", "Undecided"), ("unknown", "Unknown")):
            items = [i for wr in rec.workloads.values() for i in getattr(wr, key)]
            if items:
                parts.append(f"<p><b>{F.esc(title)}</b>: " + "; ".join(F.esc(i) for i in items) + "</p>")
        parts.append(_evidence_html(rec))
    else:
        sec.notes.append(f"no {RECOMMENDATION_FILE}: recommendation omitted")
    if cells is not None and len(cells):
        preferred = [
            "cell_id", "status", "engine", "model", "gpu", "gpus", "tp", "pp", "dp", "ep", "dcp", "pcp", "disagg",
            "tuning", "capacity_rps", "capacity_rps_per_gpu", "limiting_factor", "reason",
        ]  # fmt: skip
        cols = [c for c in preferred if c in cells.columns]
        rows = []
        for _, r in cells.iterrows():
            rows.append([_fmt(r[c]) for c in cols])
        parts.append("<h3>Cells</h3>" + _table([F.esc(c) for c in cols], rows, "cells"))
    else:
        sec.notes.append(f"no {CELLS_FILE}: cell table omitted")
    sec.html = "".join(parts)
    return sec


def _sweep_split_section(sweep: Path) -> Section | None:
    """Each cell's TTFT split per load, where the loads kept the engine's spans (None: none did)."""
    from bench_llm.analysis.ttft_split import LABELS, PARTS, sweep_splits

    rows = sweep_splits(sweep)
    if not rows:
        return None
    sec = Section("TTFT split per cell")
    headers = ["cell", "load", "requests", "TTFT mean ms", *(f"{LABELS[p]} ms" for p in PARTS)]
    body = []
    for r in rows:
        cells = [F.esc(r["cell_id"]), F.esc(r["load"]), str(r["requests"]), _fmt(r["ttft_ms"].get("mean"))]
        cells += [_fmt((r["parts_ms"].get(p) or {}).get("mean")) for p in PARTS]
        body.append(cells)
    sec.html = (f"<p>{F.esc(rows[0]['source'].capitalize())}; each part's mean (docs/metrics.md, \"TTFT split\").</p>"
                + _table([F.esc(h) for h in headers], body, "ttft-split-cells"))  # fmt: skip
    return sec


def _runs_table_section(views: list[RunView]) -> Section:
    sec = Section("Runs")
    headers = [
        "run", "configuration", "status", "GPUs", "measured", "failed", "req/s", "output tok/s", "tok/s per GPU",
        "TTFT p50", "TTFT p95", "TPOT p50", "TPOT p95", "ITL p99", "E2E p50", "goodput", "attainment", "fluidity",
    ]  # fmt: skip
    rows = []
    for v in views:
        s = v.summary
        lat, thr, req = s.latency, s.throughput, s.requests
        slo = s.slo
        rows.append(
            [
                f'<a href="#run-{F.esc(v.run_id)}">{F.esc(v.run_id)}</a>',
                F.esc(v.key or "–"),
                F.esc(v.meta.get("status", "?")),
                str(v.gpus),
                str(req.measured),
                str(req.failed),
                _fmt(thr.requests_per_s),
                _fmt(thr.output_tokens_per_s, 0),
                _fmt(thr.output_tokens_per_s / max(v.gpus, 1), 0),
                _fmt(lat["ttft_ms"]["p50"]),
                _fmt(lat["ttft_ms"]["p95"]),
                _fmt(lat["tpot_ms"]["p50"]),
                _fmt(lat["tpot_ms"]["p95"]),
                _fmt(lat["itl_ms"]["p99"]),
                _fmt(lat["e2e_ms"]["p50"]),
                _fmt(slo.goodput_rps) if slo else "–",
                f"{100 * slo.attainment:.1f}%" if slo else "–",
                _fmt(v.smoothness.get("fluidity_mean"), 3),
            ]
        )
    sec.html = "<p class='muted'>Latencies in ms. Goodput: requests meeting every SLO per second; fluidity: docs/metrics.md.</p>" + _table(
        headers, rows, "runs"
    )
    return sec


def _classes_html(rows: list[dict[str, Any]]) -> str:
    """A mixed workload's requests by class: the minority's latency is what the mix hides."""
    if not rows:
        return ""
    head = ["class", "requests", "share", "input tokens (mean)", "TTFT p50", "TTFT p95", "TPOT p50", "TPOT p95", "E2E p50", "SLO met"]
    body = [
        [F.esc(r["class"]), str(r["requests"]), f"{100 * r['share']:.1f}%", _fmt(r["input_tokens_mean"], 0), _fmt(r["ttft_p50_ms"]),
         _fmt(r["ttft_p95_ms"]), _fmt(r["tpot_p50_ms"]), _fmt(r["tpot_p95_ms"]), _fmt(r["e2e_p50_ms"]),
         f"{100 * r['attainment']:.1f}%" if "attainment" in r else "–"]
        for r in rows
    ]  # fmt: skip
    return "<h3>Per class (mix component of each request; latencies in ms)</h3>" + _table(head, body, "classes")


def _jobs_html(s: JobSummary | None) -> str:
    """A run's jobs (sessions or session graphs): what the user of an agent waits for."""
    if s is None or not s.jobs:
        return ""
    keys = [k for k in TIME_METRICS if k in s.metrics] + ["parallelism"]
    pcols = [c for c in s.metrics["job_ms"] if c.startswith("p")]
    body = [[F.esc(k), str(s.metrics[k]["n"]), _fmt(s.metrics[k]["mean"], 2 if k == "parallelism" else 0),
             *(_fmt(s.metrics[k][c], 2 if k == "parallelism" else 0) for c in pcols)] for k in keys]
    facts = [f"{s.jobs} jobs ({s.ok} ok), {s.requests_per_job:.1f} requests per job, {s.jobs_per_s:.3f} jobs/s"]
    if math.isfinite(s.hit_rate):
        facts.append(f"prefix-cache hit rate per job: pooled {100 * s.hit_rate:.1f}%, "
                     f"mean {100 * s.hit_rate_per_job.get('mean', math.nan):.1f}%")
    if s.met is not None:
        lo, hi = s.attainment_interval()
        facts.append(f"job SLO attainment {100 * s.attainment:.1f}% ({s.met}/{s.jobs}; 95% CI {100 * lo:.1f}-{100 * hi:.1f}%)")
    return ("<h3>Jobs (ms; docs/metrics.md, Jobs)</h3><p>" + F.esc("; ".join(facts)) + "</p>"
            + _table(["job metric", "n", "mean", *pcols], body, "jobs"))


def _run_section(i: int, v: RunView) -> Section:
    meta = v.meta
    sec = Section(f"Run {v.label}")
    info = [
        ["run id", F.esc(v.run_id)],
        ["folder", F.esc(v.path)],
        ["engine", F.esc(meta.get("engine"))],
        ["model", F.esc(meta.get("model"))],
        ["status", F.esc(meta.get("status"))],
        ["timestamps", F.esc(meta.get("clock") or "?")],
        ["window", f"{v.summary.window_s:.2f} s"],
    ]
    if v.key:
        info.insert(1, ["configuration", F.esc(v.key)])
    slo = v.summary.slo
    if slo:
        objs = ", ".join(f"{k} ≤ {val:g}" for k, val in slo.objectives.items())
        info.append(["SLO", F.esc(f"{objs}: attainment {100 * slo.attainment:.1f}%, goodput {slo.goodput_rps:.2f} req/s")])
    for e in v.summary.requests.top_errors:
        info.append([f"errors: {F.esc(e['error_type'])}", F.esc(f"{e['count']} x {e['message'] or '(no message)'}")])
    for k, val in v.smoothness.items():
        info.append([F.esc(k), _fmt(val, 3)])
    req = v.summary.requests
    if req.anomalies:
        info.append(["anomalies", F.esc(anomaly_text(req) + ": excluded from every figure (docs/metrics.md, Record invariants)")])
    timing = v.summary.timing
    if not timing.itl_measurable:
        info.append(["ITL / TPOT", F.esc("not measurable: " + one_read_text(timing))])
    for line in kinds_lines(v.summary.kinds or {}):  # structured output, embeddings, tools, images, models
        name, _, text = line.partition(": ")
        info.append([F.esc(name), F.esc(text)])
    for w in v.summary.client.warnings:
        info.append(["warning", F.esc(w)])
    sec.html = (f'<a id="run-{F.esc(v.run_id)}"></a>' + _table(["", ""], info, "kv") + _classes_html(v.classes)
                + _jobs_html(v.jobs))
    for name, fig in (
        ("cdf", F.latency_cdfs(v)),
        ("load-time", F.load_over_time(v)),
        ("ttft-split-requests", F.ttft_split_per_request(v)),
        ("ttft-split", None if v.ttft_parts else F.ttft_split(v)),  # histograms: only without per-request timings
        ("engine-state", F.engine_state(v)),
        ("timeline", F.token_timeline(v)),
    ):
        if fig is not None:
            sec.figures.append((f"run{i}-{name}", fig))
    sec.notes += v.notes
    if not v.ttft_parts and v.server and "ttft_split" not in v.server:
        sec.notes.append("server metrics have no queue/prefill histograms and no request carries timings: TTFT split omitted")
    elif not v.ttft_parts and "ttft_split" in v.server:
        sec.notes.append("TTFT split from the engine's histograms: means per scrape interval, not per request (per-request timings: SGLang --enable-metrics)")
    if v.server and "gauges" not in v.server:
        sec.notes.append("server metrics have no queue/running/KV gauges: engine state omitted")
    return sec
