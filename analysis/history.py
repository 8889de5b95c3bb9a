"""The history of runs: what ``bench history`` stores, and the series ``bench trend`` and the
rolling-baseline gate read back (the store's layout is results/history.py).

Each configuration of a results folder (a run, repeats, or each cell and load of a sweep,
grouped as ``bench compare`` groups them) becomes one entry: its gated metrics as point
estimates, repeats pooled at the request level, computed by the same code as ``bench compare``
and ``bench gate`` (analysis/bootstrap.py), so a trend and a gate never disagree on a value.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from bench_llm.analysis.bootstrap import METRICS, make_side, point_estimates
from bench_llm.analysis.compare import group_runs
from bench_llm.analysis.load import Run, load_runs
from bench_llm.analysis.slo import SLO
from bench_llm.core.errors import BenchError
from bench_llm.results.history import History, Partition, read_history, run_folders
from bench_llm.results.reader import ResultsError, read_parquet_file
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


#: Workload settings that vary from night to night without changing what is measured.
_NOT_IDENTITY = frozenset({"seed", "prompt_salt"})


def _parsed(meta: Mapping[str, object], name: str) -> dict:
    value = meta.get(name)
    if isinstance(value, dict):
        return value
    text = meta.get(f"{name}_json")
    if isinstance(text, str):
        try:
            parsed = json.loads(text)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return text if isinstance(text, dict) else {}


def _flat(prefix: str, value: object, out: dict[str, object]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, (list, tuple)):
        out[prefix] = json.dumps(value, sort_keys=True, default=str)
    else:
        out[prefix] = value


def run_fingerprint(meta: Mapping[str, object]) -> dict[str, object]:
    """What a run measured, for comparing like with like: its workload and load (every setting
    of ``workload_json`` but the seeds: a nightly run draws new requests of the same kind), and
    the engine's identity (flavour, model, API). Not the engine's version, nor the simulated
    engine's timing: those are what a history measures the change of."""
    fp: dict[str, object] = {}
    _flat("", {k: v for k, v in _parsed(meta, "workload").items() if k not in _NOT_IDENTITY}, fp)
    fp["engine"] = meta.get("engine")
    fp["model"] = meta.get("model")
    fp["api"] = _parsed(meta, "config").get("api")
    return fp


def fingerprint_text(fp: Mapping[str, object]) -> str:
    return json.dumps(dict(fp), sort_keys=True, default=str)


def fingerprint_diff(new: Mapping[str, object], old: Mapping[str, object], limit: int = 4) -> str:
    """The settings that differ, as 'concurrency 8 vs 4, input_tokens 128 vs 64' (new first)."""
    keys = sorted(k for k in set(new) | set(old) if new.get(k) != old.get(k))
    parts = [f"{k} {_show(new.get(k))} vs {_show(old.get(k))}" for k in keys[:limit]]
    if len(keys) > limit:
        parts.append(f"and {len(keys) - limit} more")
    return ", ".join(parts) or "no difference"


def _show(v: object) -> str:
    return "unset" if v is None else (f"{v:g}" if isinstance(v, float) else str(v))


def _fp(text: object) -> dict[str, object] | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class Entry:
    """One configuration of one results folder, ready to store."""

    config_key: str
    entry_id: str
    runs: tuple[Run, ...]
    rows: pa.Table
    ok: int = 0  # measured requests that succeeded
    counted: int = 0  # measured requests, not counting those cancelled at the end
    fingerprint: str = ""


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
        fp = fingerprint_text(run_fingerprint(first.meta))
        ok = int(sum(float(r.requests["ok_count"].sum()) for r in side.runs))
        counted = int(sum(int(r.requests["failed"].notna().sum()) for r in side.runs))
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
                "fingerprint": [fp] * n,
            },
            schema=HISTORY_SCHEMA,
        )
        out.append(Entry(key, first.run_id, tuple(runs), rows, ok, counted, fp))
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
    #: what its runs measured (``run_fingerprint``, JSON); "" when not recorded
    fingerprint: str = ""
    #: how it differs from the configuration's newest runs ("" for the newest's own series)
    variant: str = ""

    @property
    def values(self) -> np.ndarray:
        return np.array([p.value for p in self.points], dtype=float)

    @property
    def label(self) -> str:
        key = self.config_key or "run"
        return f"{key} [{self.variant}]" if self.variant else key


