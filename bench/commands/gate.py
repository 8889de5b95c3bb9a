"""``bench gate``: a CI performance gate that fails on a real regression, not on noise."""

from __future__ import annotations

from pathlib import Path

import click

from core.errors import BenchError
from bench.errors import ExitCode, Outcome


@click.command("gate")
@click.option("--baseline", type=click.Path(path_type=Path), required=True, help="Baseline results (run, repeats or sweep).")
@click.option("--current", type=click.Path(path_type=Path), required=True, help="Current results to judge.")
@click.option("--config", "config_path", type=click.Path(path_type=Path), required=True, help="Gates TOML (see ci/gates.toml).")
@click.option("--junit", "junit_path", type=click.Path(path_type=Path), help="Write JUnit XML here.")
@click.option("--markdown", "md_path", type=click.Path(path_type=Path), help="Write a Markdown summary here.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the full comparison as JSON here.")
def command(baseline: Path, current: Path, config_path: Path, junit_path: Path | None, md_path: Path | None, json_path: Path | None) -> None:
    """Judge CURRENT against BASELINE with the thresholds in --config.

    A check fails only when its whole bootstrap confidence interval is beyond the threshold.
    Exit code: 0 passed, 1 failed (a regression), 2 bad input (README, "Exit codes").
    The Markdown summary is also appended to $GITHUB_STEP_SUMMARY when that is set.
    """
    import os

    from analysis.compare import comparison_json
    from analysis.gate import junit_xml, load_gate_config, markdown_summary, run_gate, text_summary
    from core.config import ConfigError
    from results.reader import ResultsError

    try:
        config = load_gate_config(config_path)
        result = run_gate(baseline, current, config)
    except (ConfigError, ResultsError, ValueError) as exc:
        raise BenchError(str(exc)) from None
    md = markdown_summary(result)
    for path, text in ((junit_path, junit_xml(result)), (md_path, md), (json_path, comparison_json(result.comparison))):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as f:
            f.write(md)
    click.echo(text_summary(result))
    if not result.passed:
        raise Outcome(ExitCode.REGRESSION)
