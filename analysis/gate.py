"""CI performance gates judged on bootstrap confidence intervals.

A check fails only when the *whole* confidence interval lies beyond its threshold, so noise
alone (an interval that straddles the threshold) does not fail a build; such a check is
reported as ``inconclusive``. Rules per metric (any combination):

- ``max_increase_pct`` / ``max_increase``: the change may not rise above this (relative, in
  percent of the baseline; or absolute, in the metric's unit). Fails when the interval's lower
  end is above it.
- ``max_decrease_pct`` / ``max_decrease``: the change may not fall below minus this. Fails when
  the interval's upper end is below it. ``max_decrease_pct = 0`` means "may not fall".
- ``max`` / ``min``: absolute bounds on the current value, judged on its own interval.
- ``observe = true``: reported, never fails (for noisy tail metrics).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from xml.sax.saxutils import escape, quoteattr

from bench_llm.analysis.bootstrap import METRICS, BootstrapOptions, Change
from bench_llm.analysis.compare import Comparison, compare_paths
from bench_llm.analysis.jobs import JOB_COMPARE_METRICS, job_changes
from bench_llm.analysis.slo import SLO

Verdict = Literal["pass", "fail", "inconclusive", "observe", "n/a"]


@dataclass(frozen=True)
class MetricGate:
    max_increase_pct: float | None = None
    max_increase: float | None = None
    max_decrease_pct: float | None = None
    max_decrease: float | None = None
    max: float | None = None
    min: float | None = None
    observe: bool = False

    def __post_init__(self) -> None:
        for name in ("max_increase_pct", "max_increase", "max_decrease_pct", "max_decrease"):
            v = getattr(self, name)
            if v is not None and (v < 0 or not math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number >= 0")
        if all(getattr(self, n) is None for n in ("max_increase_pct", "max_increase", "max_decrease_pct", "max_decrease", "max", "min")):
            raise ValueError("no threshold given (max_increase_pct, max_increase, max_decrease_pct, max_decrease, max, min)")


@dataclass(frozen=True)
class GateSettings:
    level: float = 0.95
    resamples: int = 1000
    seed: int = 0
    resampling: Literal["auto", "stratified", "hierarchical"] = "auto"
    #: SLOs for goodput_rps / slo_attainment and the fluidity deadlines (ttft_ms, tpot_ms).
    slo: dict[str, float] = field(default_factory=dict)
    #: A configuration of the baseline missing from the current results fails the gate.
    fail_on_missing: bool = True


@dataclass(frozen=True)
class GateConfig:
    gate: GateSettings = GateSettings()
    metrics: dict[str, MetricGate] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.metrics:
            raise ValueError("no [metrics.<name>] gates")
        unknown = [m for m in self.metrics if m not in METRICS and m not in JOB_COMPARE_METRICS]
        if unknown:
            raise ValueError(f"unknown metric {unknown[0]!r} (known: {', '.join([*METRICS, *JOB_COMPARE_METRICS])})")
        needs = [m for m in self.metrics if m in METRICS and METRICS[m].needs_slo]
        if needs and not self.gate.slo:
            raise ValueError(f"metric {needs[0]!r} needs gate.slo (e.g. slo = {{ ttft_ms = 500, tpot_ms = 50 }})")


def load_gate_config(path: Path) -> GateConfig:
    from bench_llm.core.config import load

    return load(GateConfig, path)


@dataclass(frozen=True, slots=True)
class CheckResult:
    group: str
    metric: str
    rule: str  # e.g. "max_increase_pct=10"
    verdict: Verdict
    message: str


@dataclass(frozen=True)
class GateResult:
    comparison: Comparison
    checks: tuple[CheckResult, ...]
    missing: tuple[str, ...]
    #: what a rolling baseline left out (entries of another fingerprint, unreadable files)
    notes: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.missing_failed and all(c.verdict != "fail" for c in self.checks)

    @property
    def missing_failed(self) -> bool:
        return bool(self.missing)


def _rel(v: float) -> str:
    return f"{100 * v:+.1f}%" if math.isfinite(v) else "n/a"


def judge_change(group: str, c: Change, g: MetricGate) -> list[CheckResult]:
    """Every rule of ``g`` applied to one metric's change."""
    out: list[CheckResult] = []
    ci_rel = f"change {_rel(c.rel)}, {100 * c.level:g}% CI [{_rel(c.rel_low)}, {_rel(c.rel_high)}]"
    ci_abs = f"change {c.diff:+.4g}, CI [{c.diff_low:+.4g}, {c.diff_high:+.4g}]"
    ci_cur = f"current {c.current:.4g}, CI [{c.current_low:.4g}, {c.current_high:.4g}]"

    def add(rule: str, lo: float, hi: float, limit: float, upper: bool, point: float, text: str) -> None:
        if not (math.isfinite(lo) and math.isfinite(hi)):
            out.append(CheckResult(group, c.metric, rule, "n/a", f"cannot judge: {text}"))
            return
        if upper:  # must stay <= limit
            failed, over = lo > limit, point > limit
        else:  # must stay >= limit
            failed, over = hi < limit, point < limit
        verdict: Verdict = "fail" if failed else ("inconclusive" if over else "pass")
        if g.observe and verdict != "pass":
            verdict = "observe"
        out.append(CheckResult(group, c.metric, rule, verdict, text))

    if g.max_increase_pct is not None:
        add(f"max_increase_pct={g.max_increase_pct:g}", c.rel_low, c.rel_high, g.max_increase_pct / 100, True, c.rel, ci_rel)
    if g.max_increase is not None:
        add(f"max_increase={g.max_increase:g}", c.diff_low, c.diff_high, g.max_increase, True, c.diff, ci_abs)
    if g.max_decrease_pct is not None:
        add(f"max_decrease_pct={g.max_decrease_pct:g}", c.rel_low, c.rel_high, -g.max_decrease_pct / 100, False, c.rel, ci_rel)
    if g.max_decrease is not None:
        add(f"max_decrease={g.max_decrease:g}", c.diff_low, c.diff_high, -g.max_decrease, False, c.diff, ci_abs)
    if g.max is not None:
        add(f"max={g.max:g}", c.current_low, c.current_high, g.max, True, c.current, ci_cur)
    if g.min is not None:
        add(f"min={g.min:g}", c.current_low, c.current_high, g.min, False, c.current, ci_cur)
    return out


