"""``bench trend``: change points in each gated metric across commits, from a results store.

Every (configuration, metric) series of the store (analysis/history.py, one point per commit;
a configuration whose runs measured different workloads, loads or engines is split into one
series per run fingerprint, and a line names the difference) goes through windowed E-divisive
means with a weak and a strong pass (analysis/changepoint.py). A significant change point is
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
from bench_llm.analysis.changepoint import MIN_SIZE, P_MAX, WINDOW, ChangePoint, e_divisive
from bench_llm.analysis.gate import MetricGate
from bench_llm.analysis.history import HOST_LAG_METRIC, Series, load_series

#: Permutations of the host-change test (a rank-sum test on a few commits each side).
PERMUTATIONS = 499

Verdict = Literal["regression", "improvement", "within allowance", "host change"]


@dataclass(frozen=True)
class TrendOptions:
    p_max: float = P_MAX
    permutations: int = PERMUTATIONS  # of the host-change test
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
    #: Points per window of the change-point search (analysis/changepoint.py).
    window: int = WINDOW
    #: Look back only at commits of this date (YYYY-MM-DD) or later / the last N commits.
    since: str | None = None
    last: int | None = None


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
    #: the commits the new level may equally well start at (first, last), 1-based positions and
    #: commits; one commit when the culprit is certain
    span: tuple[int, int] = (0, 0)
    span_commits: tuple[str, str] = ("", "")
    label: str = ""  # configuration, with how its runs differ from the newest ones

    @property
    def flagged(self) -> bool:
        return self.verdict in ("regression", "improvement")

    @property
    def certain(self) -> bool:
        return self.span[0] == self.span[1]

    @property
    def where(self) -> str:
        """The culprit commit, or the commits it is one of while that is not yet certain."""
        if self.certain:
            return f"{self.commit} (#{self.index + 1})"
        (a, b), (ca, cb) = self.span, self.span_commits
        return f"new, commit not yet certain (one of #{a}–#{b}: {ca} … {cb})"


@dataclass(frozen=True)
class TrendResult:
    store: str
    series: tuple[Series, ...]
    findings: tuple[Finding, ...]
    options: TrendOptions
    gates: dict[str, MetricGate] = field(default_factory=dict)
    #: the host's condition per configuration (``host_loop_lag_p50_ms``), where stored
    host_series: tuple[Series, ...] = ()
    #: what the reader should know first: series separated by fingerprint, files skipped,
    #: series too short to judge
    notes: tuple[str, ...] = ()

    @property
    def flagged(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.flagged)

    @property
    def regressions(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.verdict == "regression")


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
    hosts = {(h.config_key, h.fingerprint): {p.commit: p.value for p in h.points} for h in host}
    rng = np.random.default_rng(options.seed)
    for s in series:
        values = s.values
        if len(values) < 2 * options.min_size:
            continue
        for cp in e_divisive(values, options.p_max, options.window, options.min_size):
            verdict, rule = _judge(cp, s.metric, gates.get(s.metric), options.min_change)
            match = None
            lags = hosts.get((s.config_key, s.fingerprint))
            if verdict != "within allowance" and lags and options.host_tolerance >= 0:
                aligned = np.array([lags.get(p.commit, np.nan) for p in s.points], dtype=float)
                match = _host_shift(aligned, cp.index, verdict == "regression", options, rng)
            p = s.points[cp.index]
            lo, hi = cp.span
            out.append(Finding(s.config_key, s.metric, cp.index, p.commit, p.date, cp, "host change" if match else verdict, rule, match,
                               (lo + 1, hi + 1), (s.points[lo].commit, s.points[hi].commit), s.label))  # fmt: skip
    return out


def run_trend(store: Path, gates: dict[str, MetricGate], metrics: Sequence[str] | None, options: TrendOptions = TrendOptions()) -> TrendResult:
    loaded = load_series(store, None if metrics is None else [*metrics, HOST_LAG_METRIC], options.since, options.last)
    series = [s for s in loaded.series if s.metric != HOST_LAG_METRIC]
    host = [s for s in loaded.series if s.metric == HOST_LAG_METRIC]
    notes = list(loaded.notes)
    skipped = loaded.history.skipped_note()
    if skipped:
        notes.append(skipped)
    need = 2 * options.min_size
    short = [s for s in series if len(s.points) < need]
    if not series:
        notes.append(f"no entry to analyse in {store} ({loaded.history.files} metrics file(s) read): add nightly runs with `bench history`")
    elif short:
        have = max(len(s.points) for s in short)
        notes.append(f"{len(short)} of {len(series)} series have too few commits to judge (at most {have}): a change point needs at least "
                     f"{need} commits ({options.min_size} on each side, --min-size); add {need - have} more")  # fmt: skip
    found = detect(series, gates, options, host)
    return TrendResult(str(store), tuple(series), tuple(found), options, dict(gates), tuple(host), tuple(notes))


# -- output ----------------------------------------------------------------------------------

_ORDER = {"regression": 0, "improvement": 1, "host change": 2, "within allowance": 3}
_COLOR = {"regression": "#dc2626", "improvement": "#16a34a", "host change": "#d97706", "within allowance": "#9ca3af"}
#: Flagged series plotted on the page's first screen (the table lists every one).
MAX_FLAGGED_PLOTS = 24


def _pct(v: float) -> str:
    return f"{100 * v:+.1f}%" if math.isfinite(v) else "n/a"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _ordered(findings: Sequence[Finding]) -> list[Finding]:
    """Regressions first (largest first), then improvements, host changes, the rest."""
    return sorted(findings, key=lambda f: (_ORDER[f.verdict], -abs(f.change.rel_change) if math.isfinite(f.change.rel_change) else 0.0,
                                           f.label, f.metric, f.index))  # fmt: skip


def _method(o: TrendOptions) -> str:
    return (f"E-divisive means in windows of {o.window} commits, weak pass then strong pass (t-test on the neighbouring segments, "
            f"p ≤ {o.p_max:g}, segments ≥ {o.min_size} commits)")  # fmt: skip


def headline(result: TrendResult) -> str:
    r, f = len(result.regressions), len(result.flagged)
    if r:
        worst = _ordered(result.regressions)[0]
        at = f"at {worst.where}" if worst.certain else f"({worst.where})"
        return f"{r} regression(s) flagged; worst: {worst.metric} of {worst.label or 'run'} {_pct(worst.change.rel_change)} {at}"
    return f"no regression flagged ({f} improvement(s))"


def markdown(result: TrendResult) -> str:
    """A CI comment: the flagged change points first, then the ones within the allowance."""
    o = result.options
    commits = max((len(s.points) for s in result.series), default=0)
    regress = result.regressions
    lines = [
        f"## Performance trend: {len(regress)} regression(s), {len(result.flagged) - len(regress)} improvement(s)",
        "",
        f"{'❌' if regress else '✅'} {_md(headline(result))}",
        "",
        f"{len(result.series)} series (configuration × metric) over up to {commits} commits in `{_md(result.store)}`. "
        f"Change points by {_method(o)}; flagged when the change exceeds the metric's gate allowance.",
        "",
    ]
    lines += [f"⚠️ {_md(n)}" for n in result.notes]
    if result.notes:
        lines.append("")
    if not result.findings:
        return "\n".join(lines + ["No change point found."]) + "\n"
    lines += ["| verdict | configuration | metric | first commit at new level | date | before → after (median) | change | p | allowance |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for f in _ordered(result.findings):
        icon = {"regression": "❌ regression", "improvement": "✅ improvement", "host change": "· host change",
                "within allowance": "· within allowance"}[f.verdict]  # fmt: skip
        c = f.change
        where = f"`{_md(f.commit)}` (#{f.index + 1})" if f.certain else _md(f.where)
        lines.append(
            f"| {icon} | {_md(f.label or f.config_key or 'run')} | `{f.metric}` | {where} | {f.date} | "
            f"{c.before:.4g} → {c.after:.4g} | {_pct(c.rel_change)} | {c.p_value:.2g} | {_md(f.allowance + _host_note(f))} |"
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
    lines = [f"{len(result.series)} series; {len(result.flagged)} flagged change point(s); {headline(result)}"]
    lines += [f"WARNING: {n}" for n in result.notes]
    for f in _ordered(result.findings):
        c = f.change
        lines.append(
            f"{f.verdict.upper():<17} {(f.label or f.config_key or 'run'):<24} {f.metric:<20} at #{f.index + 1} {f.commit} ({f.date}): "
            f"{c.before:.4g} -> {c.after:.4g} ({_pct(c.rel_change)}, p={c.p_value:.2g}; allowance {f.allowance}{_host_note(f)})"
            + ("" if f.certain else f"; {f.where}")
        )
    return "\n".join(lines)


def _x(s: Series) -> tuple[list[int], list[str]]:
    return list(range(1, len(s.points) + 1)), [f"#{j + 1} {html.escape(p.commit)} ({p.date})" for j, p in enumerate(s.points)]


def _levels(fig: go.Figure, s: Series, mine: Sequence[Finding], row: int | None = None) -> None:
    x, _ = _x(s)
    edges = [0] + sorted(f.index for f in mine) + [len(s.points)]
    for a, b in zip(edges[:-1], edges[1:]):
        if b > a:
            level = float(np.median(s.values[a:b]))
            trace = go.Scatter(x=x[a:b], y=[level] * (b - a), mode="lines", showlegend=False, hoverinfo="skip", line={"color": "#9ca3af", "dash": "dash"})
            fig.add_trace(trace, row=row, col=1) if row else fig.add_trace(trace)


def _flagged_figure(s: Series, finding: Finding, mine: Sequence[Finding]) -> go.Figure:
    """One series with its change marked: the point, the span of commits it may start at,
    the levels between change points."""
    x, hover = _x(s)
    fig = go.Figure()
    lo, hi = finding.span
    fig.add_vrect(x0=lo - 0.5, x1=hi + 0.5, fillcolor=_COLOR[finding.verdict], opacity=0.15, line_width=0)
    fig.add_trace(go.Scatter(x=x, y=s.values, mode="lines+markers", showlegend=False, text=hover,
                             hovertemplate="%{text}<br>%{y:.4g}<extra></extra>", line={"color": "#1f77b4"}))  # fmt: skip
    _levels(fig, s, mine)
    for f in mine:
        fig.add_trace(go.Scatter(x=[f.index + 1], y=[s.values[f.index]], mode="markers", showlegend=False,
                                 marker={"symbol": "x", "size": 14, "color": _COLOR[f.verdict], "line": {"width": 2}},
                                 hovertemplate=f"{f.verdict}: {_pct(f.change.rel_change)} (p={f.change.p_value:.2g})<extra></extra>"))  # fmt: skip
    unit = METRICS[s.metric].unit if s.metric in METRICS else ""
    title = (f"{html.escape(finding.verdict)}: {html.escape(s.metric)} of {html.escape(finding.label or 'run')} "
             f"{_pct(finding.change.rel_change)} at {html.escape(finding.where)}")  # fmt: skip
    fig.update_layout(title={"text": title, "x": 0.01, "font": {"size": 13}}, height=260, template="plotly_white",
                      margin={"l": 60, "r": 20, "t": 40, "b": 40}, xaxis_title="commit #", yaxis_title=html.escape(unit))  # fmt: skip
    return fig


def _figure(key: str, series: list[Series], findings: list[Finding]) -> go.Figure:
    fig = make_subplots(rows=len(series), cols=1, shared_xaxes=True, subplot_titles=[html.escape(s.metric) for s in series],
                        vertical_spacing=min(0.08, 0.5 / max(1, len(series))))  # fmt: skip
    for i, s in enumerate(series, start=1):
        x, hover = _x(s)
        fig.add_trace(go.Scatter(x=x, y=s.values, mode="lines+markers", name=html.escape(s.metric), showlegend=False, text=hover,
                                 hovertemplate="%{text}<br>%{y:.4g}<extra></extra>", line={"color": "#1f77b4"}), row=i, col=1)  # fmt: skip
        mine = [f for f in findings if f.metric == s.metric]
        _levels(fig, s, mine, row=i)
        for f in mine:
            fig.add_trace(go.Scatter(x=[f.index + 1], y=[s.values[f.index]], mode="markers", showlegend=False,
                                     marker={"symbol": "x", "size": 14, "color": _COLOR[f.verdict], "line": {"width": 2}},
                                     hovertemplate=f"{f.verdict}: {_pct(f.change.rel_change)} (p={f.change.p_value:.2g})<extra></extra>"), row=i, col=1)  # fmt: skip
    fig.update_layout(title={"text": html.escape(key or "run"), "x": 0.01}, height=140 + 170 * len(series), template="plotly_white",
                      margin={"l": 60, "r": 20, "t": 60, "b": 60})  # fmt: skip
    return fig


def _rows(findings: Sequence[Finding]) -> str:
    esc = html.escape
    return "".join(
        f"<tr style='background:{_COLOR[f.verdict]}1f'><td style='color:{_COLOR[f.verdict]};font-weight:600'>{esc(f.verdict)}</td>"
        f"<td>{esc(f.label or f.config_key or 'run')}</td><td>{esc(f.metric)}</td><td>{esc(f.where)}</td><td>{esc(f.date)}</td>"
        f"<td>{f.change.before:.4g} → {f.change.after:.4g}</td><td><b>{_pct(f.change.rel_change)}</b></td><td>{f.change.p_value:.2g}</td>"
        f"<td>{esc(f.allowance + _host_note(f))}</td></tr>"
        for f in findings
    )


_HEAD = ("<table><thead><tr><th>verdict</th><th>where</th><th>metric</th><th>first commit at new level</th><th>date</th>"
         "<th>before → after (median)</th><th>change</th><th>p</th><th>allowance</th></tr></thead><tbody>")  # fmt: skip


def html_page(result: TrendResult) -> str:
    """The first screen answers "did anything regress, where, by how much": a coloured
    headline, the flagged change points (regressions first, largest first), a plot of each
    flagged series with the change marked; then the notes, the change points not flagged,
    and every series."""
    from bench_llm.analysis.report.page import Section, render_page

    flagged = _ordered(result.flagged)
    bad = bool(result.regressions)
    color, bg = ("#dc2626", "#fef2f2") if bad else ("#16a34a", "#f0fdf4")
    top = Section("Did anything regress?")
    top.html = (
        f"<div style='border-left:6px solid {color};background:{bg};padding:8px 14px;margin-bottom:10px'>"
        f"<div style='font-size:22px;font-weight:700;color:{color}'>{'❌' if bad else '✅'} {html.escape(headline(result))}</div>"
        f"<div class='muted'>{len(result.series)} series over up to {max((len(s.points) for s in result.series), default=0)} commits. "
        f"{html.escape(_method(result.options))}; flagged when beyond the gate allowance. "
        "Shaded: the commits the change may start at; dashed: the level between change points.</div></div>"
        + (_HEAD + _rows(flagged) + "</tbody></table>" if flagged else "")
    )
    top.notes = list(result.notes)
    by_series = {(s.label, s.metric): s for s in result.series}
    for i, f in enumerate(flagged[:MAX_FLAGGED_PLOTS]):
        s = by_series.get((f.label, f.metric))
        if s is not None:
            mine = [g for g in result.findings if g.label == f.label and g.metric == f.metric]
            top.figures.append((f"flagged-{i}", _flagged_figure(s, f, mine)))
    if len(flagged) > MAX_FLAGGED_PLOTS:
        top.notes.append(f"{len(flagged) - MAX_FLAGGED_PLOTS} more flagged change point(s) in the table, plotted below with their configuration")
    sections = [top]
    rest = _ordered([f for f in result.findings if not f.flagged])
    if rest:
        other = Section(f"Change points not flagged ({len(rest)})")
        other.html = f"<details><summary>host changes and changes within the allowance</summary>{_HEAD}{_rows(rest)}</tbody></table></details>"
        sections.append(other)
    by_key: dict[str, list[Series]] = {}
    for s in result.series:
        by_key.setdefault(s.label, []).append(s)
    for key, group in sorted(by_key.items()):
        sec = Section(f"Configuration {key}")
        sec.figures.append((f"trend-{len(sections)}", _figure(key, group, [f for f in result.findings if f.label == key])))
        sections.append(sec)
    return render_page(f"bench trend: {Path(result.store).name}", result.store, sections, [], _dt.datetime.now(_dt.timezone.utc))