@dataclass(frozen=True)
class StoreSeries:
    """The series of a store, what was separated (one line per configuration naming the
    difference) and what could not be read."""

    series: tuple[Series, ...]
    notes: tuple[str, ...]
    history: History


def _fp_groups(g: pd.DataFrame, key: str) -> tuple[list[tuple[str, pd.DataFrame, str]], list[str]]:
    """A configuration's rows split by fingerprint, newest first: (fingerprint, rows, variant).
    Rows without one (stored before fingerprints were) join the newest group."""
    known = g[g["fingerprint"].notna() & (g["fingerprint"] != "")]
    if known.empty or known["fingerprint"].nunique() == 1:
        fp = str(known["fingerprint"].iloc[0]) if not known.empty else ""
        return [(fp, g, "")], []
    order = known.sort_values(["date", "_start"]).drop_duplicates("fingerprint", keep="last")["fingerprint"].tolist()[::-1]
    newest = order[0]
    groups, notes = [], []
    new_fp = _fp(newest) or {}
    for fp in order:
        rows = g[(g["fingerprint"] == fp) | ((g["fingerprint"].isna() | (g["fingerprint"] == "")) & (fp == newest))]
        variant = "" if fp == newest else fingerprint_diff(_fp(fp) or {}, new_fp)
        groups.append((fp, rows, variant))
        if fp != newest:
            commits = rows["commit"].nunique()
            notes.append(f"configuration {key or 'run'}: {commits} commit(s) measured something else ({fingerprint_diff(new_fp, _fp(fp) or {})}, "
                         "newest first): a separate series, never compared with the newest runs")  # fmt: skip
    return groups, notes


def load_series(store: Path, metrics: Sequence[str] | None = None, since: str | None = None, last: int | None = None) -> StoreSeries:
    """Every (configuration, fingerprint, metric) series of the store, one point per commit in
    the order the commits were first measured (date, then run start). Several entries of one
    commit (re-runs) are pooled by their median. ``since`` / ``last``: results/history.py's
    ``read_history``; ``last`` also keeps only each series' last ``last`` points."""
    hist = read_history(store, since, last)
    df = hist.table.to_pandas()
    if metrics is not None:
        df = df[df["metric"].isin(list(metrics))]
    df = df[df["value"].notna()]
    if df.empty:
        return StoreSeries((), (), hist)
    df["_start"] = df["start_utc"].fillna(df["added_utc"])
    out, notes = [], []
    for key, g in df.groupby("config_key", sort=True):
        groups, why = _fp_groups(g, str(key))
        notes += why
        for fp, rows, variant in groups:
            for metric, m in rows.groupby("metric", sort=True):
                first_seen = m.groupby("commit").agg(date=("date", "min"), start=("_start", "min")).sort_values(["date", "start"])
                med = m.groupby("commit")["value"].agg(["median", "count"])
                points = tuple(
                    Point(str(first_seen.loc[c, "date"]), str(c), float(med.loc[c, "median"]), int(med.loc[c, "count"]))
                    for c in first_seen.index
                )
                if last is not None:
                    points = points[-last:]
                out.append(Series(str(key), str(metric), points, fp, variant))
    return StoreSeries(tuple(out), tuple(notes), hist)


def read_series(store: Path, metrics: Sequence[str] | None = None) -> list[Series]:
    """``load_series``'s series."""
    return list(load_series(store, metrics).series)


