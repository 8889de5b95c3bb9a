"""``bench summary RUN_DIR``: the metric table of a run."""

from __future__ import annotations

from pathlib import Path

import click

from bench_llm.bench.options import parse_percentiles, parse_slo
from bench_llm.core.errors import BenchError


@click.command("summary")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--slo", "slo_text", help="SLOs for goodput, e.g. ttft_ms=500,tpot_ms=50.")
@click.option("--percentiles", "pct_text", default="50,90,95,99", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def command(run_dir: Path, slo_text: str | None, pct_text: str, as_json: bool) -> None:
    """Print the metric table of RUN_DIR (computed from its Parquet files alone)."""
    from bench_llm.bench.report_text import print_summary

    try:
        print_summary(run_dir, parse_slo(slo_text), parse_percentiles(pct_text), as_json)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
