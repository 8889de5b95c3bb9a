"""Plotly figures of the report. Each builder returns a figure, or None when its data is absent.

Any text that came from a run (model names, run ids, request ids, configuration keys) is
HTML-escaped before it goes into a figure: plotly renders a subset of HTML in titles, labels
and hover text.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bench_llm.analysis.report.data import LoadPoint, RunView

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")
MARK_SYMBOLS = {"p50": "circle", "p95": "diamond", "p99": "x"}


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _layout(fig: go.Figure, title: str, height: int = 380) -> go.Figure:
    fig.update_layout(
        title={"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 15}},
        height=height,
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        template="plotly_white",
        legend={"orientation": "h", "y": -0.18},
    )
    return fig


def latency_cdfs(view: RunView) -> go.Figure | None:
    names = [n for n in ("TTFT", "TPOT", "ITL", "E2E") if n in view.cdfs]
    if not names:
        return None
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=[f"{n} (ms)" for n in names], horizontal_spacing=0.06)
    for i, name in enumerate(names, start=1):
        c = view.cdfs[name]
        fig.add_trace(
            go.Scatter(x=c["x"], y=c["p"], mode="lines", name=f"{name} CDF", line={"color": COLORS[0]}, showlegend=False,
                       hovertemplate=f"{name} %{{x:.2f}} ms<br>P(≤x) %{{y:.4f}}<extra></extra>"),
            row=1, col=i,
        )  # fmt: skip
        for j, (mark, value) in enumerate(c["marks"].items()):
            q = float(mark[1:]) / 100
            fig.add_trace(
                go.Scatter(x=[value], y=[q], mode="markers+text", text=[f"{mark} {value:.1f}"], textposition="middle left", cliponaxis=False,
                           textfont={"size": 10}, marker={"size": 9, "symbol": MARK_SYMBOLS.get(mark, "circle"), "color": COLORS[1 + j]},
                           name=mark, legendgroup=mark, showlegend=i == 1,
                           hovertemplate=f"{name} {mark} %{{x:.2f}} ms<extra></extra>"),
                row=1, col=i,
            )  # fmt: skip
        fig.update_xaxes(title_text="ms", row=1, col=i)
    fig.update_yaxes(title_text="fraction of requests (ITL: of tokens)", row=1, col=1, range=[0, 1.02])
    return _layout(fig, "Latency distributions (CDF; p50 / p95 / p99 marked)")


def load_over_time(view: RunView) -> go.Figure | None:
    s = view.load_series
    if not s:
        return None
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=s["t_s"], y=s["offered_rps"], name="offered (intended sends/s)", mode="lines", line={"shape": "hv", "color": COLORS[0]}))
    fig.add_trace(go.Scatter(x=s["t_s"], y=s["achieved_rps"], name="achieved (completions/s)", mode="lines", line={"shape": "hv", "color": COLORS[2]}))
    fig.add_trace(
        go.Scatter(x=s["t_s"], y=s["in_flight"], name="in flight (client)", mode="lines", line={"dash": "dot", "color": COLORS[4]}),
        secondary_y=True,
    )
    fig.update_xaxes(title_text="time since first intended send (s)")
    fig.update_yaxes(title_text="requests/s", secondary_y=False)
    fig.update_yaxes(title_text="requests in flight", secondary_y=True)
    return _layout(fig, "Achieved vs offered load over time")


def engine_state(view: RunView) -> go.Figure | None:
    g = view.server.get("gauges")
    if not g:
        return None
    rows = [(k, label) for k, label in (("waiting", "queued (waiting)"), ("running", "running"), ("kv_cache_usage", "KV-cache usage")) if k in g]
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, subplot_titles=[r[1] for r in rows], vertical_spacing=0.08)
    for i, (k, label) in enumerate(rows, start=1):
        fig.add_trace(go.Scatter(x=g[k]["t_s"], y=g[k]["v"], mode="lines", name=label, line={"shape": "hv", "color": COLORS[i - 1]}), row=i, col=1)
        top = max((v for v in g[k]["v"] if v is not None and math.isfinite(v)), default=0.0)
        if k == "kv_cache_usage":  # a share: always 0-100 %, so a near-empty cache reads as such
            fig.update_yaxes(range=[0, max(1.0, top) * 1.02], tickformat=".0%", row=i, col=1)
        else:  # request counts: never below zero, whole numbers, at least 0-1 when idle
            fig.update_yaxes(range=[0, max(1.0, top) * 1.08], rangemode="nonnegative", tick0=0, dtick=max(1, math.ceil(top / 5)), row=i, col=1)
    fig.update_xaxes(title_text="time since first intended send (s)", row=len(rows), col=1)
    return _layout(fig, "Engine state over time (server metrics)", height=170 + 150 * len(rows))


def ttft_split(view: RunView) -> go.Figure | None:
    s = view.server.get("ttft_split")
    if not s:
        return None
    fig = go.Figure()
    if s.get("queue_ms") is not None:
        fig.add_trace(go.Bar(x=s["t_s"], y=s["queue_ms"], name="queue (server, mean per interval)", marker_color=COLORS[4]))
    if s.get("prefill_ms") is not None:
        fig.add_trace(go.Bar(x=s["t_s"], y=s["prefill_ms"], name="prefill (server, mean per interval)", marker_color=COLORS[0]))
    fig.add_trace(go.Scatter(x=s["t_s"], y=s["client_ttft_ms"], name="TTFT (client, mean per interval)", mode="lines+markers", line={"color": COLORS[1]}))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title_text="time since first intended send (s)")
    fig.update_yaxes(title_text="ms")
    o = s["overall_ms"]
    parts = [f"{k} {v:.1f} ms" for k, v in o.items() if isinstance(v, float) and math.isfinite(v)]
    return _layout(fig, "TTFT split into queue and prefill (means: " + esc(", ".join(parts)) + ")")


PART_LABELS = {"ttft": "TTFT (client)", "queue": "queue", "prefill": "prefill", "kv_transfer": "KV transfer",
               "queue_prefill": "queue + prefill: SGLang span, no queue figure",
               "emission": "emission: engine front-end, first token out", "transit": "transit: HTTP, network, client",
               "other": "other: front-end, emission, transit"}  # fmt: skip


def ttft_split_per_request(view: RunView) -> go.Figure | None:
    """Each part of TTFT across requests (boxes: 25-75 %, whiskers 5-95 %, mean dashed), from
    the timings the engine returned with each request."""
    parts = view.ttft_parts
    if not parts:
        return None
    fig = go.Figure()
    for i, (name, s) in enumerate(parts.items()):
        label = PART_LABELS.get(name, name)
        fig.add_trace(go.Box(name=label, x=[label], q1=[s["q1"]], median=[s["median"]], q3=[s["q3"]],
                             lowerfence=[s["p5"]], upperfence=[s["p95"]], mean=[s["mean"]], boxmean=True,
                             marker_color=COLORS[i % len(COLORS)], showlegend=False))  # fmt: skip
    fig.update_yaxes(title_text="ms per request")
    means = ", ".join(f"{PART_LABELS.get(k, k).split(':')[0]} {v['mean']:.1f}" for k, v in parts.items() if k != "ttft")
    n = int(parts["ttft"]["n"]) if "ttft" in parts else 0
    return _layout(fig, esc(f"TTFT split per request, as the engine reported it ({n} requests; means ms: {means})"))


def token_timeline(view: RunView) -> go.Figure | None:
    if not view.timeline:
        return None
    fig = go.Figure()
    for row, r in enumerate(view.timeline):
        color = COLORS[0] if r["ok"] else COLORS[1]
        rid = esc(r["request_id"])
        end = r["end_s"] if r["end_s"] is not None else (r["tokens_s"][-1] if r["tokens_s"] else r["send_s"])
        fig.add_trace(go.Scatter(x=[r["send_s"], end], y=[row, row], mode="lines", line={"color": "#bbbbbb", "width": 2},
                                 showlegend=False, hovertemplate=f"request {rid}<extra></extra>"))  # fmt: skip
        if r["tokens_s"]:
            fig.add_trace(go.Scatter(x=r["tokens_s"], y=[row] * len(r["tokens_s"]), mode="markers", marker={"size": 4, "color": color},
                                     customdata=r["cum_tokens"], showlegend=False,
                                     hovertemplate=f"request {rid}<br>t %{{x:.3f}} s<br>tokens so far %{{customdata}}<extra></extra>"))  # fmt: skip
        fig.add_trace(go.Scatter(x=[r["send_s"]], y=[row], mode="markers", marker={"symbol": "line-ns", "size": 10, "line": {"width": 2, "color": "#444"}},
                                 showlegend=False, hovertemplate=f"request {rid} sent %{{x:.3f}} s<extra></extra>"))  # fmt: skip
    fig.update_xaxes(title_text="time since first intended send (s)")
    fig.update_yaxes(title_text=f"sampled request ({len(view.timeline)} of the run)", showticklabels=False)
    return _layout(fig, "Per-request token timeline (sample: send mark, then one dot per token-carrying chunk)", height=200 + 14 * len(view.timeline))


def _pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated (higher throughput and lower latency is better), by throughput."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (-p[0], p[1])):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return sorted(front)


def _by_config(points: Sequence[LoadPoint]) -> list[tuple[str, list[LoadPoint]]]:
    groups: dict[str, list[LoadPoint]] = {}
    for p in points:
        groups.setdefault(p.config, []).append(p)
    return sorted(groups.items())


def _mode(config: str) -> str:
    """Loads of one configuration form a curve; unrelated plain runs are separate points."""
    return "markers" if config == "run" else "lines+markers"


def latency_vs_throughput(points: Sequence[LoadPoint]) -> go.Figure | None:
    """One point per configuration and load (repeats pooled), one curve per configuration."""
    pts = [p for p in points if p.metrics.get("output_tokens_per_s", 0) > 0]
    if len(pts) < 2:  # one point has no curve and no front to draw
        return None
    panels = (("tpot_p50_ms", "TPOT p50 (ms)"), ("ttft_p95_ms", "TTFT p95 (ms)"))
    fig = make_subplots(rows=1, cols=2, subplot_titles=[p[1] for p in panels], horizontal_spacing=0.08)
    for col, (metric, label) in enumerate(panels, start=1):
        all_points = []
        for gi, (cfg, ps) in enumerate(_by_config(pts)):
            ps = sorted(ps, key=lambda p: p.metrics["output_tokens_per_s"])
            xs = [p.metrics["output_tokens_per_s"] / max(p.gpus, 1) for p in ps]
            ys = [p.metrics[metric] for p in ps]
            text = [esc(f"{p.label} | {p.gpus} GPU(s) | {p.runs} run(s)") for p in ps]
            all_points += [(x, y) for x, y in zip(xs, ys) if math.isfinite(y)]
            fig.add_trace(
                go.Scatter(x=xs, y=ys, mode=_mode(cfg), name=esc(cfg), legendgroup=esc(cfg), showlegend=col == 1,
                           text=text, line={"color": COLORS[gi % len(COLORS)]},
                           hovertemplate="%{text}<br>%{x:.1f} output tok/s per GPU<br>" + label + " %{y:.2f}<extra></extra>"),
                row=1, col=col,
            )  # fmt: skip
        front = _pareto(all_points)
        if front:
            fig.add_trace(
                go.Scatter(x=[p[0] for p in front], y=[p[1] for p in front], mode="lines", name="Pareto front",
                           legendgroup="pareto", showlegend=col == 1, line={"dash": "dash", "color": "#000", "shape": "vh"}),
                row=1, col=col,
            )  # fmt: skip
        fig.update_xaxes(title_text="output tokens/s per GPU", row=1, col=col)
        fig.update_yaxes(title_text=label, row=1, col=col)
    return _layout(fig, "Latency vs throughput per configuration (repeats pooled; Pareto front dashed)", height=430)


def goodput_vs_load(points: Sequence[LoadPoint], objectives: dict[str, float]) -> go.Figure | None:
    pts = [p for p in points if "goodput_rps" in p.metrics]
    if not pts:
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Goodput (req/s meeting every SLO)", "SLO attainment"), horizontal_spacing=0.08)
    for gi, (cfg, ps) in enumerate(_by_config(pts)):
        ps = sorted(ps, key=lambda p: p.offered)
        xs = [p.offered for p in ps]
        color = COLORS[gi % len(COLORS)]
        text = [esc(f"{p.label} | {p.runs} run(s)") for p in ps]
        fig.add_trace(go.Scatter(x=xs, y=[p.metrics["goodput_rps"] for p in ps], mode=_mode(cfg), name=esc(cfg), text=text,
                                 legendgroup=esc(cfg), line={"color": color}), row=1, col=1)  # fmt: skip
        fig.add_trace(go.Scatter(x=xs, y=[100 * p.metrics["slo_attainment"] for p in ps], mode=_mode(cfg), name=esc(cfg), text=text,
                                 legendgroup=esc(cfg), showlegend=False, line={"color": color}), row=1, col=2)  # fmt: skip
    kinds = {p.offered_kind for p in pts}
    xlabel = "offered load (" + ("concurrency" if kinds == {"concurrency"} else "req/s") + ")"
    fig.update_xaxes(title_text=xlabel)
    fig.update_yaxes(title_text="req/s", row=1, col=1)
    fig.update_yaxes(title_text="% of requests", range=[0, 102], row=1, col=2)
    objs = ", ".join(f"{k} ≤ {v:g}" for k, v in objectives.items())
    return _layout(fig, "Goodput and SLO attainment vs load (" + esc(objs) + ")", height=400)


#: Achieved below this share of the asked rate counts as saturated in the chart.
SATURATION_SHARE = 0.9


def achieved_vs_offered(points: Sequence[LoadPoint]) -> go.Figure | None:
    """Completed req/s against the rate asked for; points that fall short are saturated."""
    pts = [p for p in points if p.asked_rps > 0]
    if len(pts) < 2:
        return None
    fig = go.Figure()
    for gi, (cfg, ps) in enumerate(_by_config(pts)):
        ps = sorted(ps, key=lambda p: p.asked_rps)
        fig.add_trace(go.Scatter(x=[p.asked_rps for p in ps], y=[p.metrics["requests_per_s"] for p in ps], mode=_mode(cfg),
                                 text=[esc(p.label) for p in ps], name=esc(cfg), line={"color": COLORS[gi % len(COLORS)]},
                                 hovertemplate="%{text}<br>asked %{x:.2f} req/s<br>achieved %{y:.2f} req/s<extra></extra>"))  # fmt: skip
    sat = [p for p in pts if p.saturated or p.metrics.get("requests_per_s", 0.0) < SATURATION_SHARE * p.asked_rps]
    if sat:
        fig.add_trace(go.Scatter(x=[p.asked_rps for p in sat], y=[p.metrics["requests_per_s"] for p in sat], mode="markers",
                                 name="saturated (achieved < 90 % of asked, or marked by the sweep)", text=[esc(p.label) for p in sat],
                                 marker={"symbol": "x", "size": 13, "color": "#dc2626", "line": {"width": 2}},
                                 hovertemplate="%{text}: saturated<extra></extra>"))  # fmt: skip
    hi = max(max(p.asked_rps for p in pts), max(p.metrics.get("requests_per_s", 0.0) for p in pts))
    fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", name="achieved = offered", line={"dash": "dot", "color": "#888"}))
    fig.update_xaxes(title_text="offered (rate asked for, req/s; closed loop: sent per second)", rangemode="tozero")
    fig.update_yaxes(title_text="achieved (completed req/s)", rangemode="tozero")
    return _layout(fig, "Achieved vs offered load (repeats pooled; saturated loads marked ×)")
