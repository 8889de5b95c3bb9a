"""The sweep folder on disk (layout in docs/sweeps.md and /work/notes/interfaces.md).

::

    SWEEP/sweep.json                 the definition as run, bench version, sweep id
    SWEEP/cells.parquet              one row per cell (rewritten atomically on every change)
    SWEEP/recommendation.json        the recommendation with its evidence
    SWEEP/cell=<id>/engine.log
    SWEEP/cell=<id>/points.parquet   one row per load: configuration columns + metrics
    SWEEP/cell=<id>/load=<label>/    an ordinary run folder

``pyarrow.dataset.dataset(SWEEP, partitioning="hive")`` over the ``points.parquet`` files
is one dataset partitioned by cell, the configuration as columns.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from results.reader import read_parquet_file
from results.writer import write_table_atomic

SWEEP_FILE = "sweep.json"
CELLS_FILE = "cells.parquet"
POINTS_FILE = "points.parquet"
RECOMMENDATION_FILE = "recommendation.json"
PARTIAL_DIR = ".partial"

CELLS_SCHEMA = pa.schema(
    [
        pa.field("cell_id", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),  # complete | failed | skipped | running
        pa.field("reason", pa.string()),
        pa.field("log_tail", pa.string()),
        pa.field("tp", pa.int32()),
        pa.field("pp", pa.int32()),
        pa.field("dp", pa.int32()),
        pa.field("ep", pa.int32()),
        pa.field("dcp", pa.int32()),
        pa.field("pcp", pa.int32()),
        pa.field("disagg", pa.string()),
        pa.field("gpus", pa.int32()),
        pa.field("axes", pa.int32()),
        pa.field("tuning", pa.string()),  # tuning-axis values as JSON, {"max-num-seqs": "8"}; null: none
        pa.field("engine", pa.string()),
        pa.field("model", pa.string()),
        pa.field("gpu", pa.string()),
        pa.field("capacity_rps", pa.float64()),
        pa.field("capacity_rps_per_gpu", pa.float64()),
        pa.field("limiting_factor", pa.string()),
        pa.field("capacity_json", pa.string()),  # per workload: capacity, bracket, precision
        pa.field("engine_version", pa.string()),
        pa.field("engine_argv", pa.string()),
        pa.field("engine_info", pa.string()),
        # JSON: bench's version and git commit, nvidia-smi's GPUs, the model's config.json hash
        pa.field("fingerprint", pa.string()),  # JSON: what the engine says about itself (version, server info)
        pa.field("prefix_cache_reset", pa.string()),
        pa.field("started_unix_s", pa.float64()),
        pa.field("ended_unix_s", pa.float64()),
    ],
    metadata={"bench.table": "sweep_cells"},
)


def cell_dir(sweep: Path, cell_id: str) -> Path:
    return Path(sweep) / f"cell={cell_id}"


def write_sweep_json(sweep: Path, data: dict[str, Any]) -> None:
    sweep.mkdir(parents=True, exist_ok=True)
    tmp = sweep / f".{SWEEP_FILE}.tmp"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    os.replace(tmp, sweep / SWEEP_FILE)


def read_sweep_json(sweep: Path) -> dict[str, Any] | None:
    path = Path(sweep) / SWEEP_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def write_cells(sweep: Path, rows: list[dict[str, Any]]) -> None:
    cols = {name: [r.get(name) for r in rows] for name in CELLS_SCHEMA.names}
    write_table_atomic(pa.Table.from_pydict(cols, schema=CELLS_SCHEMA), Path(sweep) / CELLS_FILE)


def read_cells(sweep: Path) -> list[dict[str, Any]]:
    path = Path(sweep) / CELLS_FILE
    if not path.exists():
        return []
    return read_parquet_file(path).to_pylist()  # type: ignore[no-any-return]


def write_points(sweep: Path, cell_id: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    names: list[str] = []
    for r in rows:
        names.extend(k for k in r if k not in names)
    table = pa.Table.from_pylist([{k: r.get(k) for k in names} for r in rows])
    write_table_atomic(table, cell_dir(sweep, cell_id) / POINTS_FILE)


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


def write_recommendation(sweep: Path, data: dict[str, Any]) -> None:
    tmp = Path(sweep) / f".{RECOMMENDATION_FILE}.tmp"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=_json_default))
    os.replace(tmp, Path(sweep) / RECOMMENDATION_FILE)


def _json_default(o: Any) -> Any:
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
    except ImportError:
        pass
    return str(o)
