"""``bench compare A B``: each metric's change with a bootstrap confidence interval."""

from __future__ import annotations

from pathlib import Path

import click

from bench_llm.core.errors import BenchError


def parse_metrics(text: str | None) -> tuple[str, ...]:
    from bench_llm.analysis.bootstrap import DEFAULT_COMPARE_METRICS, METRICS

    if not text:
        return DEFAULT_COMPARE_METRICS
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    for m in names:
        if m not in METRICS:
            raise BenchError(f"--metrics: unknown metric {m!r} (known: {', '.join(METRICS)})")
    return names


@click.command("compare")
@click.argument("baseline", type=click.Path(path_type=Path))
@click.argument("current", type=click.Path(path_type=Path))
@click.option("--metrics", "metrics_text", help="Comma-separated metric names (default: the main latency, smoothness and rate metrics).")
@click.option("--slo", "slo_text", help="SLOs for goodput/attainment and fluidity deadlines, e.g. ttft_ms=500,tpot_ms=50.")
@click.option("--level", type=float, default=0.95, show_default=True, help="Confidence level of the intervals.")
@click.option("--resamples", type=int, default=1000, show_default=True, help="Bootstrap resamples.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--resampling",
    type=click.Choice(["auto", "stratified", "hierarchical"]),
    default="auto",
    show_default=True,
    help="Repeats: resample requests within each run (stratified), or runs then requests (hierarchical; auto when both sides have >= 3 runs).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def command(
    baseline: Path,
    current: Path,
    metrics_text: str | None,
    slo_text: str | None,
    level: float,
    resamples: int,
    seed: int,
    resampling: str,
    as_json: bool,
) -> None:
    """Compare CURRENT against BASELINE (run folders, folders of repeats, or sweeps).

    Every metric is computed on the pooled requests of each side's repeats; its change gets a
    percentile bootstrap interval (requests resampled in blocks of concurrent requests) and
    is marked significant when the interval of the difference excludes zero.
    """
    from bench_llm.analysis.bootstrap import BootstrapOptions
    from bench_llm.analysis.compare import compare_paths, comparison_json, format_comparison
    from bench_llm.bench.options import parse_slo

    try:
        options = BootstrapOptions(level=level, resamples=resamples, seed=seed, resampling=resampling)  # type: ignore[arg-type]
        cmp = compare_paths(baseline, current, parse_metrics(metrics_text), parse_slo(slo_text), options)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    # job-level figures (analysis/jobs.py), when both sides are one run with jobs
    from bench_llm.analysis.jobs import format_job_changes, job_changes

    jobs = job_changes(baseline, current, level=level, resamples=min(resamples, 1000), seed=seed)
    if as_json:
        import dataclasses
        import json

        out = json.loads(comparison_json(cmp))
        if jobs:
            out["jobs"] = [{k: (None if isinstance(v, float) and v != v else v) for k, v in dataclasses.asdict(c).items()}
                           for c in jobs]  # (NaN is not JSON)
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(format_comparison(cmp))
    for line in format_job_changes(jobs):
        click.echo(line)
