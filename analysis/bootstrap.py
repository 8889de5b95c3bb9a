"""Bootstrap confidence intervals for run metrics, with repeats pooled correctly.

A *side* is one or more runs of the same configuration (repeats). Its metrics are computed
on the pooled requests of all its runs (a p95 is the p95 of every request, never the mean of
per-run p95s); rates are pooled as total count over total window.

Resampling (one replicate):
- ``stratified`` (default): each run's requests are resampled with replacement within that
  run, so every replicate keeps the runs' sizes and mix.
- ``hierarchical``: runs are first resampled with replacement, then requests within each
  chosen run. This also carries run-to-run variation into the interval and is used
  automatically when every side has at least ``HIERARCHICAL_MIN_RUNS`` runs.

Requests are resampled in *blocks* of consecutive requests (in intended-send order, moving
blocks wrapping around the run), not one by one: requests that were in flight together share
the engine's batch, queue and the client's CPU, so their latencies are correlated, and an
i.i.d. resample would give intervals that are too narrow (identical runs would "differ"). The
block length is the run's mean number of requests in flight (Little's law: Σ E2E / window),
at least 1. ITL resamples whole requests with all their tokens (tokens of one request are
not independent). Rates (requests/s, output tokens/s, goodput) are ratio estimates over the
same resampled requests: Σ numerator / Σ share of the window, where a request's share is the
time from its intended send to the next request's (the last one's runs to the window end), so
the point estimate equals the summary's count / window.

A change's interval comes from independent replicates of the two sides: ``current −
baseline`` and ``current / baseline − 1``, percentile intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa

from bench_llm.analysis.invariants import check_records
from bench_llm.analysis.metrics import NS_PER_MS, measured, per_token_rows, request_metrics
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.smoothness import Deadlines, smoothness_metrics
from bench_llm.analysis.summary import slo_mask

HIERARCHICAL_MIN_RUNS = 3
#: Upper bound on the block length as a fraction of the run (keeps at least ~5 blocks).
MAX_BLOCK_FRACTION = 0.2

Better = Literal["lower", "higher"]
Kind = Literal["request", "token", "rate", "proportion"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: Kind
    column: str  # request column (for rates: the numerator column)
    stat: str  # "mean" or "pNN" (request/token kinds); "rate" or "mean" otherwise
    better: Better
    unit: str
    needs_slo: bool = False


def _catalogue() -> dict[str, MetricSpec]:
    specs: list[MetricSpec] = []
    for col in ("ttft", "tpot", "e2e", "ttfo"):
        for stat in ("p50", "p90", "p95", "p99", "mean"):
            specs.append(MetricSpec(f"{col}_{stat}_ms", "request", f"{col}_ms", stat, "lower", "ms"))
    for stat in ("p50", "p90", "p95", "p99", "mean"):
        specs.append(MetricSpec(f"itl_{stat}_ms", "token", "itl_ms", stat, "lower", "ms"))
        specs.append(MetricSpec(f"longest_gap_{stat}_ms", "request", "longest_gap_ms", stat, "lower", "ms"))
    for stat in ("mean", "p1", "p5", "p10", "p50"):
        specs.append(MetricSpec(f"fluidity_{stat}", "request", "fluidity", stat, "higher", ""))
    specs += [
        MetricSpec("requests_per_s", "rate", "ok_count", "rate", "higher", "req/s"),
        MetricSpec("output_tokens_per_s", "rate", "ok_tokens", "rate", "higher", "tok/s"),
        MetricSpec("goodput_rps", "rate", "slo_met", "rate", "higher", "req/s", needs_slo=True),
        MetricSpec("slo_attainment", "proportion", "slo_met", "mean", "higher", "", needs_slo=True),
        MetricSpec("error_rate", "proportion", "failed", "mean", "lower", ""),
    ]
    return {s.name: s for s in specs}


METRICS: dict[str, MetricSpec] = _catalogue()

DEFAULT_COMPARE_METRICS: tuple[str, ...] = (
    "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms",
    "tpot_p50_ms", "tpot_p95_ms", "tpot_p99_ms",
    "itl_p50_ms", "itl_p99_ms",
    "e2e_p50_ms", "e2e_p99_ms",
    "longest_gap_p99_ms", "fluidity_mean",
    "requests_per_s", "output_tokens_per_s", "error_rate",
    "slo_attainment", "goodput_rps",
)  # fmt: skip


def metric_spec(name: str) -> MetricSpec:
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"unknown metric {name!r}; known: {', '.join(METRICS)}") from None


@dataclass(frozen=True)
class RunData:
    """One run reduced to what the bootstrap needs."""

    requests: pd.DataFrame  # judged requests (analysis.totals); latency columns NaN when not ok
    itl_offsets: np.ndarray  # token ITL values of request i: itl_values[off[i]:off[i+1]]
    itl_values: np.ndarray
    window_s: float
    block: int  # moving-block length in requests
    columns: dict[str, np.ndarray] = field(default_factory=dict)  # float views of ``requests``
    anomalies: int = 0  # records left out for breaking the invariants (analysis/invariants.py)


@dataclass(frozen=True)
class Side:
    """A set of repeats of one configuration."""

    runs: tuple[RunData, ...]
    labels: tuple[str, ...] = ()
    has_slo: bool = False

    @property
    def n_requests(self) -> int:
        return sum(len(r.requests) for r in self.runs)

    @property
    def anomalies(self) -> int:
        return sum(r.anomalies for r in self.runs)


def prepare_run(table: pa.Table, slo: SLO = SLO(), deadlines: Deadlines | None = None) -> RunData:
    """Reduce a requests table (all rows) to per-request values in intended-send order."""
    table = measured(table)
    if table.num_rows:
        order = np.argsort(table["intended_send_ns"].to_numpy(zero_copy_only=False), kind="stable")
        table = table.take(pa.array(order))
    df = request_metrics(table)
    # the judged requests of analysis.totals: anomalous records out, cancelled ones kept (misses)
    keep = check_records(table).anomaly == 0
    anomalies = int((~keep).sum())
    table = table.filter(pa.array(keep))
    df = df[keep].reset_index(drop=True)
    smooth = smoothness_metrics(table, deadlines or Deadlines.from_slo(slo.as_dict()))
    df = pd.concat([df, smooth], axis=1)
    ok = df["ok"].to_numpy(dtype=bool)
    for col in ("ttft_ms", "tpot_ms", "e2e_ms", "ttfo_ms", "fluidity", "longest_gap_ms"):
        df.loc[~ok, col] = np.nan
    # error rate: failed / requests not cancelled at the end (cancelled rows: no value)
    df["failed"] = np.where(df["error_type"].eq("cancelled").to_numpy(), np.nan, (~ok).astype(float))
    df["ok_count"] = ok.astype(float)
    df["ok_tokens"] = np.where(ok, df["output_tokens"].to_numpy(dtype=float), 0.0)
    df["slo_met"] = slo_mask(df, slo).astype(float) if slo else np.nan
    offsets, values = _itl_per_request(table, ok & per_token_rows(table))
    starts = df["intended_send_ns"].to_numpy(dtype=float)
    ends = df["end_ns"].to_numpy(dtype=float)
    window_s, block = 0.0, 1
    df["span_s"] = 0.0
    if len(df) and np.isfinite(ends).any():
        t1 = float(np.nanmax(ends))
        window_s = (t1 - starts[0]) / 1e9
        df["span_s"] = np.diff(np.r_[starts, max(t1, starts[-1])]) / 1e9
        if window_s > 0:
            in_flight = float(np.nansum(df["e2e_ms"].to_numpy(dtype=float))) / 1e3 / window_s
            block = int(np.clip(round(in_flight), 1, max(1, int(MAX_BLOCK_FRACTION * len(df)))))
    cols = {c: df[c].to_numpy(dtype=float) for c in _NUMERIC_COLUMNS}
    return RunData(df, offsets, values, window_s, block, cols, anomalies)


_NUMERIC_COLUMNS = (
    "ttft_ms", "tpot_ms", "e2e_ms", "ttfo_ms", "fluidity", "longest_gap_ms",
    "failed", "ok_count", "ok_tokens", "slo_met", "span_s",
)  # fmt: skip


def _itl_per_request(table: pa.Table, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token-level ITL (a gap of a k-token chunk gives k values gap/k), grouped by request."""
    n = table.num_rows
    if n == 0:
        return np.zeros(1, np.int64), np.empty(0)
    ts_col = table["chunk_ns"].combine_chunks()
    tk_col = table["chunk_tokens"].combine_chunks()
    ts = ts_col.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    tk = tk_col.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    row = np.repeat(np.arange(n), np.diff(ts_col.offsets.to_numpy()))
    keep = (tk > 0) & ok[row]
    ts, tk, row = ts[keep], tk[keep], row[keep]
    same = row[1:] == row[:-1]
    gaps = (ts[1:] - ts[:-1])[same].astype(float)
    k = tk[1:][same]
    grow = row[1:][same]
    values = np.repeat(gaps / k, k) / NS_PER_MS
    vrow = np.repeat(grow, k)
    counts = np.bincount(vrow, minlength=n)
    return np.r_[0, np.cumsum(counts)].astype(np.int64), values


