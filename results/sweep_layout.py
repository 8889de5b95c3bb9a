"""The sweep folder on disk, declared once (docs/sweeps.md): bench/sweep writes it,
analysis reads it.

::

    SWEEP/sweep.json                 the definition as run, bench version, sweep id
    SWEEP/cells.parquet              one row per cell (rewritten atomically on every change)
    SWEEP/recommendation.json        the recommendation with its evidence
    SWEEP/cell=<id>/engine.log
    SWEEP/cell=<id>/points.parquet   one row per load: configuration columns + metrics
    SWEEP/cell=<id>/load=<label>/    an ordinary run folder (results/schema.py)
    SWEEP/.partial/                  unfinished cells and loads, set aside

``pyarrow.dataset.dataset(SWEEP, partitioning="hive")`` over the ``points.parquet`` files
is one dataset partitioned by cell, the configuration as columns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench_llm.results.reader import read_parquet_file
from bench_llm.results.schema import MODEL_ERROR_FIELDS

SWEEP_FILE = "sweep.json"
CELLS_FILE = "cells.parquet"
POINTS_FILE = "points.parquet"
RECOMMENDATION_FILE = "recommendation.json"
PARTIAL_DIR = ".partial"
#: Hive partition prefixes: ``cell=<id>`` folders, ``load=<label>`` run folders in them.
CELL_PREFIX = "cell="
LOAD_PREFIX = "load="

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
        pa.field("engine_info", pa.string()),  # JSON: what the engine says about itself (version, server info)
        # JSON: bench's version and git commit, nvidia-smi's GPUs, the model's config.json hash
        pa.field("fingerprint", pa.string()),
        pa.field("prefix_cache_reset", pa.string()),
        pa.field("started_unix_s", pa.float64()),
        pa.field("ended_unix_s", pa.float64()),
        # the simulated engine's error on this cell's figures (results/schema.py); null when measured
        *MODEL_ERROR_FIELDS,
    ],
    metadata={"bench.table": "sweep_cells"},
)


def cell_dir(sweep: Path, cell_id: str) -> Path:
    return Path(sweep) / f"{CELL_PREFIX}{cell_id}"


def load_dir(sweep: Path, cell_id: str, label: str) -> Path:
    """The run folder of one load of a cell."""
    return cell_dir(sweep, cell_id) / f"{LOAD_PREFIX}{label}"


def is_sweep(path: Path) -> bool:
    """A sweep folder: it has a cell table or a definition."""
    path = Path(path)
    return path.is_dir() and ((path / CELLS_FILE).exists() or (path / SWEEP_FILE).exists())


def points_files(sweep: Path, cell_id: str | None = None) -> list[str]:
    """The ``points.parquet`` files of the sweep (or of one cell), in a stable order."""
    return sorted(str(p) for p in Path(sweep).glob(f"{CELL_PREFIX}{cell_id or '*'}/{POINTS_FILE}"))


def read_sweep_json(sweep: Path) -> dict[str, Any] | None:
    """``sweep.json`` as written (a JSON payload: the definition as run); None when absent."""
    path = Path(sweep) / SWEEP_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def read_cells_table(sweep: Path) -> pa.Table | None:
    """``cells.parquet``; None when absent."""
    path = Path(sweep) / CELLS_FILE
    return read_parquet_file(path) if path.exists() else None
