"""Reading run folders back. Used by analysis; knows only the on-disk contract."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from bench_llm.core.errors import BenchError
from bench_llm.results.schema import (
    MONITOR_DIR,
    REQUESTS_DIR,
    REQUESTS_SCHEMA,
    RUN_FILE,
    SCHEMA_VERSION,
    SERVER_METRICS_DIR,
    SERVER_SPANS_FILE,
)


class ResultsError(BenchError):
    """A folder that is not a readable bench run."""


def _check_version(version: str | None, where: Path) -> None:
    if version is None:
        return
    major = version.split(".")[0]
    if major != SCHEMA_VERSION.split(".")[0]:
        raise ResultsError(f"{where}: schema version {version} is not readable by this bench (expects {SCHEMA_VERSION})")


def read_parquet_file(path: Path | str, columns: list[str] | None = None) -> pa.Table:
    """One Parquet file, read through a single open handle.

    Files that are rewritten in place while a run or sweep goes on (``run.parquet``,
    ``cells.parquet``, ``points.parquet``) are replaced atomically by a rename, but
    ``pq.read_table(path)`` opens the path twice (footer, then pages): a rename in between
    pairs one file's footer with the other's pages (a torn read, "Page was smaller than
    expected", in about a quarter of reads while a writer rewrote the file in a loop). One
    handle reads one version whole.

    The handle is Arrow's own (``pa.OSFile``), not a Python file: pages read through a Python
    file are Python buffers, and Arrow's I/O threads release the last of them after the read
    returns. One released while the interpreter exits takes the GIL from a finalizing
    interpreter, and the process aborts ("terminate called without an active exception",
    exit 134): measured, in 11 of 60 processes that read a sweep's 128 files and exited, and in
    3 of 40 runs of the README's main job with two busy loops, after its last line (with this
    handle: 0 of 100 and 0 of 40).
    """
    try:
        with pa.OSFile(str(path)) as f:
            return pq.read_table(f, columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path: Path | str, exc: Exception) -> ResultsError:
    """The one-line error of a Parquet file that cannot be read (truncated, not Parquet),
    naming the file (Arrow's own message names none)."""
    why = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else (str(exc).splitlines() or ["?"])[0]
    return ResultsError(f"{path}: not a readable Parquet file ({why})")


def _parquet_file(path: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise _unreadable(path, exc) from None


def find_runs(path: Path) -> list[Path]:
    """Run folders at or below ``path`` (a run folder, a sweep folder, or a parent)."""
    path = Path(path)
    if not path.exists():
        raise ResultsError(f"{path}: no such file or folder")
    if (path / RUN_FILE).exists():
        return [path]
    runs = sorted(p.parent for p in path.rglob(RUN_FILE) if not any(part.startswith(".") for part in p.parts))
    if not runs:
        raise ResultsError(f"{path}: no bench run found (no {RUN_FILE} below it)")
    return runs


def read_run_meta(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / RUN_FILE
    try:
        table = read_parquet_file(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ResultsError(f"{path}: unreadable run metadata ({exc})") from None
    return run_meta_of(table, path)


def run_meta_of(table: pa.Table, path: Path) -> dict[str, Any]:
    """The run metadata in a run table (``path``: where it is, or will be, for messages): its
    row, and each ``*_json`` text also parsed under the name without the suffix."""
    meta: dict[str, Any] = table.to_pylist()[0]
    _check_version(meta.get("schema_version"), path)
    for key in list(meta):
        if key.endswith("_json") and isinstance(meta[key], str):
            meta[key[: -len("_json")]] = json.loads(meta[key])
    return meta


def _read_parts(folder: Path, schema: pa.Schema | None = None, columns: list[str] | None = None) -> pa.Table | None:
    if not folder.is_dir():
        return None
    files = sorted(str(p) for p in folder.glob("*.parquet") if not p.name.startswith("."))
    if not files:
        return None
    if schema is not None:
        wanted = schema if columns is None else pa.schema([schema.field(c) for c in columns])
        return _read_files(files, wanted)
    dataset = ds.dataset(files, format="parquet", schema=schema)
    return dataset.to_table(columns=columns)


def read_part(path: str, schema: pa.Schema, row_groups: Sequence[int] | None = None) -> pa.Table:
    """One part file, or only its ``row_groups``, as ``schema`` (columns it lacks are null,
    types cast as a dataset would).

    Row groups are decoded one at a time, each into its own chunk (decoding one holds about
    three times its decoded size for a moment: the compressed pages, the decoded ones, the
    arrays being built), so a read's peak is set by the row group, not by how many are read."""
    parquet = _parquet_file(path)
    have = set(parquet.schema_arrow.names)
    columns = [n for n in schema.names if n in have]
    if row_groups is None and parquet.metadata.num_row_groups <= 1:
        table = parquet.read(columns=columns, use_threads=False)
    else:
        groups = range(parquet.metadata.num_row_groups) if row_groups is None else row_groups
        table = pa.concat_tables(
            [parquet.read_row_group(i, columns=columns, use_threads=False) for i in groups]
            or [parquet.schema_arrow.empty_table().select(columns)]
        )
    return conform(table, schema, have)


def iter_part_batches(path: str, schema: pa.Schema, row_group: int, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """One row group of a part file as ``schema``, ``batch_rows`` rows at a time (for a
    row group too large to decode at once)."""
    parquet = _parquet_file(path)
    have = set(parquet.schema_arrow.names)
    columns = [n for n in schema.names if n in have]
    for batch in parquet.iter_batches(batch_rows, row_groups=[row_group], columns=columns, use_threads=False):
        yield from conform(pa.Table.from_batches([batch]), schema, have).to_batches()


def row_group_bytes(path: str) -> list[int]:
    """The compressed size of each row group of a Parquet file (from its footer)."""
    meta = _parquet_file(path).metadata
    return [
        sum(meta.row_group(i).column(j).total_compressed_size for j in range(meta.num_columns))
        for i in range(meta.num_row_groups)
    ]


def conform(table: pa.Table, schema: pa.Schema, have: set[str] | None = None) -> pa.Table:
    """``table`` as ``schema``: the columns it lacks added as nulls, the order and types of ``schema``."""
    have = set(table.column_names) if have is None else have
    for i, field in enumerate(schema):
        if field.name not in have:
            table = table.add_column(i, field.name, pa.nulls(table.num_rows, field.type))
    return table.select(schema.names).cast(schema)


def _read_files(files: list[str], schema: pa.Schema) -> pa.Table:
    """Part files read file by file on a thread per core: for a recorded run's thousands of
    small parts this costs about two thirds of a dataset scan's time and half its memory
    (measured: 1M requests in 3907 parts, the summary's per-request columns)."""
    if len(files) == 1:
        return read_part(files[0], schema)
    with ThreadPoolExecutor(max(1, os.cpu_count() or 1), thread_name_prefix="bench-parts") as pool:
        return pa.concat_tables(list(pool.map(lambda f: read_part(f, schema), files)))


def read_requests(run_dir: Path, columns: list[str] | None = None) -> pa.Table:
    """All request rows of one run (empty table with the schema if none were written)."""
    table = _read_parts(Path(run_dir) / REQUESTS_DIR, REQUESTS_SCHEMA, columns)
    if table is None:
        schema = REQUESTS_SCHEMA if columns is None else pa.schema([REQUESTS_SCHEMA.field(c) for c in columns])
        return schema.empty_table()
    return table


def read_monitor(run_dir: Path) -> pa.Table | None:
    return _read_parts(Path(run_dir) / MONITOR_DIR)


def read_server_metrics(run_dir: Path) -> pa.Table | None:
    return _read_parts(Path(run_dir) / SERVER_METRICS_DIR)


def read_server_spans(run_dir: Path) -> pa.Table | None:
    """The engine's per-request spans received during the run (``SERVER_SPANS_SCHEMA``), or
    None when the run had no OTLP receiver or no span arrived."""
    path = Path(run_dir) / SERVER_SPANS_FILE
    return pq.read_table(path) if path.exists() else None
