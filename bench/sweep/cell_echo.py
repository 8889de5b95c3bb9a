"""The lines a cell prints: one per run of a load (``echo_point``), the capacity found and
its interval, and its confirmation."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from bench_llm.analysis.invariants import ONE_READ_SHARE_MAX
from bench_llm.bench.sweep.loads import fmt
from bench_llm.results.sweep_rows import Confirmation, PointRow

Echo = Callable[[str], None]


def echo_point(echo: Echo, index: str, cell_id: str, label: str, point: PointRow, secs: float) -> None:
    """The line printed after each run of a load: its counts, SLO attainment, latencies and
    every warning it carries."""
    row: Mapping[str, Any] = point.metrics  # the run's figures
    parts = [
        f"{index} {cell_id} {label}:",
        f"{row['ok']}/{row['requests']} ok",
        f"{fmt(row['throughput_rps'], ' req/s', 2)}",
    ]
    if not math.isnan(row.get("attainment", float("nan"))):
        parts.append(f"SLO met {100 * row['attainment']:.0f}%")
    parts.append(f"TTFT p90 {fmt(row['ttft_p90_ms'], ' ms')}")
    parts.append(f"TPOT p90 {fmt(row['tpot_p90_ms'], ' ms', 1)}")
    parts.append(f"({secs:.1f} s)")
    line = " ".join(parts)
    if row.get("anomalies"):
        line += f"  ANOMALIES: {row['anomalies']} records excluded"
    if row.get("untrustworthy"):
        line += f"  UNTRUSTWORTHY: {row['untrustworthy']}"
    if row.get("under_sampled"):
        line += f"  {_shout(str(row['under_sampled']))}"
    if row.get("one_read_share", 0.0) > ONE_READ_SHARE_MAX:
        line += f"  TPOT not measurable: {100 * row['one_read_share']:.0f}% of responses in one read"
    if row.get("prompt_approximate"):
        line += f"  PROMPTS APPROXIMATE: {row['prompt_approximate']}"
    if point.saturated:
        line += f"  SATURATED: {point.saturation_reason}"
    if row.get("top_error"):
        line += f"  errors: {row['top_error']}"
    if row.get("missing_rows"):
        line += f"  WARNING: {row['missing_rows']} scheduled requests have no row in the results"
    echo(line)


def fmt_load(kind: str, value: float) -> str:
    return f"{value:g} req/s" if kind == "rate" else f"concurrency {int(value)}"


def confirmation_text(c: Confirmation | None, level: float) -> str:
    """The confirmation line printed beside a capacity."""
    if c is None:
        return "capacity NOT CONFIRMED: every confirmation load failed (the capacity is the highest passing probe below them)"
    att = 100 * c.attainment
    head = f"confirmed: {c.requests} requests at {c.rate:g} req/s (fresh seed) met {att:.1f}%"
    if not c.passed:
        head = f"NOT confirmed ({c.verdict}): {c.requests} requests at {c.rate:g} req/s (fresh seed) met {att:.1f}%"
    return head + f"; with its probe, {100 * c.pooled_attainment:.1f}% of {c.pooled_requests}, {100 * level:g}% interval {100 * c.low:.1f}-{100 * c.high:.1f}%"


def interval_text(low: float | None, upper: float | None) -> str:
    if low is None:
        return ""
    return f"; interval [{low:g}, {f'{upper:g}' if upper is not None else 'inf'}) req/s"


def _shout(reason: str) -> str:
    """A load's reason with its first clause upper-cased ("UNDECIDED: 26 more requests
    needed ...", "NOT STATIONARY: ..."); "UNDER-SAMPLED: ..." for any other."""
    head, sep, rest = reason.partition(": ")
    if sep and head in ("undecided", "not stationary"):
        return f"{head.upper()}: {rest}"
    return f"UNDER-SAMPLED: {reason}"


def cap_text(cap: float | None, upper: float | None, gpus: int) -> str:
    if cap is None:
        return "none (no load met the SLOs" + (f"; lowest tried failed at {upper:g} req/s)" if upper else ")")
    up = f" (fails at {upper:g})" if upper is not None else " (no failing load found: a lower bound)"
    return f"{cap:g} req/s, {cap / gpus:.3g} req/s per GPU{up}"

