"""Comparing two result folders: each metric's change with a bootstrap confidence interval.

A folder may hold one run, several repeats of one configuration, or a sweep. Runs are grouped
by their configuration key (the sweep cell and load label from ``extra_json``; plain runs
share the empty key) and every group is compared with the group of the same key on the other
side. Repeats inside a group are pooled (analysis/bootstrap.py), never averaged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_llm.analysis.bootstrap import (
    DEFAULT_COMPARE_METRICS,
    BootstrapOptions,
    Change,
    Side,
    compare_sides,
    hierarchical_for,
    make_side,
)
from bench_llm.analysis.load import Run, load_runs
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.smoothness import Deadlines
from bench_llm.results.sweep_rows import LoadRef


def config_key(meta: dict[str, Any]) -> str:
    """The configuration a run measured: '' for a plain run, 'cell / workload / load' in a sweep.

    The load is named by its kind and value, not its label, so repeats of one load (whose
    labels may carry a repeat suffix) share a key and are pooled.
    """
    extra = meta.get("extra")
    if not isinstance(extra, dict):
        return ""
    cell = extra.get("cell")
    load = LoadRef.from_row(extra)  # a sweep's load, in this or the earlier spelling
    parts = []
    if isinstance(cell, dict):
        if cell.get("cell_id"):
            parts.append(str(cell["cell_id"]))
        else:
            parts.append(",".join(f"{k}={cell[k]}" for k in sorted(cell) if not isinstance(cell[k], (list, dict))))
    if isinstance(extra.get("workload"), str) and extra["workload"]:
        parts.append(extra["workload"])
    if load is not None:
        if load.kind and math.isfinite(load.value):
            parts.append(f"{load.kind}={load.value:g}")
        else:
            parts.append(load.label)
    return " / ".join(parts)


def group_runs(runs: Sequence[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for r in runs:
        if r.meta.get("status") not in (None, "complete", "interrupted"):
            continue  # a failed or still-running run is not a measurement to compare
        groups.setdefault(config_key(r.meta), []).append(r)
    return groups


@dataclass(frozen=True)
class GroupComparison:
    key: str
    baseline_runs: tuple[str, ...]
    current_runs: tuple[str, ...]
    baseline_requests: int
    current_requests: int
    resampling: str
    changes: tuple[Change, ...]
    #: records left out of both sides for breaking the invariants (analysis/invariants.py)
    baseline_anomalies: int = 0
    current_anomalies: int = 0

    @property
    def anomaly_note(self) -> str | None:
        """One line when either side had anomalous records, else None."""
        if not (self.baseline_anomalies or self.current_anomalies):
            return None
        return (
            f"anomalous records excluded: baseline {self.baseline_anomalies}, current {self.current_anomalies} "
            "(docs/metrics.md, Record invariants)"
        )


@dataclass(frozen=True)
class Comparison:
    baseline: str
    current: str
    level: float
    resamples: int
    groups: tuple[GroupComparison, ...]
    unmatched: tuple[str, ...]  # keys present on one side only

    def as_dict(self) -> dict[str, Any]:
        return _clean(
            {
                "baseline": self.baseline,
                "current": self.current,
                "level": self.level,
                "resamples": self.resamples,
                "unmatched": list(self.unmatched),
                "groups": [
                    {
                        "key": g.key,
                        "baseline_runs": list(g.baseline_runs),
                        "current_runs": list(g.current_runs),
                        "baseline_requests": g.baseline_requests,
                        "current_requests": g.current_requests,
                        "resampling": g.resampling,
                        "baseline_anomalies": g.baseline_anomalies,
                        "current_anomalies": g.current_anomalies,
                        "changes": [c.as_dict() for c in g.changes],
                    }
                    for g in self.groups
                ],
            }
        )


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def _side(runs: Sequence[Run], slo: SLO, deadlines: Deadlines | None) -> Side:
    return make_side([r.requests for r in runs], slo, [r.run_id for r in runs], deadlines)


def compare_paths(
    baseline: Path,
    current: Path,
    metrics: Sequence[str] = DEFAULT_COMPARE_METRICS,
    slo: SLO = SLO(),
    options: BootstrapOptions = BootstrapOptions(),
    deadlines: Deadlines | None = None,
) -> Comparison:
    """Compare every configuration present in both folders. Raises ValueError when none is."""
    return compare_groups(group_runs(load_runs(baseline)), group_runs(load_runs(current)), str(baseline), str(current), metrics, slo, options, deadlines)


def compare_groups(
    gb: dict[str, list[Run]],
    gc: dict[str, list[Run]],
    baseline: str,
    current: str,
    metrics: Sequence[str] = DEFAULT_COMPARE_METRICS,
    slo: SLO = SLO(),
    options: BootstrapOptions = BootstrapOptions(),
    deadlines: Deadlines | None = None,
) -> Comparison:
    """Compare runs already grouped by configuration (a folder's, or a rolling baseline's)."""
    keys = [k for k in gb if k in gc]
    if not keys:
        raise ValueError(f"{baseline} and {current} share no configuration to compare")
    groups = []
    for key in keys:
        sb, sc = _side(gb[key], slo, deadlines), _side(gc[key], slo, deadlines)
        changes = compare_sides(sb, sc, metrics, options)
        groups.append(
            GroupComparison(
                key,
                sb.labels,
                sc.labels,
                sb.n_requests,
                sc.n_requests,
                "hierarchical" if hierarchical_for(sb, sc, options) else "stratified",
                tuple(changes),
                sb.anomalies,
                sc.anomalies,
            )
        )
    unmatched = tuple(sorted(set(gb) ^ set(gc)))
    return Comparison(baseline, current, options.level, options.resamples, tuple(groups), unmatched)


def _num(v: float, unit: str) -> str:
    if not math.isfinite(v):
        return "-"
    if unit in ("", "%"):
        return f"{v:.4f}"
    return f"{v:,.2f}" if abs(v) < 1000 else f"{v:,.0f}"


def _pct(lo: float, hi: float) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    return f"[{100 * lo:+.1f}%, {100 * hi:+.1f}%]"


def format_comparison(cmp: Comparison) -> str:
    lines = [
        f"baseline {cmp.baseline}  vs  current {cmp.current}",
        f"intervals: {100 * cmp.level:g}% percentile bootstrap, {cmp.resamples} resamples; "
        f"significant = the interval of the difference excludes 0",
    ]
    for g in cmp.groups:
        lines.append("")
        title = g.key or "run"
        lines.append(
            f"{title}: baseline {len(g.baseline_runs)} run(s) / {g.baseline_requests} requests, "
            f"current {len(g.current_runs)} run(s) / {g.current_requests} requests, {g.resampling} resampling"
        )
        if g.anomaly_note:
            lines.append(f"WARNING: {g.anomaly_note}")
        header = f"{'metric':<22}{'baseline':>12}{'current':>12}{'change':>10}  {'interval of change':<22}{'verdict':<12}"
        lines.append(header)
        lines.append("-" * len(header))
        for c in g.changes:
            rel = f"{100 * c.rel:+.1f}%" if math.isfinite(c.rel) else f"{c.diff:+.3g}"
            if math.isfinite(c.rel_low):
                ci = _pct(c.rel_low, c.rel_high)
            elif math.isfinite(c.diff_low):
                ci = f"[{c.diff_low:+.3g}, {c.diff_high:+.3g}]"
            else:
                ci = "-"
            verdict = {"same": "no sig. change", "worse": "WORSE", "better": "better"}[c.direction]
            lines.append(f"{c.metric:<22}{_num(c.baseline, c.unit):>12}{_num(c.current, c.unit):>12}{rel:>10}  {ci:<22}{verdict:<12}")
    if cmp.unmatched:
        lines.append("")
        lines.append("present on one side only (not compared): " + "; ".join(k or "run" for k in cmp.unmatched))
    return "\n".join(lines)


def comparison_json(cmp: Comparison) -> str:
    return json.dumps(cmp.as_dict(), indent=2)
