"""Loading a run folder into the tables analysis works on."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from results.reader import find_runs, read_monitor, read_requests, read_run_meta
from results.schema import REQUESTS_DIR, REQUESTS_SCHEMA


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


#: Part files are read in groups of about this many bytes (a recorded run writes a part of
#: at most 256 rows a second): per-batch work then runs on batches of ``batch_rows`` rows,
#: not on thousands of tiny ones.
GROUP_BYTES = 4 << 20


def _file_groups(files: list[str], group_bytes: int) -> list[list[str]]:
    """Consecutive files in groups of at least ``group_bytes`` bytes (the last may be smaller)."""
    groups: list[list[str]] = []
    current: list[str] = []
    size = 0
    for f in files:
        current.append(f)
        size += os.path.getsize(f)
        if size >= group_bytes:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


def iter_request_batches(
    run_dir: Path, columns: list[str] | None = None, batch_rows: int = 4096, threads: int | None = None
) -> Iterator[pa.RecordBatch]:
    """The requests table of one run folder, record batch by record batch (only ``columns``),
    in file order.

    Part files are decoded by ``threads`` worker threads (default: one per core), a group of
    files (``GROUP_BYTES``) per task, each group made contiguous there (off the caller's
    thread) and cut into batches of ``batch_rows`` rows. A few groups are decoded ahead, so
    memory stays bounded by the group size whatever the run's length; a file much larger
    than a group (a run compacted by hand) is streamed batch by batch instead. Yields one
    empty batch when there are no rows.
    """
    folder = Path(run_dir) / REQUESTS_DIR
    files = sorted(str(p) for p in folder.glob("*.parquet") if not p.name.startswith(".")) if folder.is_dir() else []
    schema = REQUESTS_SCHEMA if columns is None else pa.schema([REQUESTS_SCHEMA.field(c) for c in columns])
    if not files:
        yield pa.RecordBatch.from_pylist([], schema=schema)
        return
    workers = max(1, threads or os.cpu_count() or 1)

    def read(group: list[str]) -> list[pa.RecordBatch] | None:
        if len(group) == 1 and os.path.getsize(group[0]) > 4 * GROUP_BYTES:
            return None  # streamed by the caller
        dataset = ds.dataset(group, format="parquet", schema=REQUESTS_SCHEMA)
        table = dataset.to_table(columns=columns, use_threads=False).combine_chunks()
        return table.to_batches(max_chunksize=batch_rows)

    def stream(path: str) -> Iterator[pa.RecordBatch]:
        dataset = ds.dataset([path], format="parquet", schema=REQUESTS_SCHEMA)
        yield from dataset.to_batches(columns=columns, batch_size=batch_rows, batch_readahead=2)

    pending: deque[tuple[list[str], Future[list[pa.RecordBatch] | None]]] = deque()
    groups = iter(_file_groups(files, GROUP_BYTES))
    yielded = False
    with ThreadPoolExecutor(workers, thread_name_prefix="bench-read") as pool:
        try:
            for group in groups:
                pending.append((group, pool.submit(read, group)))
                if len(pending) > workers:
                    break
            while pending:
                group, future = pending.popleft()
                batches = future.result()
                nxt = next(groups, None)
                if nxt is not None:
                    pending.append((nxt, pool.submit(read, nxt)))
                for batch in stream(group[0]) if batches is None else batches:
                    yielded = True
                    yield batch
            if not yielded:
                yield pa.RecordBatch.from_pylist([], schema=schema)
        finally:
            for _, future in pending:
                future.cancel()
