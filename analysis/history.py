"""The history of runs: what ``bench history`` stores, and the series ``bench trend`` and the
rolling-baseline gate read back (the store's layout is results/history.py).

Each configuration of a results folder (a run, repeats, or each cell and load of a sweep,
grouped as ``bench compare`` groups them) becomes one entry: its gated metrics as point
estimates, repeats pooled at the request level, computed by the same code as ``bench compare``
and ``bench gate`` (analysis/bootstrap.py), so a trend and a gate never disagree on a value.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench_llm.analysis.bootstrap import METRICS, make_side, point_estimates
from bench_llm.analysis.compare import group_runs
from bench_llm.analysis.load import Run, load_runs
from bench_llm.analysis.slo import SLO
from bench_llm.results.history import Partition, read_history, run_folders
from bench_llm.results.schema import HISTORY_SCHEMA

#: Metrics stored when no gate configuration names them.
DEFAULT_HISTORY_METRICS: tuple[str, ...] = (
    "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms", "itl_p50_ms", "itl_p99_ms",
    "e2e_p50_ms", "e2e_p95_ms", "requests_per_s", "output_tokens_per_s", "error_rate",
)  # fmt: skip


#: The host's condition during the run, stored beside the metrics of every entry and never
#: gated: the median lag of the client's event loop (client_monitor), in ms. It rises when the
#: client's host is loaded; where the engine shares that host (the simulated engine, a CI
#: runner) it stands for the engine's host too. ``bench trend`` reads it to tell a change of
#: the host from a change of the code (analysis/trend.py). Absent for runs without a monitor
#: (virtual time).
HOST_LAG_METRIC = "host_loop_lag_p50_ms"


def host_lag_ms(runs: Sequence[Run]) -> float | None:
    """Median event-loop lag of the client over the runs' monitor samples (None without any)."""
    lags = [
        r.monitor["loop_lag_ns"].to_numpy(zero_copy_only=False).astype(float)
        for r in runs
        if r.monitor is not None and "loop_lag_ns" in r.monitor.column_names and r.monitor.num_rows
    ]
    values = np.concatenate(lags) if lags else np.array([])
    values = values[np.isfinite(values)]
    return float(np.median(values)) / 1e6 if len(values) else None


@dataclass(frozen=True)
class Entry:
    """One configuration of one results folder, ready to store."""

    config_key: str
    entry_id: str
    runs: tuple[Run, ...]
    rows: pa.Table


def _start(run: Run) -> _dt.datetime | None:
    v = run.meta.get("start_utc")
    return v if isinstance(v, _dt.datetime) else None


def entries(results: Path, metrics: Sequence[str] = DEFAULT_HISTORY_METRICS, slo: SLO = SLO()) -> list[Entry]:
    """One entry per configuration of ``results``, with its metrics' point estimates."""
    names = [m for m in metrics if slo or not METRICS[m].needs_slo]
    now = _dt.datetime.now(_dt.timezone.utc)
    out = []
    for key, runs in group_runs(load_runs(results)).items():
        side = make_side([r.requests for r in runs], slo, [r.run_id for r in runs])
        values = {m: float(v) if np.isfinite(v) else None for m, v in point_estimates(side, names).items()}
        lag = host_lag_ms(runs)
        stored = [*names, HOST_LAG_METRIC] if lag is not None else list(names)
        if lag is not None:
            values[HOST_LAG_METRIC] = lag
        first = runs[0]
        starts = [s for s in (_start(r) for r in runs) if s is not None]
        n = len(stored)
        rows = pa.table(
            {
                "run_id": [first.run_id] * n,
                "config_key": [key] * n,
                "start_utc": [min(starts) if starts else None] * n,
                "added_utc": [now] * n,
                "engine": [first.meta.get("engine")] * n,
                "model": [first.meta.get("model")] * n,
                "bench_version": [first.meta.get("bench_version")] * n,
                "runs": [len(runs)] * n,
                "requests": [side.n_requests] * n,
                "metric": stored,
                "value": [values[m] for m in stored],
            },
            schema=HISTORY_SCHEMA,
        )
        out.append(Entry(key, first.run_id, tuple(runs), rows))
    return out


def entry_date(entry: Entry) -> str:
    """The UTC date of the entry's first run (today when the run does not say)."""
    starts = [s for s in (_start(r) for r in entry.runs) if s is not None]
    day = min(starts) if starts else _dt.datetime.now(_dt.timezone.utc)
    return day.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d")


@dataclass(frozen=True)
class Point:
    """One commit's value of one metric of one configuration."""

    date: str
    commit: str
    value: float
    entries: int  # stored entries pooled (median) into this point


@dataclass(frozen=True)
class Series:
    config_key: str
    metric: str
    points: tuple[Point, ...]

    @property
    def values(self) -> np.ndarray:
        return np.array([p.value for p in self.points], dtype=float)


def read_series(store: Path, metrics: Sequence[str] | None = None) -> list[Series]:
    """Every (configuration, metric) series of the store, one point per commit in the order the
    commits were first measured (date, then run start). Several entries of one commit (re-runs)
    are pooled by their median."""
    df = read_history(store).to_pandas()
    if metrics is not None:
        df = df[df["metric"].isin(list(metrics))]
    df = df[df["value"].notna()]
    if df.empty:
        return []
    df["_start"] = df["start_utc"].fillna(df["added_utc"])
    out = []
    for (key, metric), g in df.groupby(["config_key", "metric"], sort=True):
        first_seen = g.groupby("commit").agg(date=("date", "min"), start=("_start", "min")).sort_values(["date", "start"])
        med = g.groupby("commit")["value"].agg(["median", "count"])
        points = tuple(
            Point(str(first_seen.loc[c, "date"]), str(c), float(med.loc[c, "median"]), int(med.loc[c, "count"])) for c in first_seen.index
        )
        out.append(Series(str(key), str(metric), points))
    return out


def rolling_baseline(store: Path, config_key: str, window: int, exclude_runs: Sequence[str] = ()) -> list[Run]:
    """The stored runs of the last ``window`` entries of a configuration (by date, then start),
    leaving out ``exclude_runs`` (the run being judged, if it was already added)."""
    df = read_history(store).to_pandas()
    df = df[(df["config_key"] == config_key) & ~df["run_id"].isin(list(exclude_runs))]
    if df.empty:
        return []
    df["_start"] = df["start_utc"].fillna(df["added_utc"])
    last = df.drop_duplicates(["date", "commit", "config", "run_id"]).sort_values(["date", "_start"]).tail(window)
    runs: list[Run] = []
    for r in last.itertuples():
        for d in run_folders(store, Partition(str(r.date), str(r.commit), str(r.config)), str(r.run_id)):
            runs += load_runs(d)
    return runs
