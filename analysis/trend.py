"""``bench trend``: change points in each gated metric across commits, from a results store.

Every (configuration, metric) series of the store (analysis/history.py, one point per commit)
goes through E-divisive means (analysis/changepoint.py). A significant change point is
*flagged* when its size is beyond the metric's allowance in the gate configuration (the same
``max_increase_pct`` / ``max_decrease`` … rules ``bench gate`` applies, used here as the
smallest change worth acting on); in the worse direction it is a regression, in the better
one an improvement. Significant changes within the allowance are listed, not flagged.

A change of the host is not a change of the code. Every entry also stores the host's
condition during its run (``host_loop_lag_p50_ms``, the client's event-loop lag, see
analysis/history.py). A regression or improvement is a *host change* (listed, not flagged)
when the host's lag changed at the same commit (± ``host_tolerance``) in the same direction
(slower host where the metric got worse, faster where it got better): at least doubled or
halved between the medians of ``min_size + 1`` commits on either side, p ≤ ``host_p_max`` by
a rank-sum permutation test. A run on a busier host slows what it measures (TTFT and throughput by
tens of % on a shared machine) for as long as the load lasts: a level shift the detector is
right to find and the metric alone cannot tell from a regression. Local windows, not a second
E-divisive pass, because a burst of load that comes and goes is the common case, and binary
segmentation finds such a bump poorly. Where no entry has a monitor (runs in virtual time),
nothing is attributed.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bench_llm.analysis.bootstrap import METRICS
from bench_llm.analysis.changepoint import MIN_SIZE, P_MAX, PERMUTATIONS, ChangePoint, e_divisive
from bench_llm.analysis.gate import MetricGate
from bench_llm.analysis.history import HOST_LAG_METRIC, Series, read_series

Verdict = Literal["regression", "improvement", "within allowance", "host change"]


@dataclass(frozen=True)
class TrendOptions:
    p_max: float = P_MAX
    permutations: int = PERMUTATIONS
    min_size: int = MIN_SIZE
    #: Smallest relative change flagged for metrics the gate configuration does not bound.
    min_change: float = 0.0
    seed: int = 0
    #: A change point this many commits or fewer from one of the host's series (same direction)
    #: is attributed to the host; negative: never.
    host_tolerance: int = 1
    #: Significance of a change of the host (looser than ``p_max``: it excuses, never flags).
    host_p_max: float = 0.05
    #: Smallest change of the host's lag that counts (slower over faster median).
    host_min_ratio: float = 2.0


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
    #: the host's change point it coincides with (verdict "host change"), else None
    host: ChangePoint | None = None

    @property
    def flagged(self) -> bool:
        return self.verdict in ("regression", "improvement")


@dataclass(frozen=True)
class TrendResult:
    store: str
    series: tuple[Series, ...]
    findings: tuple[Finding, ...]
    options: TrendOptions
    gates: dict[str, MetricGate] = field(default_factory=dict)
    #: the host's condition per configuration (``host_loop_lag_p50_ms``), where stored
    host_series: tuple[Series, ...] = ()

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


def _host_shift(host: np.ndarray, at: int, worse: bool, options: TrendOptions, rng: np.random.Generator) -> ChangePoint | None:
    """Did the host's condition change at commit ``at`` (± ``host_tolerance``), in the direction
    given (``worse``: lag up)? Local windows of ``min_size + 1`` commits on each side, so a
    burst of load that comes and goes counts as well as a lasting one; the medians must differ
    by ``host_min_ratio`` and a rank-sum permutation test give p ≤ ``host_p_max``.
    Returns the closest such shift (its medians), or None."""
    w = options.min_size + 1
    best: tuple[int, ChangePoint] | None = None
    for i in range(at - options.host_tolerance, at + options.host_tolerance + 1):
        before, after = host[max(0, i - w) : max(0, i)], host[i : i + w]
        before, after = before[np.isfinite(before)], after[np.isfinite(after)]
        if len(before) < 3 or len(after) < 3:
            continue
        b, a = float(np.median(before)), float(np.median(after))
        slow, fast = (a, b) if worse else (b, a)
        if not slow >= options.host_min_ratio * fast or slow <= 0:
            continue
        # rank-sum (Mann-Whitney) statistic, its p-value by permutation: no distribution assumed
        ranks = np.argsort(np.argsort(np.concatenate([before, after]), kind="stable"), kind="stable").astype(float)
        observed = abs(ranks[len(before) :].mean() - ranks[: len(before)].mean())
        shuffled = rng.permuted(np.broadcast_to(ranks, (options.permutations, len(ranks))), axis=1)
        diffs = np.abs(shuffled[:, len(before) :].mean(axis=1) - shuffled[:, : len(before)].mean(axis=1))
        p = float((np.sum(diffs >= observed - 1e-9) + 1) / (options.permutations + 1))
        if p <= options.host_p_max and (best is None or abs(i - at) < best[0]):
            best = (abs(i - at), ChangePoint(i, p, b, a, abs(a - b)))
    return best[1] if best else None


def detect(
    series: Sequence[Series], gates: dict[str, MetricGate], options: TrendOptions = TrendOptions(), host: Sequence[Series] = ()
) -> list[Finding]:
    out = []
    hosts = {h.config_key: {p.commit: p.value for p in h.points} for h in host}
    rng = np.random.default_rng(options.seed)
    for s in series:
        values = s.values
        if len(values) < 2 * options.min_size:
            continue
        for cp in e_divisive(values, options.p_max, options.permutations, options.min_size, 0.0, seed=options.seed):
            verdict, rule = _judge(cp, s.metric, gates.get(s.metric), options.min_change)
            match = None
            lags = hosts.get(s.config_key)
            if verdict != "within allowance" and lags and options.host_tolerance >= 0:
                aligned = np.array([lags.get(p.commit, np.nan) for p in s.points], dtype=float)
                match = _host_shift(aligned, cp.index, verdict == "regression", options, rng)
            p = s.points[cp.index]
            out.append(Finding(s.config_key, s.metric, cp.index, p.commit, p.date, cp, "host change" if match else verdict, rule, match))
    return out


def run_trend(store: Path, gates: dict[str, MetricGate], metrics: Sequence[str] | None, options: TrendOptions = TrendOptions()) -> TrendResult:
    every = read_series(store, None if metrics is None else [*metrics, HOST_LAG_METRIC])
    series = [s for s in every if s.metric != HOST_LAG_METRIC]
    host = [s for s in every if s.metric == HOST_LAG_METRIC]
    return TrendResult(str(store), tuple(series), tuple(detect(series, gates, options, host)), options, dict(gates), tuple(host))


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
    order = {"regression": 0, "improvement": 1, "host change": 2, "within allowance": 3}
    for f in sorted(result.findings, key=lambda f: (order[f.verdict], f.config_key, f.metric, f.index)):
        icon = {"regression": "❌ regression", "improvement": "✅ improvement", "host change": "· host change",
                "within allowance": "· within allowance"}[f.verdict]  # fmt: skip
        c = f.change
        lines.append(
            f"| {icon} | {_md(f.config_key or 'run')} | `{f.metric}` | `{_md(f.commit)}` (#{f.index + 1}) | {f.date} | "
            f"{c.before:.4g} → {c.after:.4g} | {_pct(c.rel_change)} | {c.p_value:.3f} | {_md(f.allowance + _host_note(f))} |"
        )
    if any(f.host is not None for f in result.findings):
        lines += ["", "A *host change* coincides with a change of the host's condition (the client's event-loop lag, "
                      "same direction): what was measured changed, the code need not have. Not flagged."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _host_note(f: Finding) -> str:
    if f.host is None:
        return ""
    return f"; host: event-loop lag {f.host.before:.3g} → {f.host.after:.3g} ms at #{f.host.index + 1}"


def text(result: TrendResult) -> str:
    lines = [f"{len(result.series)} series; {len(result.flagged)} flagged change point(s)"]
    for f in result.findings:
        c = f.change
        lines.append(
            f"{f.verdict.upper():<17} {(f.config_key or 'run'):<24} {f.metric:<20} at #{f.index + 1} {f.commit} ({f.date}): "
            f"{c.before:.4g} -> {c.after:.4g} ({_pct(c.rel_change)}, p={c.p_value:.3f}; allowance {f.allowance}{_host_note(f)})"
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
            color = {"regression": "#dc2626", "improvement": "#16a34a", "host change": "#d97706", "within allowance": "#9ca3af"}[f.verdict]
            fig.add_trace(go.Scatter(x=[x[f.index]], y=[s.values[f.index]], mode="markers", showlegend=False,
                                     marker={"symbol": "x", "size": 14, "color": color, "line": {"width": 2}},
                                     hovertemplate=f"{f.verdict}: {_pct(f.change.rel_change)} (p={f.change.p_value:.3f})<extra></extra>"), row=i, col=1)  # fmt: skip
    fig.update_layout(title={"text": html.escape(key or "run"), "x": 0.01}, height=140 + 170 * len(series), template="plotly_white",
                      margin={"l": 60, "r": 20, "t": 60, "b": 60})  # fmt: skip
    return fig


def html_page(result: TrendResult) -> str:
    from bench_llm.analysis.report.page import Section, render_page

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
