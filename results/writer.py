"""Incremental, crash-safe Parquet writing.

Rows are buffered and written as small self-contained part files (``part-W-NNNNNN``),
each renamed into place atomically, so a reader never sees half a file. A flush
happens when ``flush_rows`` rows are pending or ``flush_interval_s`` has passed since
the last flush; a SIGKILL therefore loses at most one interval's worth of rows (1 s or
256 requests by default). ``close()`` flushes the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench_llm.core.memory import return_freed_memory
from bench_llm.core.redact import redact
from bench_llm.results.record import RequestRecord
from bench_llm.results.schema import (
    MONITOR_DIR,
    MONITOR_SCHEMA,
    REQUESTS_DIR,
    REQUESTS_SCHEMA,
    RUN_FILE,
    RUN_SCHEMA,
    SCHEDULE_FILE,
    SCHEDULE_SCHEMA,
    SERVER_METRICS_DIR,
    SERVER_METRICS_SCHEMA,
)

_RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))

#: A part file is written when this many rows are pending, or this long after the last one
#: (the bound on what a ``kill -9`` can lose; docs/results.md).
FLUSH_ROWS = 256
FLUSH_INTERVAL_S = 1.0


def _delta_encoded_columns(schema: pa.Schema) -> dict[str, str]:
    """Parquet leaf paths of the integer-list columns (``chunk_ns``, ``chunk_tokens``), which
    are written DELTA_BINARY_PACKED: an encoding, not a type, so every Parquet reader
    (pyarrow, pandas, DuckDB) decodes it transparently. Consecutive chunk times differ by a
    few ms, which packs into ~20 of 64 bits before zstd; decoding is about twice as fast
    as zstd-compressed PLAIN (measured: 1M requests x 256 tokens, benchmarks/instrument.py scale).
    """
    return {
        f"{f.name}.list.element": "DELTA_BINARY_PACKED"
        for f in schema
        if pa.types.is_list(f.type) and pa.types.is_integer(f.type.value_type)
    }


def write_table_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` via a hidden temporary file and a rename.

    Dictionary encoding only for string columns: for the per-chunk timestamp and token
    lists it makes files larger and reading slower (measured on 200k × 256-token requests:
    zstd without it 197 MB and 1.31 s to read the lists, with it 203 MB and 1.73 s). Those
    lists are delta-encoded instead (``_delta_encoded_columns``).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        pq.write_table(table, tmp, **_parquet_options(table.schema))
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a read-only folder: no temporary file left, the path named
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if exc.filename is None or exc.filename == str(tmp):  # Arrow's errors carry no path
            why = os.strerror(exc.errno) if exc.errno else (str(exc).splitlines() or ["write failed"])[0]
            raise OSError(exc.errno, why, str(path)) from exc
        raise


def _parquet_options(schema: pa.Schema) -> dict[str, Any]:
    strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    return {
        "compression": "zstd",
        "use_dictionary": strings or False,
        "column_encoding": _delta_encoded_columns(schema) or None,
    }


class PartWriter:
    """Buffers rows (as dicts) for one table and writes numbered part files."""

    def __init__(
        self,
        folder: Path,
        schema: pa.Schema,
        worker_id: int = 0,
        flush_rows: int = FLUSH_ROWS,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        constants: Mapping[str, Any] | None = None,
    ) -> None:
        self.folder = folder
        self.schema = schema
        self.worker_id = worker_id
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.constants = dict(constants or {})
        self._pending: list[dict[str, Any]] = []
        self._seq = 0
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()
        self.rows_written = 0
        folder.mkdir(parents=True, exist_ok=True)

    def add(self, row: dict[str, Any]) -> None:
        self._pending.append(row)

    @property
    def due(self) -> bool:
        return bool(self._pending) and (
            len(self._pending) >= self.flush_rows or time.monotonic() - self._last_flush >= self.flush_interval_s
        )

    def take(self) -> list[dict[str, Any]]:
        """Detach the pending rows (cheap; call from the event loop)."""
        rows, self._pending = self._pending, []
        self._last_flush = time.monotonic()
        return rows

    def write(self, rows: Sequence[dict[str, Any]]) -> None:
        """Write ``rows`` as one part file (may run in a worker thread)."""
        if not rows:
            return
        columns: dict[str, list[Any]] = {name: [] for name in self.schema.names}
        for name, value in self.constants.items():
            columns[name] = [value] * len(rows)
        fill = [n for n in self.schema.names if n not in self.constants]
        for row in rows:
            for name in fill:
                columns[name].append(row.get(name))
        table = pa.Table.from_pydict(columns, schema=self.schema)
        with self._lock:
            seq = self._seq
            self._seq += 1
            write_table_atomic(table, self.folder / f"part-{self.worker_id:03d}-{seq:06d}.parquet")
            self.rows_written += len(rows)

    def flush(self) -> None:
        self.write(self.take())


class RequestsWriter(PartWriter):
    """The requests table of one run (or one worker of a run)."""

    def __init__(self, run_dir: Path, run_id: str, worker_id: int = 0, **kwargs: Any) -> None:
        super().__init__(run_dir / REQUESTS_DIR, REQUESTS_SCHEMA, worker_id, constants={"run_id": run_id}, **kwargs)

    def add_record(self, record: RequestRecord) -> None:
        self.add({name: getattr(record, name) for name in _RECORD_FIELDS})


class MonitorWriter(PartWriter):
    def __init__(self, run_dir: Path, worker_id: int = 0) -> None:
        super().__init__(run_dir / MONITOR_DIR, MONITOR_SCHEMA, worker_id, flush_rows=4096, flush_interval_s=2.0)


def write_run_meta(run_dir: Path, meta: Mapping[str, Any]) -> None:
    """Write (or rewrite) the one-row run table. Dict/list values become JSON text."""
    write_table_atomic(run_meta_table(meta), run_dir / RUN_FILE)


def run_meta_table(meta: Mapping[str, Any]) -> pa.Table:
    """The one-row run table ``write_run_meta`` writes (dict/list values as JSON text; the
    credentials of any URL in its text redacted: the command line, the adapter's URL, notes)."""
    row: dict[str, list[Any]] = {}
    for name in RUN_SCHEMA.names:
        value = meta.get(name)
        if name.endswith("_json") and value is not None and not isinstance(value, str):
            value = json.dumps(value, sort_keys=True, default=str)
        row[name] = [redact(value) if isinstance(value, str) else value]  # a URL's credentials (core.redact)
    return pa.Table.from_pydict(row, schema=RUN_SCHEMA)


def write_schedule(run_dir: Path, specs: Iterable[Any]) -> None:
    """Store the precomputed schedule (``RequestSpec``-like objects) with the run."""
    cols: dict[str, list[Any]] = {name: [] for name in SCHEDULE_SCHEMA.names}
    for s in specs:
        cols["request_id"].append(s.request_id)
        cols["phase"].append(s.phase)
        cols["send_offset_ns"].append(s.send_offset_ns)
        cols["input_tokens"].append(s.input_tokens)
        cols["max_output_tokens"].append(s.max_output_tokens)
        cols["session_id"].append(s.session_id)
        cols["turn"].append(s.turn)
        cols["think_time_ns"].append(s.think_time_ns)
        cols["prefix_group"].append(s.prefix_group)
        cols["input_tokens_source"].append(s.input_tokens_source)
        cols["length_class"].append(getattr(s, "length_class", None))
        cols["after"].append(list(getattr(s, "after", ())))
        cols["after_delay_ns"].append(list(getattr(s, "after_delay_ns", ())))
        cols["context_from"].append(getattr(s, "context_from", None))
    write_table_atomic(pa.Table.from_pydict(cols, schema=SCHEDULE_SCHEMA), run_dir / SCHEDULE_FILE)


#: ``compact_parts`` writes files of about this many bytes of parts each (so readers that
#: take a file per thread still find several files in a long run).
COMPACT_BYTES = 12 << 20
#: Rows per row group of a compacted requests file. The merge holds at most one row group
#: of rows beside the part being read (about 6 MB of Arrow data at 256 tokens per request),
#: so its memory does not grow with the run; a reader streaming row group by row group
#: (``analysis.load.iter_request_batches``, DuckDB, ``pyarrow.parquet.ParquetFile.iter_batches``)
#: holds as little. A multiple of the summary's batch (``analysis.summary.SUMMARY_BATCH_ROWS``),
#: large enough that the fixed cost per row group (its footer entry, page headers, a
#: dictionary page per string column) stays small beside the rows (docs/results.md, Row groups).
ROW_GROUP_ROWS = 2048
#: Rows per row group of the compacted client-monitor and server-metrics files: their rows
#: are a few dozen bytes each.
NARROW_ROW_GROUP_ROWS = 65536


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``); False where
    the platform or file system does not offer it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    return bool(renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0)


