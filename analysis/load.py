"""Loading a run folder into the tables analysis works on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator
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


def iter_request_batches(run_dir: Path, columns: list[str] | None = None, batch_rows: int = 4096) -> Iterator[pa.RecordBatch]:
    """The requests table of one run folder, record batch by record batch (only ``columns``).

    A few batches are decoded ahead (on Arrow's threads), so memory stays bounded by the
    batch size whatever the run's length. Yields one empty batch when there are no rows.
    """
    folder = Path(run_dir) / REQUESTS_DIR
    files = sorted(str(p) for p in folder.glob("*.parquet") if not p.name.startswith(".")) if folder.is_dir() else []
    schema = REQUESTS_SCHEMA if columns is None else pa.schema([REQUESTS_SCHEMA.field(c) for c in columns])
    if not files:
        yield pa.RecordBatch.from_pylist([], schema=schema)
        return
    dataset = ds.dataset(files, format="parquet", schema=REQUESTS_SCHEMA)
    yield from dataset.to_batches(columns=columns, batch_size=batch_rows, batch_readahead=2, fragment_readahead=2)
