"""``bench report RESULTS -o report.html``: one self-contained HTML file."""

from __future__ import annotations

from pathlib import Path

import click

from bench_llm.core.errors import BenchError


@click.command("report")
@click.argument("results", type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), default=Path("report.html"), show_default=True, help="HTML file to write.")
@click.option("--slo", "slo_text", help="SLOs for goodput/attainment (default: the SLO each run was measured with).")
@click.option("--title", help="Page title.")
@click.option("--max-run-sections", type=int, default=24, show_default=True, help="Runs that get a detailed section.")
def command(results: Path, out: Path, slo_text: str | None, title: str | None, max_run_sections: int) -> None:
    """Write a self-contained, offline HTML report of RESULTS (a run, a folder of runs, or a sweep).

    Per-request views are sampled and distributions reduced to quantiles, so the file stays
    a few MB (mostly plotly.js) whatever the number of requests.
    """
    from bench_llm.analysis.report import ReportOptions, build_report
    from bench_llm.bench.options import parse_slo

    if max_run_sections < 0:
        raise BenchError("--max-run-sections must be >= 0")
    try:
        info = build_report(results, out, ReportOptions(slo=parse_slo(slo_text), title=title, max_run_sections=max_run_sections))
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    click.echo(f"wrote {info.path} ({info.bytes / 1e6:.2f} MB, {info.runs} run(s), {info.figures} figures)")
    for n in info.notes:
        click.echo(f"note: {n}", err=True)