#: Runs with fewer request part files than this are left as they are.
COMPACT_MIN_PARTS = 16


def compact_finished_run(run_dir: Path) -> None:
    """At the end of a run (every writer closed): ``compact_requests``, and the same for the
    client-monitor and server-metrics parts (a part a second or two each: a long run leaves
    thousands, which cost ``bench summary`` most of a second to open). Must never fail the
    run: on an OSError (a full disk) the parts stay as they are, with a one-line note on
    stderr; the run is complete either way. What the recording freed, and then what the
    merge freed, is handed back to the OS first (``core.memory``)."""
    return_freed_memory()
    for folder, schema, group_rows in (
        (REQUESTS_DIR, REQUESTS_SCHEMA, ROW_GROUP_ROWS),
        (MONITOR_DIR, MONITOR_SCHEMA, NARROW_ROW_GROUP_ROWS),
        (SERVER_METRICS_DIR, SERVER_METRICS_SCHEMA, NARROW_ROW_GROUP_ROWS),
    ):
        try:
            compact_parts(Path(run_dir) / folder, schema, min_parts=COMPACT_MIN_PARTS, row_group_rows=group_rows)
        except OSError as exc:
            sys.stderr.write(f"note: the {folder} part files were left unmerged ({exc})\n")
    return_freed_memory()


