"""Writing the sweep folder. Its layout (file names, the cell table's schema) is declared
once in ``results/sweep_layout.py``, which analysis reads it by; the names are re-exported
here for bench's callers.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench_llm.analysis.recommend_types import Recommendation, recommendation_json
from bench_llm.core.redact import redact, redact_value
from bench_llm.results.sweep_layout import (
    CELL_PREFIX,
    CELLS_FILE,
    CELLS_SCHEMA,
    LOAD_PREFIX,
    PARTIAL_DIR,
    POINTS_FILE,
    RECOMMENDATION_FILE,
    SWEEP_FILE,
    cell_dir,
    load_dir,
    read_cells_table,
    read_sweep_json,
)
from bench_llm.results.sweep_rows import CellRow, PointRow, SweepFile, point_rows
from bench_llm.results.writer import write_table_atomic

__all__ = [
    "CELL_PREFIX", "CELLS_FILE", "CELLS_SCHEMA", "LOAD_PREFIX", "PARTIAL_DIR", "POINTS_FILE", "RECOMMENDATION_FILE",
    "SWEEP_FILE", "cell_dir", "load_dir", "read_cell_rows", "read_cells", "read_points", "read_sweep_file", "read_sweep_json",
    "set_aside_partial", "write_cell_rows", "write_cells",
    "write_points", "write_recommendation", "write_sweep_json",
]


def write_sweep_json(sweep: Path, data: SweepFile | dict[str, Any]) -> None:
    """``sweep.json`` (a ``SweepFile``; a payload as it is, for tests of older files)."""
    payload = data.to_row() if isinstance(data, SweepFile) else data
    sweep.mkdir(parents=True, exist_ok=True)
    tmp = sweep / f".{SWEEP_FILE}.tmp"
    tmp.write_text(redact(json.dumps(payload, indent=2, sort_keys=True, default=str)))  # URLs' credentials
    os.replace(tmp, sweep / SWEEP_FILE)


def read_sweep_file(sweep: Path) -> SweepFile | None:
    """``sweep.json`` as a ``SweepFile`` (None: absent)."""
    data = read_sweep_json(sweep)
    return None if data is None else SweepFile.from_row(data)


def write_cells(sweep: Path, rows: list[dict[str, Any]]) -> None:
    cols = {name: [redact_value(r.get(name)) for r in rows] for name in CELLS_SCHEMA.names}
    write_table_atomic(pa.Table.from_pydict(cols, schema=CELLS_SCHEMA), Path(sweep) / CELLS_FILE)


def write_cell_rows(sweep: Path, rows: list[CellRow]) -> None:
    """``cells.parquet`` from typed rows (``write_cells``)."""
    write_cells(sweep, [r.to_row() for r in rows])


def read_cell_rows(sweep: Path) -> list[CellRow]:
    return [CellRow.from_row(r) for r in read_cells(sweep)]


def read_points(sweep: Path, cell_id: str) -> list[PointRow]:
    """A cell's ``points.parquet`` rows (none: no file)."""
    from bench_llm.results.reader import read_parquet_file

    path = cell_dir(sweep, cell_id) / POINTS_FILE
    return [PointRow.from_row(r) for r in read_parquet_file(path).to_pylist()] if path.exists() else []


def read_cells(sweep: Path) -> list[dict[str, Any]]:
    table = read_cells_table(sweep)
    return [] if table is None else table.to_pylist()  # type: ignore[no-any-return]


def write_points(sweep: Path, cell_id: str, points: list[PointRow], name: str = POINTS_FILE) -> None:
    if not points:
        return
    rows = point_rows(points)
    names: list[str] = []
    for r in rows:
        names.extend(k for k in r if k not in names)
    table = pa.Table.from_pylist([{k: redact_value(r.get(k)) for k in names} for r in rows])
    write_table_atomic(table, cell_dir(sweep, cell_id) / name)


def set_aside_partial(sweep: Path, cell_id: str, folder: Path | None = None) -> Path | None:
    """Move an unfinished cell's folder (or one load folder of it) under .partial/
    (kept, but out of the results)."""
    src = folder if folder is not None else cell_dir(sweep, cell_id)
    if not src.exists():
        return None
    name = src.name if folder is None else f"{cell_dir(sweep, cell_id).name}-{src.name}"
    dest = Path(sweep) / PARTIAL_DIR / f"{name}-{time.time_ns()}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), str(dest))
    return dest


def write_recommendation(sweep: Path, rec: Recommendation) -> None:
    """``recommendation.json``, written atomically (the text is ``recommendation_json``'s)."""
    tmp = Path(sweep) / f".{RECOMMENDATION_FILE}.tmp"
    tmp.write_text(recommendation_json(rec))
    os.replace(tmp, Path(sweep) / RECOMMENDATION_FILE)
