"""``bench trend``: change points in each gated metric across commits, from a results store.

Every (configuration, metric) series of the store (analysis/history.py, one point per commit)
goes through E-divisive means (analysis/changepoint.py). A significant change point is
*flagged* when its size is beyond the metric's allowance in the gate configuration (the same
``max_increase_pct`` / ``max_decrease`` … rules ``bench gate`` applies, used here as the
smallest change worth acting on); in the worse direction it is a regression, in the better
one an improvement. Significant changes within the allowance are listed, not flagged.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analysis.bootstrap import METRICS
from analysis.changepoint import MIN_SIZE, P_MAX, PERMUTATIONS, ChangePoint, e_divisive
from analysis.gate import MetricGate
from analysis.history import Series, read_series

Verdict = Literal["regression", "improvement", "within allowance"]


@dataclass(frozen=True)
class TrendOptions:
    p_max: float = P_MAX
    permutations: int = PERMUTATIONS
    min_size: int = MIN_SIZE
    #: Smallest relative change flagged for metrics the gate configuration does not bound.
    min_change: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class Finding:
    config_key: str
    metric: str
    index: int  # position of the first point of the new level in the series
    commit: str  # first commit at the new level
    date: str
    change: ChangePoint
    verdict: Verdict
    allowance: str  # the rule the size was judged against

    @property
    def flagged(self) -> bool:
        return self.verdict != "within allowance"


@dataclass(frozen=True)
class TrendResult:
    store: str
    series: tuple[Series, ...]
    findings: tuple[Finding, ...]
    options: TrendOptions
    gates: dict[str, MetricGate] = field(default_factory=dict)

    @property
    def flagged(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.flagged)


def _judge(cp: ChangePoint, metric: str, gate: MetricGate | None, min_change: float) -> tuple[Verdict, str]:
    """Is the change beyond the allowance, and in which direction?"""
    spec = METRICS.get(metric)
    worse = (cp.after > cp.before) == (spec is None or spec.better == "lower")
    rel, diff = abs(cp.rel_change), abs(cp.after - cp.before)
    limits: list[tuple[str, bool]] = []
    if gate is not None:
        pct = gate.max_increase_pct if (spec is None or spec.better == "lower") else gate.max_decrease_pct
        absolute = gate.max_increase if (spec is None or spec.better == "lower") else gate.max_decrease
        if pct is not None:
            limits.append((f"{pct:g}%", rel > pct / 100))
        if absolute is not None:
            limits.append((f"{absolute:g} absolute", diff > absolute))
    if not limits:
        limits.append((f"{100 * min_change:g}%", rel >= min_change and rel > 0))
    beyond = any(b for _, b in limits)
    rule = " or ".join(t for t, _ in limits)
    if not beyond:
        return "within allowance", rule
    return ("regression" if worse else "improvement"), rule


def detect(series: Sequence[Series], gates: dict[str, MetricGate], options: TrendOptions = TrendOptions()) -> list[Finding]:
    out = []
    for s in series:
        values = s.values
        if len(values) < 2 * options.min_size:
            continue
        for cp in e_divisive(values, options.p_max, options.permutations, options.min_size, 0.0, seed=options.seed):
            verdict, rule = _judge(cp, s.metric, gates.get(s.metric), options.min_change)
            p = s.points[cp.index]
            out.append(Finding(s.config_key, s.metric, cp.index, p.commit, p.date, cp, verdict, rule))
    return out


def run_trend(store: Path, gates: dict[str, MetricGate], metrics: Sequence[str] | None, options: TrendOptions = TrendOptions()) -> TrendResult:
    series = read_series(store, metrics)
    return TrendResult(str(store), tuple(series), tuple(detect(series, gates, options)), options, dict(gates))


# -- output ----------------------------------------------------------------------------------


def _pct(v: float) -> str:
    return f"{100 * v:+.1f}%" if math.isfinite(v) else "n/a"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(result: TrendResult) -> str:
    """A CI comment: the flagged change points first, then the ones within the allowance."""
    o = result.options
    commits = max((len(s.points) for s in result.series), default=0)
    regress = [f for f in result.findings if f.verdict == "regression"]
    lines = [
        f"## Performance trend: {len(regress)} regression(s), {len(result.flagged) - len(regress)} improvement(s)",
        "",
        f"{len(result.series)} series (configuration × metric) over up to {commits} commits in `{_md(result.store)}`. "
        f"Change points by E-divisive means (permutation test, p ≤ {o.p_max:g}, {o.permutations} permutations, "
        f"segments ≥ {o.min_size} commits); flagged when the change exceeds the metric's gate allowance.",
        "",
    ]
    if not result.findings:
        return "\n".join(lines + ["No change point found."]) + "\n"
    lines += ["| verdict | configuration | metric | first commit at new level | date | before → after (median) | change | p | allowance |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    order = {"regression": 0, "improvement": 1, "within allowance": 2}
    for f in sorted(result.findings, key=lambda f: (order[f.verdict], f.config_key, f.metric, f.index)):
        icon = {"regression": "❌ regression", "improvement": "✅ improvement", "within allowance": "· within allowance"}[f.verdict]
        c = f.change
        lines.append(
            f"| {icon} | {_md(f.config_key or 'run')} | `{f.metric}` | `{_md(f.commit)}` (#{f.index + 1}) | {f.date} | "
            f"{c.before:.4g} → {c.after:.4g} | {_pct(c.rel_change)} | {c.p_value:.3f} | {_md(f.allowance)} |"
        )
    return "\n".join(lines) + "\n"


def text(result: TrendResult) -> str:
    lines = [f"{len(result.series)} series; {len(result.flagged)} flagged change point(s)"]
    for f in result.findings:
        c = f.change
        lines.append(
            f"{f.verdict.upper():<17} {(f.config_key or 'run'):<24} {f.metric:<20} at #{f.index + 1} {f.commit} ({f.date}): "
            f"{c.before:.4g} -> {c.after:.4g} ({_pct(c.rel_change)}, p={c.p_value:.3f}; allowance {f.allowance})"
        )
    return "\n".join(lines)


def _figure(key: str, series: list[Series], findings: list[Finding]) -> go.Figure:
    fig = make_subplots(rows=len(series), cols=1, shared_xaxes=True, subplot_titles=[html.escape(s.metric) for s in series],
                        vertical_spacing=min(0.08, 0.5 / max(1, len(series))))  # fmt: skip
    for i, s in enumerate(series, start=1):
        x = [f"#{j + 1} {p.commit[:10]}" for j, p in enumerate(s.points)]
        fig.add_trace(go.Scatter(x=x, y=s.values, mode="lines+markers", name=html.escape(s.metric), showlegend=False,
                                 text=[f"{p.date} {html.escape(p.commit)} ({p.entries} entr{'y' if p.entries == 1 else 'ies'})" for p in s.points],
                                 hovertemplate="%{text}<br>%{y:.4g}<extra></extra>", line={"color": "#1f77b4"}), row=i, col=1)  # fmt: skip
        mine = [f for f in findings if f.metric == s.metric]
        edges = [0] + [f.index for f in mine] + [len(s.points)]
        for a, b in zip(edges[:-1], edges[1:]):
            level = float(sorted(s.values[a:b])[(b - a) // 2]) if b > a else math.nan
            fig.add_trace(go.Scatter(x=x[a:b], y=[level] * (b - a), mode="lines", showlegend=False, hoverinfo="skip",
                                     line={"color": "#9ca3af", "dash": "dash"}), row=i, col=1)  # fmt: skip
        for f in mine:
            color = {"regression": "#dc2626", "improvement": "#16a34a", "within allowance": "#9ca3af"}[f.verdict]
            fig.add_trace(go.Scatter(x=[x[f.index]], y=[s.values[f.index]], mode="markers", showlegend=False,
                                     marker={"symbol": "x", "size": 14, "color": color, "line": {"width": 2}},
                                     hovertemplate=f"{f.verdict}: {_pct(f.change.rel_change)} (p={f.change.p_value:.3f})<extra></extra>"), row=i, col=1)  # fmt: skip
    fig.update_layout(title={"text": html.escape(key or "run"), "x": 0.01}, height=140 + 170 * len(series), template="plotly_white",
                      margin={"l": 60, "r": 20, "t": 60, "b": 60})  # fmt: skip
    return fig


def html_page(result: TrendResult) -> str:
    from analysis.report import Section
    from analysis.report.page import render_page

    flagged = Section("Flagged change points")
    rows = "".join(
        f"<tr><td>{html.escape(f.verdict)}</td><td>{html.escape(f.config_key or 'run')}</td><td>{html.escape(f.metric)}</td>"
        f"<td>#{f.index + 1} {html.escape(f.commit)}</td><td>{html.escape(f.date)}</td>"
        f"<td>{f.change.before:.4g} → {f.change.after:.4g}</td><td>{_pct(f.change.rel_change)}</td><td>{f.change.p_value:.3f}</td></tr>"
        for f in result.findings
    )
    flagged.html = (
        "<p class='muted'>E-divisive means (permutation test, p ≤ "
        f"{result.options.p_max:g}); flagged when beyond the gate allowance. Dashed: the level between change points.</p>"
        "<table><thead><tr><th>verdict</th><th>configuration</th><th>metric</th><th>first commit at new level</th><th>date</th>"
        "<th>before → after</th><th>change</th><th>p</th></tr></thead><tbody>"
        + (rows or "<tr><td colspan='8'>no change point</td></tr>")
        + "</tbody></table>"
    )
    sections = [flagged]
    by_key: dict[str, list[Series]] = {}
    for s in result.series:
        by_key.setdefault(s.config_key, []).append(s)
    for key, group in sorted(by_key.items()):
        sec = Section(f"Configuration {key or 'run'}")
        sec.figures.append((f"trend-{len(sections)}", _figure(key, group, [f for f in result.findings if f.config_key == key])))
        sections.append(sec)
    return render_page(f"bench trend: {Path(result.store).name}", result.store, sections, [], _dt.datetime.now(_dt.timezone.utc))