def make_side(tables: Sequence[pa.Table], slo: SLO = SLO(), labels: Sequence[str] = (), deadlines: Deadlines | None = None) -> Side:
    if not tables:
        raise ValueError("a side needs at least one run")
    return Side(tuple(prepare_run(t, slo, deadlines) for t in tables), tuple(labels), bool(slo))


# -- statistics -------------------------------------------------------------------------------


def _stats(values: np.ndarray, stats: Sequence[str]) -> np.ndarray:
    """Each of ``stats`` ("mean" or "pNN") of ``values``, NaNs ignored.

    Percentiles use numpy's default 'linear' method (as the run summary does), computed on
    one sort; several times faster than np.percentile on the small arrays of a bootstrap.
    """
    v = np.sort(values[~np.isnan(values)])
    out = np.full(len(stats), np.nan)
    n = len(v)
    if n == 0:
        return out
    for j, stat in enumerate(stats):
        if stat == "mean":
            out[j] = v.mean()
            continue
        pos = float(stat[1:].replace("_", ".")) / 100 * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        out[j] = v[lo] + (pos - lo) * (v[hi] - v[lo])
    return out


@dataclass
class _Draw:
    """One (re)sample of a side: request indices and bin indices per run."""

    req_idx: list[np.ndarray] = field(default_factory=list)
    run_idx: list[int] = field(default_factory=list)


