"""Printing a run's summary (shared by ``bench run`` and ``bench summary``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from bench_llm.analysis.format import format_summary
from bench_llm.analysis.jobs import JobSummary, format_jobs, job_summary
from bench_llm.analysis.load import load_run
from bench_llm.analysis.server_metrics import SpecDecodeAcceptance, TtftCrossCheck
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.summary import REQUEST_SCALAR_COLUMNS, SummaryOptions, summarize_run
from bench_llm.analysis.summary_types import RunSummary, json_of


@dataclass(frozen=True, slots=True)
class PrintedSummary:
    """A run's summary with what ``bench summary`` shows beside it. ``run``, ``server``,
    ``ttft_split`` and ``classes`` are JSON payloads (run.parquet's fields, the server's
    metrics with its typed ``ttft_check``, analysis.ttft_split, analysis.classes), kept as such."""

    summary: RunSummary
    run: dict[str, Any]
    server: dict[str, Any] | None = None
    ttft_split: dict[str, Any] | None = None
    classes: list[dict[str, Any]] | None = None
    #: job-level metrics (analysis/jobs.py) when the run's schedule has sessions or graphs
    jobs: JobSummary | None = None

    def to_json(self) -> dict[str, Any]:
        """``bench summary --json``: the summary's fields, then ``run`` and what is present of the rest."""
        out = self.summary.to_json()
        out["run"] = self.run
        for key in ("server", "ttft_split", "classes"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.jobs is not None:
            out["jobs"] = self.jobs.to_json()
        return out


def summary_of(run_dir: Path, slo: SLO, percentiles: tuple[float, ...]) -> tuple[PrintedSummary, str]:
    # per-request columns only (read once, shared with summarize_run, which streams the chunk lists)
    run = load_run(run_dir, list(REQUEST_SCALAR_COLUMNS))
    s = summarize_run(run.path, SummaryOptions(percentiles, slo), run.monitor, run.requests)
    warnings: list[str] = list((run.meta.get("notes") or {}).get("warnings") or [])
    info = {
        "run_id": run.run_id,
        "path": str(run.path),
        "status": run.meta.get("status"),
        "engine": run.meta.get("engine"),
        "model": run.meta.get("model"),
        "clock": run.meta.get("clock"),
        # run-level warnings recorded by the writer (e.g. a distributed worker lost mid-run)
        "warnings": warnings,
    }
    read_path = read_path_share(run.meta)
    if read_path is not None:
        info["read_path"] = read_path
        if read_path["fell_back"]:
            warnings.append(
                f"read path fell back to Python: the adapter's Python parser read {100 * read_path['python_share']:.0f}% "
                f"of {read_path['compiled'] + read_path['python']:,} stream payloads, the compiled scan "
                f"{100 * (1 - read_path['python_share']):.0f}% (client CPU per token is higher; docs/instrument.md)"
            )
    from bench_llm.analysis.classes import class_breakdown, classes_of
    from bench_llm.analysis.server_metrics import server_summary
    from bench_llm.analysis.ttft_split import split_summary
    from bench_llm.results.reader import read_requests

    server = server_summary(run.path, run.requests)
    split = split_summary(run.path)
    classes = None
    if len(classes_of(read_requests(run.path, ["phase", "length_class"]))) > 1:
        classes = class_breakdown(read_requests(run.path), SummaryOptions(percentiles, slo))
    clock = str(run.meta.get("clock") or "?").split(":")[0]  # "kernel: SO_TIMESTAMPNS ..." -> "kernel"
    title = (
        f"run {run.run_id} ({run.meta.get('status')}) engine={run.meta.get('engine')} model={run.meta.get('model')} "
        f"clock={clock}"
    )
    jobs = job_summary(run.path, slo, percentiles)
    return PrintedSummary(s, info, server, split, classes, jobs), title


#: A run "fell back" when the compiled read path was on but the Python parser read more
#: than this share of the stream payloads (each stream's final events are always its).
FALLBACK_SHARE = 0.5


def read_path_share(meta: dict[str, Any]) -> dict[str, Any] | None:
    """Which read path parsed the run's stream payloads (``notes.read_path_payloads``,
    recorded by ``bench run``), and whether the run fell back to Python; None when the
    run did not record it."""
    counts = (meta.get("notes") or {}).get("read_path_payloads") or {}
    compiled, python = int(counts.get("compiled") or 0), int(counts.get("python") or 0)
    if compiled + python == 0:
        return None
    share = python / (compiled + python)
    configured = str((meta.get("adapter") or {}).get("read_path") or "")
    return {
        "configured": configured,
        "compiled": compiled,
        "python": python,
        "python_share": share,
        "fell_back": configured == "compiled" and share > FALLBACK_SHARE,
    }


def _finite(v: float) -> bool:
    return not (math.isnan(v) or math.isinf(v))


def _server_lines(server: dict[str, Any]) -> list[str]:
    """The engine's own view: the TTFT cross-check and its queue/KV gauges."""
    lines = []
    c: TtftCrossCheck | None = server.get("ttft_check")
    if c is not None and c.client_count and all(_finite(v) for v in json_of(c).values() if isinstance(v, float)):
        lo, hi = c.server_p50_bucket_ms
        lines.append(
            f"TTFT cross-check (same window): client p50 {c.client_p50_ms:.2f} ms, mean {c.client_mean_ms:.2f} ms "
            f"(n={c.client_count}) | server histogram p50 {c.server_p50_ms:.2f} ms (bucket {lo:g}-{hi:g} ms), "
            f"mean {c.server_mean_ms:.2f} ms (n={c.server_count:.0f}); p50 diff {100 * c.p50_rel_diff:+.1f}%, "
            f"mean diff {100 * c.mean_rel_diff:+.1f}% ({c.mean_gap_ms:+.2f} ms)"
        )
        lines.append(
            f"  client p50 in the server's buckets {c.client_p50_bucketed_ms:.2f} ms vs server "
            f"{c.server_p50_ms:.2f} ms: {100 * c.p50_rel_diff_bucketed:+.1f}%"
        )
    gauges = [f"{k[:-4]} max {server[k]:.3g}" for k in ("waiting_max", "running_max", "kv_cache_usage_max") if k in server]
    if "prefix_cache_hit_rate" in server:
        hit = server["prefix_cache_hit_rate"]
        gauges.append("prefix-cache hit rate " + ("- (no lookups)" if math.isnan(hit) else f"{100 * hit:.1f}%"))
    if gauges:
        lines.append(f"server metrics ({server.get('scrapes', 0)} scrapes): " + ", ".join(gauges))
    spec: SpecDecodeAcceptance | None = server.get("spec_decode")
    if spec is not None:
        lines.append(_spec_line(spec))
    return lines


def _spec_line(s: SpecDecodeAcceptance) -> str:
    """The engine's speculative-decoding acceptance over the run (docs/metrics.md)."""
    if not s.drafts or not s.draft_tokens:
        return "speculative decoding (engine counters): no drafts verified"
    line = (
        f"speculative decoding (engine counters): acceptance {100 * s.acceptance_rate:.1f}% "
        f"({s.accepted_tokens:,.0f} of {s.draft_tokens:,.0f} draft tokens), {s.accepted_per_step:.3f} accepted per "
        f"verification step over {s.drafts:,.0f} steps (acceptance length {s.acceptance_length:.3f})"
    )
    if s.by_position:
        line += "; reached by position " + " ".join(f"{100 * r:.1f}%" for r in s.by_position)
    if s.chain_acceptance is not None and _finite(s.chain_acceptance):
        line += f"; per draft in a chain {100 * s.chain_acceptance:.1f}% (bench sim serve --spec-accept)"
    return line


def print_summary(run_dir: Path, slo: SLO, percentiles: tuple[float, ...], as_json: bool) -> RunSummary:
    """Print the run's summary (a table, or JSON); returns it."""
    p, title = summary_of(run_dir, slo, percentiles)
    if as_json:
        click.echo(json.dumps(json_of(p.to_json(), finite=True), indent=2, default=str))
        return p.summary
    click.echo(format_summary(p.summary, title))
    for line in _server_lines(p.server or {}):
        click.echo(line)
    if p.classes:
        from bench_llm.analysis.classes import format_breakdown

        for line in format_breakdown(p.classes):
            click.echo(line)
    if p.jobs is not None and p.jobs.jobs:
        for line in format_jobs(p.jobs):
            click.echo(line)
    if p.ttft_split:
        from bench_llm.analysis.ttft_split import format_split

        for line in format_split(p.ttft_split):
            click.echo(line)
    td = p.summary.token_distributions
    if td.method == "histogram":
        click.echo(
            f"note: ITL and chunk-gap percentiles over {td.values:,} values from a histogram "
            f"(within {100 * td.max_relative_error:.4f} % of exact; docs/metrics.md)"
        )
    for warning in p.run["warnings"]:
        click.echo(f"WARNING: {warning}")
    click.echo(f"results: {run_dir}")
    return p.summary
