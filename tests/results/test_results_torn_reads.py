"""Files rewritten while a run or sweep goes on (run.parquet, cells.parquet) are read whole:
never one version's footer with another's pages."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa

from bench_llm.bench.sweep.store import read_cells
from bench_llm.results.reader import read_parquet_file, read_run_meta
from bench_llm.results.writer import write_run_meta, write_table_atomic


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


_READ_THEN_EXIT = """
import sys
from pathlib import Path
from bench_llm.results.reader import read_parquet_file
for f in sorted(Path(sys.argv[1]).glob("*.parquet")):
    read_parquet_file(f)
"""


def test_a_process_that_read_parquet_files_exits_cleanly(tmp_path: Path) -> None:
    """Processes that read 100 files and exit at once all exit 0. Read through a Python file
    object, the last pages were Python buffers that Arrow's I/O threads released after the read;
    one released during the interpreter's exit aborted the process (exit 134) in about one
    process of six, so at least one of twelve would abort (about 90 % of the time)."""
    import numpy as np
    import pyarrow.parquet as pq

    from tests.conftest import REPO

    files = tmp_path / "files"
    files.mkdir()
    for i in range(100):
        rows = np.random.default_rng(i).random(1000)
        pq.write_table(pa.table({"a": np.arange(1000), "b": rows, "c": [f"s{j}" for j in range(1000)]}), files / f"{i}.parquet")
    ends = []
    for _ in range(12):  # one after another: side by side, the exits seldom race the I/O threads
        r = subprocess.run([sys.executable, "-c", _READ_THEN_EXIT, str(files)], cwd=REPO, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        ends.append((r.returncode, r.stderr))
    assert [code for code, _ in ends] == [0] * 12, [err[-300:] for code, err in ends if code]