def _identity_draw(side: Side) -> _Draw:
    d = _Draw()
    for i, r in enumerate(side.runs):
        d.run_idx.append(i)
        d.req_idx.append(np.arange(len(r.requests)))
    return d


def _random_draw(side: Side, rng: np.random.Generator, hierarchical: bool) -> _Draw:
    d = _Draw()
    n_runs = len(side.runs)
    chosen = rng.integers(0, n_runs, n_runs) if hierarchical else np.arange(n_runs)
    for i in chosen:
        r = side.runs[int(i)]
        d.run_idx.append(int(i))
        d.req_idx.append(_block_indices(len(r.requests), r.block, rng))
    return d


def _block_indices(n: int, block: int, rng: np.random.Generator) -> np.ndarray:
    """Moving-block (circular) resample of ``n`` ordered items with blocks of ``block``."""
    if n == 0:
        return np.empty(0, np.int64)
    k = -(-n // block)
    starts = rng.integers(0, n, k)
    return ((starts[:, None] + np.arange(block)[None, :]) % n).ravel()[:n]


def _evaluate(side: Side, draw: _Draw, specs: Sequence[MetricSpec]) -> np.ndarray:
    out = np.full(len(specs), np.nan)
    cache: dict[str, np.ndarray] = {}

    def column(col: str) -> np.ndarray:
        if col not in cache:
            parts = [side.runs[i].columns[col][idx] for i, idx in zip(draw.run_idx, draw.req_idx)]
            cache[col] = np.concatenate(parts) if parts else np.empty(0)
        return cache[col]

    by_column: dict[tuple[str, str], list[int]] = {}
    for j, spec in enumerate(specs):
        if spec.needs_slo and not side.has_slo:
            continue
        if spec.kind == "rate":
            win = float(column("span_s").sum())
            out[j] = float(column(spec.column).sum()) / win if win > 0 else float("nan")
        else:
            by_column.setdefault((spec.kind, spec.column), []).append(j)
    for (kind, col), js in by_column.items():
        if kind == "token":
            values = np.concatenate([_gather(side.runs[i], idx) for i, idx in zip(draw.run_idx, draw.req_idx)])
        else:
            values = column(col)
        out[js] = _stats(values, [specs[j].stat for j in js])
    return out


def _gather(run: RunData, idx: np.ndarray) -> np.ndarray:
    """ITL values of requests ``idx`` (with repeats), concatenated."""
    off = run.itl_offsets
    starts, lens = off[idx], off[idx + 1] - off[idx]
    total = int(lens.sum())
    if total == 0:
        return np.empty(0)
    pos = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens) + np.repeat(starts, lens)
    return run.itl_values[pos]


