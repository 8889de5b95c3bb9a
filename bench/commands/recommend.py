"""``bench recommend SWEEP``: the smallest configuration meeting the SLOs, with its evidence."""

from __future__ import annotations

from pathlib import Path

import click

from bench_llm.core.errors import BenchError


@click.command("recommend")
@click.argument("sweep", type=click.Path(path_type=Path))
@click.option("--slo", "slo_text", help="Re-judge with these SLOs (default: the sweep's), e.g. ttft_ms=500,tpot_ms=50.")
@click.option("--attainment", type=float, help="Percent of requests that must meet every SLO (default: the sweep's).")
@click.option("--target-rate", type=float, help="Load (req/s) the configuration must serve (default: the sweep's).")
@click.option("--target-concurrency", type=int, help="Concurrency it must serve (concurrency sweeps).")
@click.option("--confidence", type=float, help="Confidence of each load's verdict (0: point estimate; default: the sweep's).")
@click.option("--json", "as_json", is_flag=True, help="Print the recommendation and its evidence as JSON.")
def command(
    sweep: Path,
    slo_text: str | None,
    attainment: float | None,
    target_rate: float | None,
    target_concurrency: int | None,
    confidence: float | None,
    as_json: bool,
) -> None:
    """Recommend the smallest configuration of a sweep that meets the SLOs at the target load,
    and say what limits each configuration.

    Reads only the sweep's Parquet files; with --slo the loads are re-judged from their
    request tables (the capacity search's probes stay where the sweep put them).
    Exit code: 0 a configuration meets the SLOs, 3 nothing was measured, 4 none meets them,
    5 the answer rests on a load that could not be measured truthfully (marked UNTRUSTWORTHY).
    """
    from bench_llm.analysis.recommend import recommend
    from bench_llm.analysis.recommend_text import format_recommendation
    from bench_llm.analysis.recommend_types import recommendation_json
    from bench_llm.analysis.slo import SLO
    from bench_llm.bench.outcome import sweep_outcome

    slo = None
    if slo_text is not None:
        slo = SLO.parse(slo_text).as_dict()
    if attainment is not None and not 0 < attainment <= 100:
        raise BenchError("--attainment must be a percentage in (0, 100]")
    if confidence is not None and not 0 <= confidence < 1:
        raise BenchError("--confidence must be in [0, 1), e.g. 0.95")
    rec = recommend(
        sweep, slo=slo, attainment_pct=attainment, target_rate=target_rate,
        target_concurrency=target_concurrency, confidence=confidence,
    )  # fmt: skip
    click.echo(recommendation_json(rec) if as_json else format_recommendation(rec))
    if not as_json:  # a simulated sweep's capacities carry the model's error (issue 36)
        from bench_llm.bench.sweep.model_error import stored_sweep_lines

        for line in stored_sweep_lines(sweep, rec):
            click.echo(line)
    outcome = sweep_outcome(sweep, rec)
    if outcome is not None:
        raise outcome
