"""``bench history RESULTS --store STORE``: add a run (or sweep) to a results store."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import click

from bench_llm.bench.errors import ExitCode, Outcome, too_few_succeeded
from bench_llm.core.errors import BenchError


def _git_commit() -> str | None:
    """The commit being measured: $GITHUB_SHA on GitHub Actions, else the working copy's HEAD."""
    sha = os.environ.get("GITHUB_SHA")
    if sha:
        return sha[:12]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


@click.command("history")
@click.argument("results", type=click.Path(path_type=Path))
@click.option("--store", type=click.Path(path_type=Path), required=True, help="Results store folder (created if absent).")
@click.option("--commit", help="Commit measured (default: $GITHUB_SHA, else git HEAD of the current folder).")
@click.option("--date", "date_text", help="Date to file the run under, YYYY-MM-DD (default: the run's start, UTC).")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Gates TOML: store its metrics (and SLO) too.")
@click.option("--slo", "slo_text", help="SLOs for goodput_rps / slo_attainment, e.g. ttft_ms=500,tpot_ms=50.")
def command(results: Path, store: Path, commit: str | None, date_text: str | None, config_path: Path | None, slo_text: str | None) -> None:
    """Add RESULTS (a run, repeats, or a sweep) to the results store STORE.

    Each configuration becomes one entry: its metrics in STORE/metrics/date=…/commit=…/config=…/
    (one Parquet dataset for DuckDB, pandas, Polars, Spark; docs/results.md) and a copy of its
    run folders under STORE/runs/ (for `bench gate --history`), with what it measured (workload,
    load, engine: its fingerprint), so that only like is compared with like.

    A configuration whose requests (nearly) all failed is refused, never stored: it would be a
    baseline. Exit code 0 when everything was added, 3 when something was refused.
    """
    from bench_llm.analysis.gate import load_gate_config
    from bench_llm.analysis.history import DEFAULT_HISTORY_METRICS, entries, entry_date, fingerprint_change
    from bench_llm.analysis.slo import SLO
    from bench_llm.bench.options import parse_slo
    from bench_llm.results.history import Partition, add_entry, config_slug

    commit = commit or _git_commit()
    if not commit:
        raise BenchError("no commit to file the run under: pass --commit (not in a git checkout and $GITHUB_SHA unset)")
    try:
        metrics = list(DEFAULT_HISTORY_METRICS)
        slo = parse_slo(slo_text)
        if config_path is not None:
            cfg = load_gate_config(config_path)
            metrics += [m for m in cfg.metrics if m not in metrics]
            if not slo and cfg.gate.slo:
                slo = SLO.from_dict(cfg.gate.slo)
        found = entries(results, metrics, slo)
        if not found:
            raise BenchError(f"{results}: no complete run to add")
        refused = []
        for e in found:
            if too_few_succeeded(e.ok, e.counted):
                refused.append(f"refused {e.config_key or 'run'}: {e.ok} of {e.counted} measured requests succeeded; "
                               "not stored (a failed run must never become a baseline)")  # fmt: skip
                continue
            changed = fingerprint_change(store, e.config_key, e.fingerprint)
            part = Partition(date_text or entry_date(e), commit, config_slug(e.config_key))
            stored = add_entry(store, part, e.entry_id, e.rows, [r.path for r in e.runs])
            click.echo(f"added {e.config_key or 'run'} ({len(e.runs)} run(s)) -> {stored.metrics_file}")
            if changed:
                click.echo(f"note: {e.config_key or 'run'} measured something else than its stored entries ({changed}; this run vs "
                           "the newest stored): trend keeps it apart, gate --history judges it only against entries like it")  # fmt: skip
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    if refused:
        raise Outcome(ExitCode.NO_DATA, "\n".join(f"error: {r}" for r in refused))