def point_estimates(side: Side, names: Sequence[str]) -> dict[str, float]:
    specs = [metric_spec(n) for n in names]
    return dict(zip(names, _evaluate(side, _identity_draw(side), specs).tolist()))


def replicates(side: Side, names: Sequence[str], resamples: int, rng: np.random.Generator, hierarchical: bool) -> np.ndarray:
    """(resamples, len(names)) bootstrap replicates of the metrics of ``side``."""
    specs = [metric_spec(n) for n in names]
    return np.array([_evaluate(side, _random_draw(side, rng, hierarchical), specs) for _ in range(resamples)]).reshape(
        resamples, len(specs)
    )


@dataclass(frozen=True, slots=True)
class Change:
    """The change of one metric from baseline to current, with its confidence intervals."""

    metric: str
    unit: str
    better: Better
    baseline: float
    current: float
    current_low: float  # interval of the current value itself (for absolute bounds)
    current_high: float
    diff: float  # current − baseline
    diff_low: float
    diff_high: float
    rel: float  # current / baseline − 1 (NaN when the baseline is 0)
    rel_low: float
    rel_high: float
    level: float  # confidence level, e.g. 0.95
    significant: bool  # the diff interval excludes 0

    @property
    def direction(self) -> str:
        """'worse', 'better' or 'same' (same: not significant)."""
        if not self.significant:
            return "same"
        up = self.diff > 0
        return "worse" if up == (self.better == "lower") else "better"

    def as_dict(self) -> dict[str, object]:
        d = {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]
        d["direction"] = self.direction
        return d


@dataclass(frozen=True, slots=True)
class BootstrapOptions:
    level: float = 0.95
    resamples: int = 1000
    seed: int = 0
    resampling: Literal["auto", "stratified", "hierarchical"] = "auto"

    def __post_init__(self) -> None:
        if not 0.5 <= self.level < 1:
            raise ValueError("confidence level must be in [0.5, 1)")
        if self.resamples < 100:
            raise ValueError("use at least 100 resamples")


def hierarchical_for(baseline: Side, current: Side, options: BootstrapOptions) -> bool:
    if options.resampling == "auto":
        return min(len(baseline.runs), len(current.runs)) >= HIERARCHICAL_MIN_RUNS
    return options.resampling == "hierarchical"


def compare_sides(
    baseline: Side, current: Side, names: Sequence[str], options: BootstrapOptions = BootstrapOptions()
) -> list[Change]:
    """Each metric's change with percentile bootstrap intervals at ``options.level``."""
    names = [n for n in names if not (metric_spec(n).needs_slo and not (baseline.has_slo and current.has_slo))]
    rng = np.random.default_rng(options.seed)
    hier = hierarchical_for(baseline, current, options)
    pb, pc = point_estimates(baseline, names), point_estimates(current, names)
    rb = replicates(baseline, names, options.resamples, rng, hier)
    rc = replicates(current, names, options.resamples, rng, hier)
    alpha = (1 - options.level) / 2
    changes = []
    for j, name in enumerate(names):
        spec = metric_spec(name)
        d = rc[:, j] - rb[:, j]
        with np.errstate(divide="ignore", invalid="ignore"):
            r = rc[:, j] / rb[:, j] - 1
        dl, dh = _interval(d, alpha)
        rl, rh = _interval(r, alpha) if pb[name] not in (0.0,) else (float("nan"), float("nan"))
        base, cur = pb[name], pc[name]
        rel = cur / base - 1 if base not in (0.0,) and np.isfinite(base) else float("nan")
        cl, ch = _interval(rc[:, j], alpha)
        significant = bool(np.isfinite(dl) and (dl > 0 or dh < 0))
        changes.append(
            Change(name, spec.unit, spec.better, base, cur, cl, ch, cur - base, dl, dh, rel, rl, rh, options.level, significant)
        )
    return changes


def _interval(values: np.ndarray, alpha: float) -> tuple[float, float]:
    v = values[np.isfinite(values)]
    if len(v) < 0.9 * len(values) or len(v) == 0:
        return float("nan"), float("nan")
    lo, hi = np.quantile(v, [alpha, 1 - alpha])
    return float(lo), float(hi)
