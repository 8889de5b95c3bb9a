"""Files rewritten while a run or sweep goes on (run.parquet, cells.parquet) are read whole:
never one version's footer with another's pages."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa

from bench.sweep.store import read_cells
from results.reader import read_parquet_file, read_run_meta
from results.writer import write_run_meta, write_table_atomic


def test_reads_during_atomic_rewrites_see_one_whole_version(tmp_path: Path) -> None:
    """A writer replaces the files (tmp + rename) as fast as it can for a second; every read
    meanwhile returns one complete version. Opened by path twice (footer, then pages), about
    a quarter of such reads failed ("Page was smaller than expected")."""
    cells = tmp_path / "cells.parquet"
    versions = [pa.table({"cell_id": [f"c{i}" for i in range(n)], "status": ["complete"] * n}) for n in (3, 40)]
    metas = [{"run_id": "r", "schema_version": "1.0", "bench_version": "0", "status": s, "model": "m" * n}
             for s, n in (("running", 3), ("complete", 400))]
    write_table_atomic(versions[0], cells)
    write_run_meta(tmp_path, metas[0])
    stop = threading.Event()
    rewrites = [0]

    def rewrite() -> None:
        while not stop.is_set():
            i = rewrites[0] % 2
            write_table_atomic(versions[i], cells)
            write_run_meta(tmp_path, metas[i])
            rewrites[0] += 1

    writer = threading.Thread(target=rewrite)
    writer.start()
    reads = 0
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert read_parquet_file(cells).num_rows in (3, 40)
            assert [r["cell_id"] for r in read_cells(tmp_path)][:3] == ["c0", "c1", "c2"]
            assert read_run_meta(tmp_path)["status"] in ("running", "complete")
            reads += 1
    finally:
        stop.set()
        writer.join(10)
    assert rewrites[0] > 20 and reads > 20  # the two really overlapped
