"""The merge of a finished run's part files holds about one row group, whatever the run's
length (issue 20: peak memory at 1024 streams), and writes row groups of the chosen size."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench_llm.results.reader import read_requests
from bench_llm.results.schema import REQUESTS_DIR, REQUESTS_SCHEMA
from bench_llm.results.writer import compact_parts, write_table_atomic

ROWS_PER_PART = 128
TOKENS = 64


def _part(k: int, rows: int = ROWS_PER_PART, tokens: int = TOKENS) -> pa.Table:
    """A part file's table: ``rows`` requests of ``tokens`` one-token chunks each."""
    rng = np.random.default_rng(k)
    stamps = np.cumsum(rng.integers(1, 10**7, (rows, tokens)), axis=1)
    offsets = pa.array(np.arange(0, (rows + 1) * tokens, tokens, dtype=np.int32))
    cols = {
        "run_id": pa.array(["t"] * rows),
        "request_id": pa.array([f"r{k:04d}-{i:04d}" for i in range(rows)]),
        "phase": pa.array(["measure"] * rows),
        "worker_id": pa.array(np.zeros(rows, np.int32)),
        "intended_send_ns": pa.array(stamps[:, 0] - 1000),
        "output_tokens": pa.array(np.full(rows, tokens, np.int32)),
        "token_source": pa.array(["server_cumulative"] * rows),
        "input_tokens_target": pa.array(np.full(rows, 4, np.int32)),
        "max_output_tokens": pa.array(np.full(rows, tokens, np.int32)),
        "ok": pa.array(np.ones(rows, bool)),
        "chunk_ns": pa.ListArray.from_arrays(offsets, pa.array(stamps.ravel())),
        "chunk_tokens": pa.ListArray.from_arrays(offsets, pa.array(np.ones(rows * tokens, np.int32))),
    }
    return pa.table({f.name: cols.get(f.name, pa.nulls(rows, f.type)) for f in REQUESTS_SCHEMA}, schema=REQUESTS_SCHEMA)


def _parts(run_dir: Path, n: int) -> None:
    for k in range(n):
        write_table_atomic(_part(k), run_dir / REQUESTS_DIR / f"part-000-{k:06d}.parquet")


#: Every pool ``_arrow_peak`` made: a buffer allocated from one may outlive the block (a
#: reader thread's), and frees through it, so a pool is never destroyed.
_POOLS: list[pa.MemoryPool] = []


@contextmanager
def _arrow_peak() -> Iterator[pa.MemoryPool]:
    """Arrow's allocations in the block, counted by a fresh pool (its ``max_memory()``)."""
    default = pa.default_memory_pool()
    proxy = pa.proxy_memory_pool(default)
    _POOLS.append(proxy)
    pa.set_memory_pool(proxy)
    try:
        yield proxy
    finally:
        pa.set_memory_pool(default)


def _compact(run_dir: Path, group_rows: int) -> int:
    """Compact ``run_dir``'s requests; Arrow's peak allocation meanwhile (bytes)."""
    with _arrow_peak() as pool:
        done = compact_parts(run_dir / REQUESTS_DIR, REQUESTS_SCHEMA, min_parts=2, row_group_rows=group_rows)
    if not done:
        pytest.skip("no atomic directory swap (renameat2 RENAME_EXCHANGE) on this platform or file system")
    return int(pool.max_memory())


def test_merge_peak_does_not_grow_with_the_number_of_parts(tmp_path: Path) -> None:
    group_rows = 2 * ROWS_PER_PART
    peaks = {}
    for n in (8, 64):
        _parts(tmp_path / str(n), n)
        peaks[n] = _compact(tmp_path / str(n), group_rows)
    one_group = 2 * _part(0).nbytes
    # eight times the parts, about the same peak: a few row groups' worth, far below the run
    assert peaks[64] < 1.5 * peaks[8]
    assert peaks[64] < 4 * one_group < 64 * _part(0).nbytes / 4


def test_merged_files_hold_row_groups_of_the_chosen_size_rows_in_order(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    n = 37  # 37 x 128 rows: 18 groups of 256 and a last one of 128
    _parts(run_dir, n)
    before = read_requests(run_dir)
    _compact(run_dir, 256)
    files = sorted((run_dir / REQUESTS_DIR).glob("*.parquet"))
    sizes = [pq.ParquetFile(f).metadata.row_group(i).num_rows for f in files for i in range(pq.ParquetFile(f).metadata.num_row_groups)]
    assert sizes == [256] * 18 + [128]
    after = read_requests(run_dir)
    assert after.equals(before) and after.schema.equals(REQUESTS_SCHEMA, check_metadata=True)

