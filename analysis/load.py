"""Loading a run folder into the tables analysis works on."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from bench_llm.results.reader import (
    find_runs,
    iter_part_batches,
    read_monitor,
    read_part,
    read_requests,
    read_run_meta,
    row_group_bytes,
)
from bench_llm.results.schema import REQUESTS_DIR, REQUESTS_SCHEMA


@dataclass(frozen=True)
class Run:
    path: Path
    meta: dict[str, Any]
    requests: pa.Table  # every row, warm-up included
    monitor: pa.Table | None

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id", self.path.name))


def load_run(path: Path, columns: list[str] | None = None) -> Run:
    runs = find_runs(Path(path))
    if len(runs) != 1:
        raise ValueError(f"{path}: holds {len(runs)} runs; name one run folder")
    run_dir = runs[0]
    return Run(run_dir, read_run_meta(run_dir), read_requests(run_dir, columns), read_monitor(run_dir))


def load_runs(path: Path, columns: list[str] | None = None) -> list[Run]:
    return [Run(p, read_run_meta(p), read_requests(p, columns), read_monitor(p)) for p in find_runs(Path(path))]


#: The requests table is read in tasks of at most this many compressed bytes: several part
#: files (a recorded run writes a part of at most 256 rows a second), or row groups of a
#: compacted file (``results.writer.ROW_GROUP_ROWS`` rows, about 2 MB at 256 tokens, each).
#: Per-batch work then runs on batches of ``batch_rows`` rows, not on thousands of tiny
#: ones, and a task's memory does not depend on the size of the files. 2 MB rather than
#: 4 MB: 10-17 MB less at the peak of ``bench summary`` on 24,576 requests, no slower.
GROUP_BYTES = 2 << 20


class _Piece(NamedTuple):
    """Some consecutive row groups of one file (``row_groups`` None: all of them)."""

    path: str
    row_groups: tuple[int, ...] | None
    size: int  # compressed bytes


def _pieces(files: list[str], group_bytes: int) -> Iterator[_Piece]:
    """Each file whole when it is at most ``group_bytes`` (a part file; its size from the
    file system), else each of its row groups (its footer read)."""
    for f in files:
        size = os.path.getsize(f)
        if size <= group_bytes:
            yield _Piece(f, None, size)
            continue
        for i, group in enumerate(row_group_bytes(f)):
            yield _Piece(f, (i,), group)


def _read_tasks(files: list[str], group_bytes: int) -> list[list[_Piece]]:
    """Consecutive pieces in tasks of at most ``group_bytes`` bytes (or of one piece larger
    than that), the row groups of one file in a task merged into one piece."""
    tasks: list[list[_Piece]] = []
    current: list[_Piece] = []
    size = 0
    for piece in _pieces(files, group_bytes):
        if current and size + piece.size > group_bytes:
            tasks.append(current)
            current, size = [], 0
        last = current[-1] if current else None
        if last is not None and last.path == piece.path and last.row_groups is not None and piece.row_groups is not None:
            current[-1] = _Piece(piece.path, last.row_groups + piece.row_groups, last.size + piece.size)
        else:
            current.append(piece)
        size += piece.size
    if current:
        tasks.append(current)
    return tasks


def iter_request_batches(
    run_dir: Path, columns: list[str] | None = None, batch_rows: int = 4096, threads: int | None = None
) -> Iterator[pa.RecordBatch]:
    """The requests table of one run folder, record batch by record batch (only ``columns``),
    in file order.

    The table is decoded by ``threads`` worker threads (default: one per core), a task of at
    most ``GROUP_BYTES`` per thread (``_read_tasks``: part files, made contiguous there, off
    the caller's thread; or row groups of a compacted file, decoded one at a time and kept as
    they are), cut into batches of ``batch_rows`` rows. A few tasks are decoded ahead, so
    memory stays bounded by the task size whatever the run's length; a single row group much
    larger than a task (a file compacted by other tools) is streamed batch by batch instead.
    Yields one empty batch when there are no rows.
    """
    folder = Path(run_dir) / REQUESTS_DIR
    files = sorted(str(p) for p in folder.glob("*.parquet") if not p.name.startswith(".")) if folder.is_dir() else []
    schema = REQUESTS_SCHEMA if columns is None else pa.schema([REQUESTS_SCHEMA.field(c) for c in columns])
    if not files:
        yield pa.RecordBatch.from_pylist([], schema=schema)
        return
    workers = max(1, threads or os.cpu_count() or 1)

    def streamed(task: list[_Piece]) -> bool:
        return len(task) == 1 and task[0].size > 4 * GROUP_BYTES and len(task[0].row_groups or (0,)) == 1

    def read(task: list[_Piece]) -> list[pa.RecordBatch] | None:
        if streamed(task):
            return None  # streamed by the caller
        tables = [read_part(p.path, schema, p.row_groups) for p in task]
        if any(p.row_groups is not None for p in task):  # row groups: batches of their own arrays, no copy
            return [b for t in tables for b in t.to_batches(max_chunksize=batch_rows)]
        # part files of a few hundred rows each: made contiguous, so batches have batch_rows rows
        table = (tables[0] if len(tables) == 1 else pa.concat_tables(tables)).combine_chunks()
        return table.to_batches(max_chunksize=batch_rows)

    def stream(piece: _Piece) -> Iterator[pa.RecordBatch]:
        yield from iter_part_batches(piece.path, schema, (piece.row_groups or (0,))[0], batch_rows)

    pending: deque[tuple[list[_Piece], Future[list[pa.RecordBatch] | None]]] = deque()
    tasks = iter(_read_tasks(files, GROUP_BYTES))
    yielded = False
    with ThreadPoolExecutor(workers, thread_name_prefix="bench-read") as pool:
        try:
            for task in tasks:
                pending.append((task, pool.submit(read, task)))
                if len(pending) > workers:
                    break
            while pending:
                task, future = pending.popleft()
                batches = future.result()
                nxt = next(tasks, None)
                if nxt is not None:
                    pending.append((nxt, pool.submit(read, nxt)))
                for batch in stream(task[0]) if batches is None else batches:
                    yielded = True
                    yield batch
            if not yielded:
                yield pa.RecordBatch.from_pylist([], schema=schema)
        finally:
            for _, future in pending:
                future.cancel()
