"""The master's side of the results: one ordinary run folder built from the workers' parts.

Workers stream their part files (``requests/part-<worker>-<seq>.parquet`` and
``client_monitor/...``) as they are flushed; the master stores them unchanged, writes
``schedule.parquet`` (the whole schedule) and ``run.parquet`` itself. The folder is then
what a single-machine run writes, with ``worker_id`` telling the workers apart and the
distribution facts in ``extra_json["distributed"]``.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench_llm.bench.run_meta import run_meta, utc_now
from bench_llm.core.errors import BenchError
from bench_llm.results.reader import read_requests
from bench_llm.results.schema import MONITOR_DIR, REQUESTS_DIR
from bench_llm.results.writer import compact_finished_run, write_run_meta, write_schedule
from bench_llm.workloads.spec import Schedule

_PART_NAME = re.compile(r"^part-\d{3,}-\d{6,}\.parquet$")
_TABLES = {"requests": REQUESTS_DIR, "client_monitor": MONITOR_DIR}


class PartRejected(BenchError, ValueError):
    """A worker's part of a distributed run that cannot be assembled."""


class RunAssembly:
    """Collects one distributed run into ``run_dir`` (already prepared and empty)."""

    def __init__(self, run_dir: Path, run_id: str, schedule: Schedule, base_meta: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.run_id = run_id
        self.schedule = schedule
        self.rows_by_worker: Counter[int] = Counter()
        clock = "perf_counter_ns (user space, at read); workers' readings moved onto the master's timeline"
        self.meta: dict[str, Any] = run_meta(run_id, base_meta, clock=clock)
        write_run_meta(run_dir, self.meta)
        write_schedule(run_dir, schedule.requests)

    def add_part(self, worker_id: int, table: str, name: str, data: bytes) -> int:
        """Store one part file from a worker; returns its row count."""
        folder = _TABLES.get(table)
        if folder is None or not _PART_NAME.match(name) or int(name.split("-")[1]) != worker_id:
            raise PartRejected(f"worker {worker_id} sent an unexpected part {table}/{name}")
        try:
            rows = pq.read_metadata(pa.BufferReader(data)).num_rows
        except (pa.ArrowInvalid, OSError) as exc:
            raise PartRejected(f"worker {worker_id}: part {table}/{name} is not Parquet ({exc})") from None
        path = self.run_dir / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        if table == "requests":
            self.rows_by_worker[worker_id] += rows
        return rows

    def measured_by_worker(self) -> dict[int, int]:
        """Measured (non-warm-up) rows on disk per worker, read back through the reader."""
        table = read_requests(self.run_dir, ["worker_id", "phase"])
        counts: Counter[int] = Counter()
        for wid, phase in zip(table["worker_id"].to_pylist(), table["phase"].to_pylist()):
            if phase == "measure":
                counts[int(wid)] += 1
        return dict(counts)

    def finish(self, status: str, notes: dict[str, Any], extra: dict[str, Any], t0_ns: int) -> None:
        self.meta.update(status=status, end_utc=utc_now(), notes_json=notes, t0_monotonic_ns=t0_ns)
        self.meta["extra_json"] = {**(self.meta.get("extra_json") or {}), **extra}
        write_run_meta(self.run_dir, self.meta)
        compact_finished_run(self.run_dir)  # every worker's rows are in: few large files for readers
