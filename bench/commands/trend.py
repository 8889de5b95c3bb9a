"""``bench trend STORE``: change points in each gated metric across commits."""

from __future__ import annotations

from pathlib import Path

import click

from bench_llm.analysis.changepoint import MIN_SIZE, P_MAX, WINDOW
from bench_llm.bench.errors import ExitCode, Outcome
from bench_llm.core.errors import BenchError


@click.command("trend")
@click.argument("store", type=click.Path(path_type=Path))
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Gates TOML: its metrics and allowances (default: every stored metric).")
@click.option("--metrics", "metrics_text", help="Comma-separated metrics to analyse (default: the gated ones, else all).")
@click.option("--html", "html_path", type=click.Path(path_type=Path), help="Write the HTML trend page here.")
@click.option("--markdown", "md_path", type=click.Path(path_type=Path), help="Write a Markdown summary (for a CI comment) here.")
@click.option("--p-max", type=float, default=P_MAX, show_default=True,
              help="Significance of a change point (strong pass; docs/reporting.md gives its false-alarm cost).")
@click.option("--min-size", type=int, default=MIN_SIZE, show_default=True, help="Fewest commits on each side of a change point.")
@click.option("--window", type=int, default=WINDOW, show_default=True, help="Commits per window of the change-point search (bounds its cost).")
@click.option("--last", "last", type=int, help="Look back over the last N commits only.")
@click.option("--since", "since", help="Look back over commits of this date (YYYY-MM-DD) or later only.")
@click.option("--permutations", type=int, default=499, show_default=True, help="Permutations of the host-change test.")
@click.option("--min-change-pct", type=float, default=0.0, show_default=True, help="Smallest change flagged for metrics without a gate allowance.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--host-tolerance", type=int, default=1, show_default=True,
              help="A change within this many commits of a same-direction change of the host's event-loop lag is a "
                   "host change, not flagged (-1: never).")
def command(
    store: Path, config_path: Path | None, metrics_text: str | None, html_path: Path | None, md_path: Path | None,
    p_max: float, min_size: int, window: int, last: int | None, since: str | None, permutations: int, min_change_pct: float, seed: int,
    host_tolerance: int,
) -> None:  # fmt: skip
    """Detect change points (E-divisive means) in each metric of each configuration of STORE.

    Flagged: significant and beyond the metric's allowance in --config. Exit code: 0 no
    regression flagged, 1 a regression flagged (so a nightly job can fail on it), 2 bad input
    (README, "Exit codes"). The Markdown is appended to $GITHUB_STEP_SUMMARY when set.
    """
    from bench_llm.analysis.gate import load_gate_config
    from bench_llm.analysis.trend import TrendOptions, html_page, markdown, run_trend, text
    from bench_llm.bench.outputs import write_outputs

    if not 0 < p_max < 1 or permutations < 19 or min_size < 2 or window < 2 * min_size or min_change_pct < 0 or (last is not None and last < 1):
        raise BenchError("need 0 < --p-max < 1, --permutations >= 19, --min-size >= 2, --window >= 2 × --min-size, "
                         "--min-change-pct >= 0, --last >= 1")  # fmt: skip
    try:
        gates = dict(load_gate_config(config_path).metrics) if config_path else {}
        metrics = [m.strip() for m in metrics_text.split(",") if m.strip()] if metrics_text else (list(gates) or None)
        options = TrendOptions(p_max, permutations, min_size, min_change_pct / 100, seed, host_tolerance=host_tolerance,
                               window=window, since=since, last=last)  # fmt: skip
        result = run_trend(store, gates, metrics, options)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    md = markdown(result)
    write_outputs(((md_path, lambda: md), (html_path, lambda: html_page(result))), md)
    click.echo(text(result))
    if result.regressions:
        raise Outcome(ExitCode.REGRESSION)
