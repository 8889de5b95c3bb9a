"""Which exit code a finished run, sweep or recommendation ends with (``ExitCode``).

The verbs print their results first, then raise the ``Outcome`` these return.
"""

from __future__ import annotations

from pathlib import Path

from bench_llm.analysis.failures import error_line
from bench_llm.analysis.format import anomaly_text
from bench_llm.analysis.recommend_types import Recommendation
from bench_llm.analysis.summary_types import RunSummary
from bench_llm.bench.errors import ExitCode, Outcome, too_few_succeeded


def run_outcome(summary: RunSummary) -> Outcome | None:
    """``NO_DATA`` when nothing or almost nothing of the run succeeded, else None."""
    r = summary.requests
    if not too_few_succeeded(r.ok, r.measured):
        return None
    if not r.measured and r.anomalies:  # every record broke an invariant or its stream's protocol
        return Outcome(ExitCode.NO_DATA, f"error: nothing measured: {anomaly_text(r)}, each kept out of every figure "
                                         "(docs/metrics.md, Record invariants)")  # fmt: skip
    if not r.measured:
        cancelled = r.cancelled_at_end
        return Outcome(
            ExitCode.NO_DATA,
            "error: no request completed"
            + (f": {cancelled} still running were cancelled at the end (a longer --duration or --drain-timeout?)"
               if cancelled else ""),
        )
    top = r.top_errors
    cause = error_line(top)
    if top and str(top[0].get("message", "")).startswith("HTTP 404"):
        cause += " (is --url the server's root, and --engine/--api its API?)"
    return Outcome(
        ExitCode.NO_DATA,
        f"error: {r.ok} of {r.measured} measured requests succeeded" + (f"; {cause}" if cause else ""),
    )


def sweep_outcome(sweep: Path, rec: Recommendation) -> Outcome | None:
    """``NO_DATA`` when no load of the sweep measured anything (every cell failed, or every
    request of every load did), ``UNTRUSTWORTHY`` when the answer rests on a load the client
    could not measure truthfully, ``NO_CONFIGURATION`` when SLOs were given and no
    configuration meets them, else None."""
    from bench_llm.analysis.recommend_io import load_points

    points = load_points(sweep)
    ok = int(points["ok"].fillna(0).sum()) if "ok" in points else 0
    counted = int(points["requests"].fillna(0).sum()) if "requests" in points else 0
    if "cancelled" in points:  # cancelled at the end of a load: neither success nor failure
        counted -= int(points["cancelled"].fillna(0).sum())
    if too_few_succeeded(ok, counted):
        return Outcome(ExitCode.NO_DATA, f"error: {ok} of {counted} requests of the sweep succeeded: nothing to judge")
    if rec.untrustworthy:
        return Outcome(ExitCode.UNTRUSTWORTHY, f"UNTRUSTWORTHY: {len(rec.untrustworthy)} load(s) could not be measured truthfully")
    failed = _failed_cells(sweep)
    if failed:
        return Outcome(ExitCode.CELL_FAILED, "FAILED: " + "; ".join(failed))
    if rec.slo and not _recommended(rec):
        unmet = [f"workload {w}: {wr.message}" for w, wr in rec.workloads.items() if wr.recommendation is None]
        why = "; ".join(unmet) if len(rec.workloads) > 1 else rec.message
        return Outcome(ExitCode.NO_CONFIGURATION, f"no configuration meets the SLOs: {why}")
    return None


def _recommended(rec: Recommendation) -> bool:
    """Every workload of the sweep has a recommendation (a sweep over several must serve each)."""
    if not rec.workloads:
        return rec.recommendation is not None
    return all(w.recommendation is not None for w in rec.workloads.values())


def _failed_cells(sweep: Path) -> list[str]:
    """``cell: reason`` of each failed cell of the sweep (cells.parquet)."""
    from bench_llm.analysis.recommend_io import read_cells

    try:
        cells = read_cells(sweep)
    except Exception:  # no cell table: nothing to say here
        return []
    rows = cells.to_dict("records") if hasattr(cells, "to_dict") else list(cells)
    return [f"{r['cell_id']}: {r.get('reason') or 'failed'}" for r in rows if r.get("status") == "failed"]