def run_gate(baseline: Path, current: Path, config: GateConfig) -> GateResult:
    s = config.gate
    options = BootstrapOptions(level=s.level, resamples=s.resamples, seed=s.seed, resampling=s.resampling)
    request_metrics = [m for m in config.metrics if m in METRICS] or ["requests_per_s"]
    cmp = compare_paths(baseline, current, request_metrics, SLO.from_dict(s.slo) if s.slo else SLO(), options)
    from bench_llm.analysis.compare import group_runs
    from bench_llm.analysis.load import load_runs

    result = _judge_comparison(cmp, set(group_runs(load_runs(baseline))), config)
    jobs = [m for m in config.metrics if m in JOB_COMPARE_METRICS]
    if not jobs:
        return result
    # job metrics (analysis/jobs.py): single runs with jobs on both sides, ok jobs resampled
    changes = job_changes(baseline, current, jobs, s.level, s.resamples, s.seed)
    checks = [r for c in changes for r in judge_change("jobs", c, config.metrics[c.metric])]
    if not changes:
        checks = [CheckResult("jobs", m, "-", "n/a", "no jobs on one side (each side must be one run with jobs)")
                  for m in jobs]
    return GateResult(result.comparison, (*result.checks, *checks), result.missing)


def run_gate_history(store: Path, current: Path, config: GateConfig, window: int) -> GateResult:
    """Judge CURRENT against a rolling baseline: for each of its configurations, the stored
    runs of that configuration's last ``window`` comparable entries in the results store (the
    same workload, load and engine: analysis/history.run_fingerprint; the current runs
    themselves left out, should they already be stored). A configuration whose stored entries
    all measured something else is refused (``NotComparable``, naming the difference)."""
    from bench_llm.analysis.compare import compare_groups, group_runs
    from bench_llm.analysis.history import rolling_baseline, run_fingerprint
    from bench_llm.analysis.load import load_runs
    from bench_llm.results.history import read_history

    if window < 1:
        raise ValueError("the rolling window must be >= 1 entry")
    s = config.gate
    gc = group_runs(load_runs(current))
    current_ids = [r.run_id for runs in gc.values() for r in runs]
    gb, notes = {}, []
    stored = read_history(store)
    for key, runs in gc.items():
        base, why = rolling_baseline(store, key, window, current_ids, run_fingerprint(runs[0].meta), stored)
        notes += [n for n in why if n not in notes]
        if base:
            gb[key] = base
    if not gb:
        raise ValueError(f"{store} holds no run of any configuration in {current}")
    options = BootstrapOptions(level=s.level, resamples=s.resamples, seed=s.seed, resampling=s.resampling)
    label = f"{store} (last {window} comparable entries per configuration)"
    cmp = compare_groups(gb, gc, label, str(current), list(config.metrics), SLO.from_dict(s.slo) if s.slo else SLO(), options)
    result = _judge_comparison(cmp, set(gb), config)
    return GateResult(result.comparison, result.checks, result.missing, tuple(notes))


