"""Run totals: the one definition of which requests count, the window, throughput, SLO
attainment and goodput (docs/metrics.md, Aggregates). Summary, capacity points, bootstrap
(and so compare, gate and report) all take them from here.

Which requests are *judged*: the measured ones (warm-up excluded) whose record is not an
anomaly (analysis/invariants.py). Attainment is met / judged: a failed request and a request
cancelled at the end (still running at the drain deadline: the slowest) are misses. The window
runs from the earliest intended send to the latest end of the judged requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench_llm.analysis.confidence import CONFIDENCE, wilson_interval


@dataclass(frozen=True)
class RunTotals:
    measured: int  # non-warm-up rows
    anomalies: int  # of them, records that break the invariants (excluded from all below)
    judged: int  # measured − anomalies
    ok: int
    cancelled: int  # cancelled at the end (misses for attainment; not errors)
    failed: int  # failed otherwise
    window_s: float
    output_tokens: float  # Σ output tokens of the ok requests
    prompt_tokens: float  # Σ prompt tokens of the ok requests (server's, else requested)
    met: int | None = None  # ok and met every SLO bound (None: no SLO)

    def _per_s(self, count: float) -> float:
        return count / self.window_s if self.window_s > 0 else 0.0

    @property
    def requests_per_s(self) -> float:
        return self._per_s(self.ok)

    @property
    def output_tokens_per_s(self) -> float:
        return self._per_s(self.output_tokens)

    @property
    def total_tokens_per_s(self) -> float:
        return self._per_s(self.output_tokens + self.prompt_tokens)

    @property
    def error_rate(self) -> float:
        counted = self.judged - self.cancelled
        return self.failed / counted if counted else 0.0

    @property
    def attainment(self) -> float:
        return self.met / self.judged if self.met is not None and self.judged else float("nan")

    def attainment_interval(self, level: float = CONFIDENCE) -> tuple[float, float]:
        return wilson_interval(self.met, self.judged, level) if self.met is not None else (math.nan, math.nan)

    @property
    def goodput_rps(self) -> float:
        return self._per_s(self.met) if self.met is not None else float("nan")


def judged_mask(df: pd.DataFrame) -> np.ndarray:
    """The measured rows of ``df`` that are judged: not anomalous (column ``anomaly``, 0 = none)."""
    if "anomaly" not in df:
        return np.ones(len(df), bool)
    return df["anomaly"].to_numpy(dtype=np.int64) == 0


def run_totals(df: pd.DataFrame, met: np.ndarray | None = None) -> RunTotals:
    """Totals of the measured rows of ``df`` (per-request columns: ok, error_type,
    intended_send_ns, end_ns, output_tokens, prompt_tokens, input_tokens_target and
    optionally anomaly). ``met``: per row of ``df``, ok and met every SLO bound."""
    keep = judged_mask(df)
    j = df[keep]
    ok = j["ok"].to_numpy(dtype=bool)
    cancelled = j["error_type"].eq("cancelled").to_numpy(dtype=bool)
    starts = j["intended_send_ns"].to_numpy(dtype=float)
    ends = j["end_ns"].to_numpy(dtype=float)
    window = float((np.nanmax(ends) - np.nanmin(starts)) / 1e9) if len(j) and np.isfinite(ends).any() else 0.0
    okdf = j[ok]
    prompt = okdf["prompt_tokens"].astype("float64").fillna(okdf["input_tokens_target"].astype("float64"))
    return RunTotals(
        measured=len(df),
        anomalies=int((~keep).sum()),
        judged=len(j),
        ok=int(ok.sum()),
        cancelled=int(cancelled.sum()),
        failed=int((~ok & ~cancelled).sum()),
        window_s=max(window, 0.0),
        output_tokens=float(okdf["output_tokens"].sum()),
        prompt_tokens=float(prompt.sum()),
        met=None if met is None else int(np.asarray(met, bool)[keep].sum()),
    )