def compact_requests(
    run_dir: Path, file_bytes: int = COMPACT_BYTES, min_parts: int = COMPACT_MIN_PARTS, row_group_rows: int = ROW_GROUP_ROWS
) -> bool:
    """``compact_parts`` of a finished run's requests table."""
    return compact_parts(Path(run_dir) / REQUESTS_DIR, REQUESTS_SCHEMA, file_bytes, min_parts, row_group_rows)


class _RowGroupFiles:
    """Tables appended in order, written as row groups of exactly ``group_rows`` rows (the
    last one may hold fewer) through one ``ParquetWriter`` per file; a file is closed after
    the row group that brings the input it took to ``file_bytes`` bytes. Holds fewer than
    ``group_rows`` rows between calls, and writes a group from the parts' own buffers (a
    chunked table; Arrow's writer takes it as it is, never made contiguous)."""

    def __init__(self, folder: Path, schema: pa.Schema, file_bytes: int, group_rows: int) -> None:
        self.folder, self.schema, self.file_bytes, self.group_rows = folder, schema, file_bytes, max(1, group_rows)
        self._options = _parquet_options(schema)
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._file_bytes_in = 0
        self._files = 0
        self.rows_out = 0

    def add(self, table: pa.Table, size: int) -> None:
        """Append ``table`` (whose part file held ``size`` bytes)."""
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self._file_bytes_in += size
        while self._pending_rows >= self.group_rows:
            rows = pa.concat_tables(self._pending)  # zero-copy: the chunks stay the parts' arrays
            rest = rows.slice(self.group_rows)
            self._pending, self._pending_rows = ([rest] if rest.num_rows else []), rest.num_rows
            self._write_group(rows.slice(0, self.group_rows))

    def finish(self) -> None:
        if self._pending_rows:
            self._write_group(pa.concat_tables(self._pending))
            self._pending, self._pending_rows = [], 0
        self._close_file()

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _write_group(self, rows: pa.Table) -> None:
        if self._writer is None:
            path = self.folder / f"part-000-{self._files:06d}.parquet"
            self._writer = pq.ParquetWriter(path, self.schema, **self._options)
            self._files += 1
        self._writer.write_table(rows, row_group_size=rows.num_rows)
        self.rows_out += rows.num_rows
        if self._file_bytes_in >= self.file_bytes:
            self._close_file()  # the rows still pending go to the next file

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._file_bytes_in = 0


def compact_parts(
    folder: Path,
    schema: pa.Schema,
    file_bytes: int = COMPACT_BYTES,
    min_parts: int = COMPACT_MIN_PARTS,
    row_group_rows: int = ROW_GROUP_ROWS,
) -> bool:
    """Rewrite the part files of one table of a finished run (``folder``, e.g. ``requests/``)
    as fewer, larger ones (about ``file_bytes`` of parts each) made of row groups of
    ``row_group_rows`` rows: the same rows in the same order (file names keep sorting in
    that order), the same schema and encodings.

    A recorded run has a part per second or per 256 requests (the crash-loss bound), so a
    long one has thousands, and every reader then pays a file's fixed costs thousands of
    times (1M requests x 256 tokens: 3907 parts; ``bench summary`` about 1.8x slower than
    on files of 16k rows). Call it once every writer of the run is closed.

    Memory: parts are read one at a time and written a row group at a time
    (``_RowGroupFiles``), so the merge holds about one row group and one part whatever the
    run's length.

    Crash-safe: the new files go to a hidden sibling folder, which is swapped with
    ``folder`` in one atomic step (a reader of ``folder/*.parquet`` sees either the old
    parts or the new files, never both or neither); the old parts are deleted afterwards. A
    crash leaves at most a hidden folder behind. Returns False, changing nothing, with fewer
    than ``min_parts`` parts or where the atomic swap is not available (non-Linux).
    """
    from bench_llm.results.reader import read_part

    folder = Path(folder)
    files = sorted(str(p) for p in folder.glob("*.parquet") if not p.name.startswith(".")) if folder.is_dir() else []
    if len(files) < min_parts:
        return False
    staging = folder.parent / f".{folder.name}.compact"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    out = _RowGroupFiles(staging, schema, file_bytes, row_group_rows)
    rows_in = 0
    try:
        for f in files:
            table = read_part(f, schema)
            rows_in += table.num_rows
            out.add(table, os.path.getsize(f))
            del table
        out.finish()
        if out.rows_out != rows_in or not _exchange(staging, folder):
            shutil.rmtree(staging, ignore_errors=True)
            return False
    except BaseException:
        out.abort()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(staging, ignore_errors=True)  # now the old parts
    return True
