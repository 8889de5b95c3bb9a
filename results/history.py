"""A results store: the history of many runs as one partitioned Parquet dataset.

Layout (docs/results.md, "A history of runs")::

    STORE/metrics/date=2026-12-01/commit=3f2a…/config=tp1__rate-2/<entry>.parquet
    STORE/runs/date=2026-12-01/commit=3f2a…/config=tp1__rate-2/run=<entry>/  (the run folder(s))

``metrics`` is long format (``HISTORY_SCHEMA``, one row per metric); ``date``, ``commit`` and
``config`` are Hive partitions, so DuckDB (``hive_partitioning``), pandas, Polars or Spark read
the whole history with one glob, and a dashboard filters on them without opening files. The
store may be a local folder or a synced copy of an object-store prefix: every file is written
once, under a hidden name, and renamed into place.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from bench_llm.results.reader import ResultsError
from bench_llm.results.schema import HISTORY_METRICS_DIR, HISTORY_RUNS_DIR, HISTORY_SCHEMA
from bench_llm.results.writer import write_table_atomic

_UNSAFE = re.compile(r"[^A-Za-z0-9_.,+-]+")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_COMMIT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def config_slug(key: str) -> str:
    """A configuration key as a folder name: 'tp1 / rate=2' -> 'tp1__rate-2' ('run' when empty).

    The exact key is kept in the rows (``config_key``); the slug only has to be stable and safe
    in paths and Hive partition values ('=' and '/' would break them)."""
    if not key:
        return "run"
    slug = _UNSAFE.sub("_", key.replace(" / ", "__").replace("=", "-")).strip("_")
    return slug[:120] or "run"


@dataclass(frozen=True)
class Partition:
    date: str  # YYYY-MM-DD (UTC)
    commit: str
    config: str  # slug

    def __post_init__(self) -> None:
        if not _DATE.match(self.date):
            raise ValueError(f"date {self.date!r} is not YYYY-MM-DD")
        if not _COMMIT.match(self.commit):
            raise ValueError(f"commit {self.commit!r}: use 1-64 letters, digits, '.', '_' or '-'")

    @property
    def path(self) -> str:
        return f"date={self.date}/commit={self.commit}/config={self.config}"


@dataclass(frozen=True)
class StoredEntry:
    metrics_file: Path
    run_folders: tuple[Path, ...]


def add_entry(store: Path, part: Partition, entry_id: str, rows: pa.Table, run_dirs: Sequence[Path]) -> StoredEntry:
    """Store one configuration's result: its metric rows and a copy of its run folder(s).

    Refuses an entry id already stored under the same partition (adding a run twice would
    weigh it twice in every trend)."""
    if rows.schema != HISTORY_SCHEMA:
        rows = rows.cast(HISTORY_SCHEMA)
    safe_id = config_slug(entry_id)
    metrics_file = Path(store) / HISTORY_METRICS_DIR / part.path / f"{safe_id}.parquet"
    if metrics_file.exists():
        raise ResultsError(f"{metrics_file}: already in the store (entry {entry_id!r})")
    copies = []
    for i, src in enumerate(run_dirs):
        name = f"run={safe_id}" if len(run_dirs) == 1 else f"run={safe_id}-{i}"
        dst = Path(store) / HISTORY_RUNS_DIR / part.path / name
        tmp = dst.with_name(f".{dst.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
        copies.append(dst)
    write_table_atomic(rows, metrics_file)  # last: the row is the entry's commit point
    return StoredEntry(metrics_file, tuple(copies))


def read_history(store: Path) -> pa.Table:
    """Every metric row of the store, with ``date``, ``commit`` and ``config`` columns."""
    root = Path(store) / HISTORY_METRICS_DIR
    if not root.is_dir():
        raise ResultsError(f"{store}: not a results store (no {HISTORY_METRICS_DIR}/ folder; add runs with `bench history`)")
    partitioning = ds.partitioning(pa.schema([("date", pa.string()), ("commit", pa.string()), ("config", pa.string())]), flavor="hive")
    dataset = ds.dataset(root, format="parquet", partitioning=partitioning, ignore_prefixes=[".", "_"])
    return dataset.to_table()


def run_folders(store: Path, part: Partition, entry_id: str) -> list[Path]:
    """The stored copies of one entry's run folders."""
    base = Path(store) / HISTORY_RUNS_DIR / part.path
    name = f"run={config_slug(entry_id)}"
    return sorted(p for p in base.glob(f"{name}*") if p.is_dir() and (p.name == name or re.fullmatch(re.escape(name) + r"-\d+", p.name)))
