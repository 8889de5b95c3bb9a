"""A sweep's recommendation inputs, read from its folder: ``cells.parquet`` (which cells ran,
failed, were skipped), each cell's ``points.parquet`` (one row per load, the configuration as
columns), the settings the sweep ran with (a run's metadata, else ``sweep.json``) and, when the
SLO is changed after the fact, each load's points recomputed from its run folder's requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from bench_llm.analysis.capacity_points import point_metrics
from bench_llm.analysis.load import load_run
from bench_llm.analysis.server_signals import server_signals
from bench_llm.analysis.slo import SLO
from bench_llm.results.reader import ResultsError, read_parquet_file, read_run_meta, read_server_metrics
from bench_llm.results.sweep_layout import CELLS_FILE, points_files, read_cells_table, read_sweep_json
from bench_llm.results.sweep_rows import JUDGING_KEYS, Judging, PointRow

#: The settings a load's verdict depends on: ``bench sweep --resume`` may change them, and
#: then re-judges the measured loads and probes what the new verdicts need.
JUDGING = JUDGING_KEYS


def read_cells(sweep: Path) -> pd.DataFrame:
    table = read_cells_table(sweep)
    if table is None:
        raise ResultsError(f"{sweep}: not a sweep folder (no {CELLS_FILE})")
    return table.to_pandas()


def load_points(sweep: Path, cell_id: str | None = None, slo: dict[str, float] | None = None) -> pd.DataFrame:
    """Every load of the sweep (or of one cell), one row each; configuration as columns.

    With ``slo`` given, attainment and the miss shares are recomputed from each load's
    run folder under those bounds.
    """
    sweep = Path(sweep)
    files = points_files(sweep, cell_id)
    if not files:
        return pd.DataFrame()
    frames = [read_parquet_file(f).to_pandas() for f in files]
    df = pd.concat(frames, ignore_index=True, sort=False)
    if slo is not None:
        df = _rescore(sweep, df, SLO.from_dict(slo))
    return df


def sweep_dataset(sweep: Path) -> ds.Dataset:
    """The points as one Arrow dataset partitioned by cell (hive: ``cell=<id>``)."""
    files = points_files(sweep)
    schemas = [pq.read_schema(f) for f in files]
    schema = pa.unify_schemas(schemas, promote_options="permissive") if schemas else None
    if schema is not None:
        schema = schema.append(pa.field("cell", pa.string()))
    return ds.dataset(files, format="parquet", partitioning="hive", partition_base_dir=str(sweep), schema=schema)


def _rescore(sweep: Path, df: pd.DataFrame, slo: SLO) -> pd.DataFrame:
    return pd.DataFrame([rescore_point(sweep, rec, slo) for rec in df.to_dict("records")])


def rescore_point(sweep: Path, rec: dict[str, Any], slo: SLO) -> dict[str, Any]:
    """One point (a row of points.parquet, changed in place) with its attainment, goodput and
    miss shares recomputed under ``slo`` from its run folder's request table."""
    rd = rec.get("run_dir")
    if rec.get("status") in ("complete", "interrupted") and isinstance(rd, str):
        _rescore_figures(sweep, rd, rec, slo)
    return rec


def rescored(sweep: Path, point: PointRow, slo: SLO) -> PointRow:
    """``rescore_point`` of a typed point: its figures recomputed under ``slo``."""
    if not point.measured or point.run_dir is None:
        return point
    figures = dict(point.metrics)
    _rescore_figures(sweep, point.run_dir, figures, slo)
    return point.with_metrics(figures)


def _rescore_figures(sweep: Path, run_dir: str, figures: dict[str, Any], slo: SLO) -> None:
    """A run's attainment, goodput and miss shares under ``slo`` into ``figures`` (in place;
    unchanged when its run folder is gone)."""
    if not (Path(sweep) / run_dir).exists():
        return
    run = load_run(Path(sweep) / run_dir)
    server = read_server_metrics(Path(sweep) / run_dir)
    m = point_metrics(run, slo, server_signals(server), server)
    for k in list(figures):
        if k.startswith("miss_share_"):
            figures.pop(k)
    rescored = ("attainment", "attainment_low", "attainment_high", "attainment_deff", "met", "goodput_rps")
    figures.update({k: v for k, v in m.as_row().items() if k in rescored or k.startswith("miss_share_")})


def resume_command(sweep: Path, slo: dict[str, float]) -> str:
    """The command that probes the loads a re-judged sweep lacks (bench/sweep/cell.py)."""
    return f"bench sweep --resume --out {sweep} --slo {SLO.from_dict(slo)}"


def definition_settings(sweep: Path) -> dict[str, Any]:
    """Fallback when no load ran (every cell failed): the definition in sweep.json."""
    try:
        data = read_sweep_json(sweep)
    except (OSError, ValueError):
        return {}
    if data is None:
        return {}
    spec = data.get("spec") or {}
    return {
        "slo": spec.get("slo") or {},
        "attainment_pct": spec.get("attainment_pct"),
        "target_rate": spec.get("target_rate"),
        "target_concurrency": spec.get("target_concurrency"),
        "sweep": spec,
    }


def judging_settings(settings: dict[str, Any]) -> Judging:
    return Judging.from_row(settings.get("sweep") or {})


def sweep_settings(sweep: Path, points: pd.DataFrame) -> dict[str, Any]:
    """SLO, attainment target and target load as the sweep ran them (from a run's metadata)."""
    for rd in points.get("run_dir", pd.Series(dtype=object)).dropna():
        try:
            meta = read_run_meta(Path(sweep) / rd)
        except (ResultsError, OSError):
            continue
        cfg: dict[str, Any] = meta.get("config") or {}
        if "slo" in cfg:
            return cfg
    return {}

