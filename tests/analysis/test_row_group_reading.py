"""A compacted run is read row group by row group (issue 20): the same rows and figures as
reading it whole, in memory that does not grow with the number of row groups."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

import bench_llm.analysis.load as load
from bench_llm.analysis.load import iter_request_batches, load_run
from bench_llm.analysis.summary import SUMMARY_BATCH_ROWS, summarize, summarize_run
from bench_llm.results.reader import read_requests
from bench_llm.results.schema import REQUESTS_DIR
from bench_llm.results.writer import ROW_GROUP_ROWS, compact_requests
from tests.analysis.test_summary_fast_path import OPTIONS, _many_parts
from tests.results.test_compaction_memory import _arrow_peak, _compact, _part, _parts


def _json(summary: object) -> str:
    return json.dumps(summary.to_json(), sort_keys=True, default=str)  # type: ignore[attr-defined]


def test_default_row_groups_are_whole_summary_batches() -> None:
    assert ROW_GROUP_ROWS % SUMMARY_BATCH_ROWS == 0  # a group is streamed as whole batches


def test_reading_group_by_group_gives_the_figures_of_the_whole_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    _many_parts(run_dir, 20)
    whole = read_requests(run_dir)
    groups = -(-whole.num_rows // 32)
    want = _json(summarize(whole, OPTIONS))
    if not compact_requests(run_dir, file_bytes=1 << 30, row_group_rows=32):
        pytest.skip("no atomic directory swap (renameat2 RENAME_EXCHANGE) on this platform or file system")
    assert len(list((run_dir / REQUESTS_DIR).glob("*.parquet"))) == 1  # one file of several row groups
    monkeypatch.setattr(load, "GROUP_BYTES", 1)  # every row group a task of its own
    tasks = load._read_tasks(sorted(str(p) for p in (run_dir / REQUESTS_DIR).glob("*.parquet")), 1)
    assert groups >= 6 and [t[0].row_groups for t in tasks] == [(i,) for i in range(groups)]
    batches = list(iter_request_batches(run_dir, batch_rows=16))
    assert all(0 < b.num_rows <= 16 for b in batches)
    assert pa.Table.from_batches(batches).equals(whole) and load_run(run_dir).requests.equals(whole)
    assert _json(summarize_run(run_dir, OPTIONS)) == want


def test_reading_a_compacted_run_holds_a_few_row_groups_whatever_their_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks of one row group each (a run's file is read whole only while it is smaller
    than a task, ``GROUP_BYTES``: these files are a few hundred kB)."""
    monkeypatch.setattr(load, "GROUP_BYTES", 1)
    group_rows = 256
    peaks = {}
    for n in (8, 64):
        run_dir = tmp_path / str(n)
        _parts(run_dir, n)
        _compact(run_dir, group_rows)
        pieces = list(load._pieces(sorted(str(p) for p in (run_dir / REQUESTS_DIR).glob("*.parquet")), load.GROUP_BYTES))
        assert len(pieces) == n // 2  # row groups of two parts
        rows = 0
        with _arrow_peak() as pool:
            for batch in iter_request_batches(run_dir, ["request_id", "chunk_ns", "chunk_tokens"], batch_rows=128):
                rows += batch.num_rows  # each batch dropped once counted
        assert rows == n * 128
        peaks[n] = pool.max_memory()
    whole = 64 * _part(0).nbytes
    assert peaks[64] < 1.5 * peaks[8]  # eight times the row groups, about the same peak
    assert peaks[64] < whole / 4
