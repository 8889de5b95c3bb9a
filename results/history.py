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
import pyarrow.parquet as pq

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


#: Columns an entry's metrics file cannot be read without; the others are filled with nulls
#: when absent (a file written before they existed, e.g. ``fingerprint``).
REQUIRED_COLUMNS = ("run_id", "config_key", "metric", "value")
_PART = re.compile(r"^date=(\d{4}-\d{2}-\d{2})/commit=([^/]+)/config=([^/]+)$")
_READ_SCHEMA = pa.schema([*HISTORY_SCHEMA, pa.field("date", pa.string()), pa.field("commit", pa.string()), pa.field("config", pa.string())])


@dataclass(frozen=True)
class SkippedFile:
    """A file of the store that could not be read: left out, named, counted."""

    path: Path
    reason: str


@dataclass(frozen=True)
class History:
    """The metric rows read from a store (``date``, ``commit``, ``config`` added from the
    partition folders), and the files that could not be read."""

    table: pa.Table
    files: int  # metrics files read
    skipped: tuple[SkippedFile, ...] = ()

    def skipped_note(self) -> str | None:
        if not self.skipped:
            return None
        shown = "; ".join(f"{s.path}: {s.reason}" for s in self.skipped[:3])
        more = f"; and {len(self.skipped) - 3} more" if len(self.skipped) > 3 else ""
        return f"skipped {len(self.skipped)} unreadable file(s) of the store ({len(self.skipped) + self.files} in all): {shown}{more}"


def _partitions(root: Path) -> list[tuple[str, str, str, Path]]:
    """(date, commit, config, folder) of every partition folder under ``root``."""
    out = []
    for date_dir in root.glob("date=*"):
        for commit_dir in date_dir.glob("commit=*"):
            for config_dir in commit_dir.glob("config=*"):
                m = _PART.match(f"{date_dir.name}/{commit_dir.name}/{config_dir.name}")
                if m and config_dir.is_dir():
                    out.append((m.group(1), m.group(2), m.group(3), config_dir))
    return sorted(out)


def _read_entry(path: Path, date: str, commit: str, config: str) -> pa.Table:
    """One entry's metrics file as ``_READ_SCHEMA`` rows; ResultsError (the reason) when it
    cannot be read or lacks a required column."""
    try:
        with pa.OSFile(str(path)) as f:  # one handle, Arrow's own (results/reader.read_parquet_file says why)
            table = pq.ParquetFile(f).read(use_threads=False)  # a small file: threads cost more than they save (3x)
    except (OSError, pa.ArrowException) as exc:
        raise ResultsError(f"not a readable Parquet file ({str(exc).splitlines()[0][:160]})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise ResultsError(f"missing column(s) {', '.join(missing)}")
    n = table.num_rows
    cols = {}
    for f in HISTORY_SCHEMA:
        if f.name in table.column_names:
            try:
                cols[f.name] = table[f.name].cast(f.type)
            except (pa.ArrowException, ValueError) as exc:
                raise ResultsError(f"column {f.name} is not {f.type} ({str(exc).splitlines()[0][:120]})") from None
        else:
            cols[f.name] = pa.nulls(n, f.type)
    for name, value in (("date", date), ("commit", commit), ("config", config)):
        cols[name] = pa.array([value] * n, pa.string())
    return pa.Table.from_pydict(cols, schema=_READ_SCHEMA)


def read_history(store: Path, since: str | None = None, last: int | None = None) -> History:
    """The metric rows of the store, with ``date``, ``commit`` and ``config`` columns.

    ``since`` (YYYY-MM-DD): only partitions of that date or later. ``last``: only the
    partitions of the last ``last`` commits by date (every commit of the earliest date kept
    is read: within a day the order is the runs' start, which the rows tell). Only those
    files are opened. A file that cannot be read (corrupt, not Parquet, a required column
    missing) is skipped and listed in ``History.skipped``; the rest of the store is read."""
    root = Path(store) / HISTORY_METRICS_DIR
    if not root.is_dir():
        raise ResultsError(f"{store}: not a results store (no {HISTORY_METRICS_DIR}/ folder; add runs with `bench history`)")
    if since is not None and not _DATE.match(since):
        raise ValueError(f"since {since!r} is not YYYY-MM-DD")
    parts = _partitions(root)
    if since is not None:
        parts = [p for p in parts if p[0] >= since]
    if last is not None:
        if last < 1:
            raise ValueError("last must be >= 1 commit")
        first_date: dict[str, str] = {}
        for date, commit, _, _ in parts:
            first_date.setdefault(commit, date)
        dates = sorted(first_date.values())
        cutoff = dates[-last] if len(dates) >= last else ""
        keep = {c for c, d in first_date.items() if d >= cutoff}
        parts = [p for p in parts if p[1] in keep]
    tables, skipped = [], []
    for date, commit, config, folder in parts:
        for path in sorted(folder.glob("*.parquet")):
            if path.name.startswith((".", "_")):
                continue
            try:
                tables.append(_read_entry(path, date, commit, config))
            except ResultsError as exc:
                skipped.append(SkippedFile(path, str(exc)))
    table = pa.concat_tables(tables) if tables else _READ_SCHEMA.empty_table()
    return History(table, len(tables), tuple(skipped))


def run_folders(store: Path, part: Partition, entry_id: str) -> list[Path]:
    """The stored copies of one entry's run folders."""
    base = Path(store) / HISTORY_RUNS_DIR / part.path
    name = f"run={config_slug(entry_id)}"
    return sorted(p for p in base.glob(f"{name}*") if p.is_dir() and (p.name == name or re.fullmatch(re.escape(name) + r"-\d+", p.name)))