def _judge_comparison(cmp: Comparison, base_keys: set[str], config: GateConfig) -> GateResult:
    s = config.gate
    checks: list[CheckResult] = []
    for grp in cmp.groups:
        for c in grp.changes:
            if c.metric in config.metrics:
                checks.extend(judge_change(grp.key or "run", c, config.metrics[c.metric]))
    compared = {g.key for g in cmp.groups}
    missing = tuple(sorted(k or "run" for k in base_keys - compared)) if s.fail_on_missing else ()
    return GateResult(cmp, tuple(checks), missing)


_ICON = {"pass": "✅ pass", "fail": "❌ FAIL", "inconclusive": "⚠️ inconclusive", "observe": "👁 observe", "n/a": "– n/a"}


def markdown_summary(result: GateResult) -> str:
    cmp = result.comparison
    status = "PASSED" if result.passed else "FAILED"
    n_fail = sum(c.verdict == "fail" for c in result.checks)
    lines = [
        f"## Performance gate: {status}",
        "",
        f"Baseline `{cmp.baseline}` vs current `{cmp.current}`. {100 * cmp.level:g}% bootstrap intervals "
        f"({cmp.resamples} resamples). A check fails only when its whole interval is beyond the threshold.",
        "",
        f"{len(result.checks)} checks, {n_fail} failed.",
        "",
        "| configuration | metric | rule | verdict | evidence |",
        "|---|---|---|---|---|",
    ]
    for c in result.checks:
        lines.append(f"| {_md(c.group)} | `{c.metric}` | `{c.rule}` | {_ICON[c.verdict]} | {_md(c.message)} |")
    if result.missing:
        lines += ["", "Missing from the current results (fails the gate): " + ", ".join(f"`{m}`" for m in result.missing)]
    notes = _anomaly_notes(result)
    if notes:
        lines += ["", *(f"⚠️ {n}" for n in notes)]
    return "\n".join(lines) + "\n"


def _anomaly_notes(result: GateResult) -> list[str]:
    """Per configuration, the records left out for breaking the invariants; what the rolling
    baseline left out."""
    return [f"{g.key or 'run'}: {g.anomaly_note}" for g in result.comparison.groups if g.anomaly_note] + list(result.notes)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def junit_xml(result: GateResult) -> str:
    """One <testsuite> named bench-gate, one <testcase> per check (inconclusive = passed)."""
    n_fail = sum(c.verdict == "fail" for c in result.checks) + len(result.missing)
    n_skip = sum(c.verdict in ("n/a",) for c in result.checks)
    total = len(result.checks) + len(result.missing)
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuites name="bench-gate" tests="{total}" failures="{n_fail}">',
        f'  <testsuite name="bench-gate" tests="{total}" failures="{n_fail}" skipped="{n_skip}" errors="0">',
    ]
    for c in result.checks:
        name = quoteattr(f"{c.metric} {c.rule}")
        cls = quoteattr(f"bench.gate.{c.group}")
        parts.append(f"    <testcase classname={cls} name={name}>")
        if c.verdict == "fail":
            parts.append(f"      <failure message={quoteattr(c.message)}>{escape(c.message)}</failure>")
        elif c.verdict == "n/a":
            parts.append(f"      <skipped message={quoteattr(c.message)}/>")
        elif c.verdict in ("inconclusive", "observe"):
            parts.append(f"      <system-out>{escape(c.verdict + ': ' + c.message)}</system-out>")
        parts.append("    </testcase>")
    for m in result.missing:
        parts.append(f"    <testcase classname={quoteattr('bench.gate.' + m)} name=\"present\">")
        parts.append('      <failure message="configuration missing from the current results"/>')
        parts.append("    </testcase>")
    parts += ["  </testsuite>", "</testsuites>"]
    return "\n".join(parts) + "\n"


def text_summary(result: GateResult) -> str:
    lines = []
    for c in result.checks:
        lines.append(f"{c.verdict.upper():<13} {c.group:<20} {c.metric:<22} {c.rule:<24} {c.message}")
    for m in result.missing:
        lines.append(f"{'FAIL':<13} {m:<20} missing from the current results")
    lines.extend(f"WARNING: {n}" for n in _anomaly_notes(result))
    lines.append(f"gate {'PASSED' if result.passed else 'FAILED'}")
    return "\n".join(lines)
