"""``bench gate``: a CI performance gate that fails on a real regression, not on noise."""

from __future__ import annotations

from pathlib import Path

import click

from bench_llm.bench.errors import ExitCode, Outcome
from bench_llm.core.errors import BenchError


@click.command("gate")
@click.option("--baseline", type=click.Path(path_type=Path), help="Baseline results (run, repeats or sweep).")
@click.option("--history", "store", type=click.Path(path_type=Path), help="Instead of --baseline: a results store (bench history); "
              "each configuration is judged against its last --window entries.")
@click.option("--window", type=int, default=5, show_default=True, help="With --history: entries in the rolling baseline.")
@click.option("--current", type=click.Path(path_type=Path), required=True, help="Current results to judge.")
@click.option("--config", "config_path", type=click.Path(path_type=Path), required=True, help="Gates TOML (see ci/gates.toml).")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path), help="Write JUnit XML here.")
@click.option("--markdown", "md_path", type=click.Path(path_type=Path), help="Write a Markdown summary here.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the full comparison as JSON here.")
def command(
    baseline: Path | None, store: Path | None, window: int, current: Path, config_path: Path,
    junit_path: Path | None, md_path: Path | None, json_path: Path | None,
) -> None:  # fmt: skip
    """Judge CURRENT against BASELINE (or a rolling baseline from a results store, --history)
    with the thresholds in --config.

    A check fails only when its whole bootstrap confidence interval is beyond the threshold.
    Exit code: 0 passed, 1 failed (a regression), 2 bad input (README, "Exit codes").
    The Markdown summary is also appended to $GITHUB_STEP_SUMMARY when that is set.
    """
    from bench_llm.analysis.compare import comparison_json
    from bench_llm.analysis.gate import (
        junit_xml,
        load_gate_config,
        markdown_summary,
        run_gate,
        run_gate_history,
        text_summary,
    )
    from bench_llm.bench.outputs import write_outputs

    if (baseline is None) == (store is None):
        raise BenchError("give exactly one of --baseline and --history")
    try:
        config = load_gate_config(config_path)
        if baseline is not None:
            result = run_gate(baseline, current, config)
        else:
            assert store is not None
            result = run_gate_history(store, current, config, window)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    md = markdown_summary(result)
    write_outputs(((junit_path, lambda: junit_xml(result)), (md_path, lambda: md), (json_path, lambda: comparison_json(result.comparison))), md)
    click.echo(text_summary(result))
    if not result.passed:
        raise Outcome(ExitCode.REGRESSION)