def fingerprint_change(store: Path, config_key: str, fingerprint: str) -> str | None:
    """How ``fingerprint`` differs from the newest stored entry of ``config_key`` among the
    store's last few commits (None when it does not, or there is none): said when a run is
    added, so that a changed workload is noticed the night it changes."""
    if not (Path(store) / "metrics").is_dir():
        return None
    df = read_history(store, last=5).table.to_pandas()
    df = df[(df["config_key"] == config_key) & df["fingerprint"].notna() & (df["fingerprint"] != "")]
    if df.empty:
        return None
    newest = df.sort_values(["date", "start_utc"])["fingerprint"].iloc[-1]
    if newest == fingerprint:
        return None
    return fingerprint_diff(_fp(fingerprint) or {}, _fp(newest) or {})


class NotComparable(BenchError, ValueError):
    """The current run measured something other than the stored runs it would be judged by."""


def _bad_file(folder: Path) -> str:
    """The first unreadable Parquet file of a stored run folder, for the message."""
    for path in sorted(Path(folder).rglob("*.parquet")):
        try:
            read_parquet_file(path)
        except (ResultsError, OSError, pa.ArrowException):  # the reader names the file as a ResultsError
            return str(path)
    return str(folder)


def rolling_baseline(
    store: Path, config_key: str, window: int, exclude_runs: Sequence[str] = (), fingerprint: Mapping[str, object] | None = None,
    history: History | None = None,
) -> tuple[list[Run], list[str]]:
    """The stored runs of the last ``window`` comparable entries of a configuration (by date,
    then start), leaving out ``exclude_runs`` (the run being judged, if it was already added),
    and notes on what was left out.

    Comparable: the same ``fingerprint`` (entries stored without one count as comparable).
    Entries of the configuration exist but none is comparable: ``NotComparable``, naming the
    difference. A stored run that cannot be read is left out and named; when none is left,
    ``ResultsError`` names it. ``history``: the store as already read (one read for several
    configurations)."""
    hist = history if history is not None else read_history(store)
    notes = [n for n in [hist.skipped_note()] if n]
    df = hist.table.to_pandas()
    df = df[(df["config_key"] == config_key) & ~df["run_id"].isin(list(exclude_runs))]
    if df.empty:
        return [], notes
    df["_start"] = df["start_utc"].fillna(df["added_utc"])
    if fingerprint is not None:
        mine = fingerprint_text(fingerprint)
        same = df["fingerprint"].isna() | (df["fingerprint"] == "") | (df["fingerprint"] == mine)
        if not same.any():
            newest = df.sort_values(["date", "_start"])["fingerprint"].iloc[-1]
            raise NotComparable(
                f"not comparable: the current run of configuration {config_key or 'run'!r} measured something other than "
                f"every stored entry of it ({fingerprint_diff(fingerprint, _fp(newest) or {})}; current vs newest stored); "
                "refusing to judge it against them"
            )
        other = df.loc[~same, "run_id"].nunique()
        if other:
            notes.append(f"{config_key or 'run'}: {other} stored entr{'y' if other == 1 else 'ies'} measured something else, left out of the baseline")
        df = df[same]
    last = df.drop_duplicates(["date", "commit", "config", "run_id"]).sort_values(["date", "_start"]).tail(window)
    runs: list[Run] = []
    bad: list[str] = []
    for r in last.itertuples():
        for d in run_folders(store, Partition(str(r.date), str(r.commit), str(r.config)), str(r.run_id)):
            try:
                runs += load_runs(d)
            except (ResultsError, OSError, pa.ArrowException, ValueError) as exc:
                bad.append(f"{_bad_file(d)} ({str(exc).splitlines()[0][:160]})")
    if bad:
        if not runs:
            raise ResultsError(f"no stored run of configuration {config_key or 'run'!r} is readable: {'; '.join(bad[:3])}")
        notes.append(f"{len(bad)} stored run(s) unreadable, left out of the baseline: {'; '.join(bad[:3])}")
    return runs, notes
