"""``bench workload``: list the built-in workloads, show a workload's statistics and histogram."""

from __future__ import annotations

import html
import json
from pathlib import Path

import click

from bench_llm.core.errors import BenchError


@click.group("workload")
def command() -> None:
    """Inspect workloads: built-in names, TOML workload files, trace files (CSV/JSONL)."""


@command.command("list")
def list_cmd() -> None:
    """The built-in workloads and what they are."""
    from bench_llm.workloads.definition import builtins

    for name, wd in builtins().items():
        src = wd.source.get("licence")
        click.echo(f"{name:22s} {wd.description}" + (f" [{src}]" if src else ""))


@command.command("show")
@click.argument("ref")
@click.option("--requests", "n_requests", type=int, help="Requests to plan (default 1000; a trace file: all its rows).")
@click.option("--rate", type=float, help="Open loop: mean requests/s (default: the workload's own, else 1).")
@click.option("--arrival", help="Arrival process (poisson, gamma:cv=2, constant, onoff:..., ramp:..., steps:..., trace).")
@click.option("--concurrency", type=int, help="Closed loop instead (no arrival times).")
@click.option("--warmup", type=int, default=0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--time-scale", type=float, default=1.0, show_default=True, help="Trace replay: multiply timestamps.")
@click.option("--html", "html_path", type=click.Path(path_type=Path),
              help="Also write a histogram of lengths and arrivals to this HTML file (its folder must exist).")
@click.option("--no-html", is_flag=True, hidden=True, help="No histogram (the default: written only with --html).")
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
def show_cmd(
    ref: str,
    n_requests: int | None,
    rate: float | None,
    arrival: str | None,
    concurrency: int | None,
    warmup: int,
    seed: int,
    time_scale: float,
    html_path: Path | None,
    no_html: bool,
    as_json: bool,
) -> None:
    """Print summary statistics of workload REF (with --html, also a histogram of its lengths
    and arrivals).

    \b
    Examples:
      bench workload show chat --rate 5 --html chat.html
      bench workload show ../traces/conversation_trace.jsonl --requests 2000
      bench workload show my-workload.toml --json
    """
    from bench_llm.workloads.builder import MAX_REQUESTS, plan_workload
    from bench_llm.workloads.catalog import resolve
    from bench_llm.workloads.errors import WorkloadError
    from bench_llm.workloads.stats import plan_summary

    if html_path is not None and not no_html and not html_path.parent.is_dir():
        raise BenchError(f"--html {html_path}: folder {html_path.parent} does not exist")
    wd = resolve(ref, time_scale=time_scale)
    if n_requests is None:
        n_requests = MAX_REQUESTS if wd.trace is not None else 1000
    if rate is None and concurrency is None and wd.rate is None and wd.concurrency is None and wd.trace is None:
        if arrival is None or not arrival.startswith(("ramp", "steps")):
            rate = 1.0
    try:
        plan = plan_workload(
            wd, requests=n_requests, rate=rate, arrival=arrival, concurrency=concurrency, warmup=warmup, seed=seed
        )
    except WorkloadError as exc:
        if exc.code != "no_timestamps" or rate is not None or concurrency is not None:
            raise
        rate = 1.0  # a length-only table: show it with Poisson arrivals at 1 req/s
        plan = plan_workload(
            wd, requests=n_requests, rate=rate, arrival=arrival, concurrency=concurrency, warmup=warmup, seed=seed
        )
    summary = plan_summary(plan)
    summary["description"] = wd.description
    summary["source"] = wd.source
    if html_path is not None and not no_html:
        write_histogram(plan, html_path)
        summary["html"] = str(html_path)
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    click.echo(format_summary(summary))


def format_summary(s: dict[str, object]) -> str:
    lines = [f"workload {s['name']}" + (f" - {s['description']}" if s.get("description") else "")]
    src = s.get("source") or {}
    if isinstance(src, dict) and src:
        main = src.get("source") or src.get("file") or src.get("short")
        lines.append(f"source: {main}" + (f" (licence {src['licence']})" if src.get("licence") else ""))
    load = f"closed loop, concurrency {s['concurrency']}" if s["mode"] == "closed" else f"open loop, arrival {s['arrival']}"
    if s.get("rate"):
        load += f", rate {s['rate']:g} {'jobs/s' if s.get('graph') else 'req/s'}"
    lines.append(f"requests {s['requests']} (+{s['warmup']} warm-up), seed {s['seed']}, {load}")
    cols = ("mean", "p5", "p25", "p50", "p75", "p95", "p99", "max")
    lines.append(f"{'':15s}" + "".join(f"{c:>9s}" for c in cols))
    for key, label in (("input_tokens", "input tokens"), ("output_tokens", "output tokens")):
        row = s[key]
        assert isinstance(row, dict)
        lines.append(f"{label:15s}" + "".join(_cell(row.get(c)) for c in cols))
    arr = s.get("arrivals")
    if isinstance(arr, dict) and arr.get("count", 0) >= 2:
        what = "job arrivals" if s.get("graph") else "session starts" if s.get("sessions") else "send times"
        unit = "jobs/s" if s.get("graph") else "req/s"
        lines.append(
            f"arrivals: {arr['count']} {what} over {arr['span_s']:.1f} s, mean rate {arr['mean_rate']:.3f} {unit}, "
            f"inter-arrival CV {arr['gap_cv']:.2f}, longest gap {arr['max_gap_s']:.2f} s"
        )
    pg = s.get("prefix_groups")
    if isinstance(pg, dict):
        shares = ", ".join(f"{k} {v:.1%}" for k, v in pg["shares"].items())
        lines.append(f"shared prefixes of {pg['tokens']} tokens: {shares}; none {pg['none']:.1%}")
    gs = s.get("graph")
    if isinstance(gs, dict):  # session graphs (docs/workloads.md): rates are jobs/s, input tokens new tokens
        d, pt = gs["delay_s"], gs["prompt_tokens"]
        lines.append(
            f"jobs: {gs['jobs']} ({gs['requests_per_job']:.1f} requests each; --rate is jobs/s); {gs['joins']:.1%} of "
            f"requests join several predecessors, {gs['fresh']:.1%} start a fresh conversation; edge delays mean "
            f"{d['mean']:.2f} s, p50 {d['p50']:.2f} s, p95 {d['p95']:.2f} s"
        )
        lines.append(
            f"whole prompts (context + new tokens above): mean {pt['mean']:,.0f}, p50 {pt['p50']:,.0f}, "
            f"p95 {pt['p95']:,.0f}, max {pt['max']:,} tokens"
        )
    ss = s.get("sessions")
    if isinstance(ss, dict) and not isinstance(gs, dict):
        lines.append(
            f"sessions: {ss['count']}, {ss['turns_mean']:.2f} turns on average, mean think time {ss['think_s_mean']:.2f} s"
        )
    tr = s.get("trace")
    if isinstance(tr, dict):
        t = f"trace: {tr['path']} ({tr['format']}, {tr['rows']} rows"
        t += f", {tr['dropped']} failed rows dropped)" if tr.get("dropped") else ")"
        if "prefix_reuse_tokens" in tr:
            t += f"; reusable prefix {float(tr['prefix_reuse_tokens']):.1%} of input tokens (infinite cache)"
        lines.append(t)
    if s.get("html"):
        lines.append(f"histogram: {s['html']}")
    return "\n".join(lines)


def _cell(v: object) -> str:
    """A statistic in its column, blank where there is none (never ``nan``)."""
    if not isinstance(v, (int, float)) or v != v:
        return f"{'-':>9s}"
    return f"{v:9.0f}"


def write_histogram(plan: object, path: Path) -> None:
    """Input and output length histograms and arrivals per second, one self-contained HTML file."""
    import numpy as np
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from bench_llm.workloads.builder import Plan

    assert isinstance(plan, Plan)
    fig = make_subplots(
        rows=3, cols=1, subplot_titles=("input tokens", "output tokens", "arrivals per second"), vertical_spacing=0.09
    )
    fig.add_trace(go.Histogram(x=plan.input_tokens, nbinsx=80, name="input tokens"), row=1, col=1)
    fig.add_trace(go.Histogram(x=plan.output_tokens, nbinsx=80, name="output tokens"), row=2, col=1)
    if plan.offsets_s is not None:
        t = plan.offsets_s[~np.isnan(plan.offsets_s)]
        fig.add_trace(go.Histogram(x=t, xbins={"size": 1.0}, name="requests per 1 s"), row=3, col=1)
        fig.update_xaxes(title_text="seconds from start", row=3, col=1)
    else:
        fig.add_annotation(text="closed loop: no send times", row=3, col=1, showarrow=False)
    fig.update_xaxes(title_text="tokens", row=1, col=1)
    fig.update_xaxes(title_text="tokens", row=2, col=1)
    title = f"workload {plan.name}: {len(plan)} requests, seed {plan.seed}"
    fig.update_layout(title_text=html.escape(title), showlegend=False, height=900, bargap=0.02)
    from bench_llm.core.files import write_text_atomic

    write_text_atomic(path, fig.to_html(include_plotlyjs=True, full_html=True))
