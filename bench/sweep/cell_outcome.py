"""What a cell gives back: its outcome (``CellOutcome``: status, points, capacity records,
engine facts), the configuration and workload columns of its points, whether it was a failed
deployment, and the tail of its engine logs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_llm.bench.errors import too_few_succeeded
from bench_llm.bench.sweep.engines import tail
from bench_llm.bench.sweep.matrix import tuning_json
from bench_llm.bench.sweep.spec import SweepSpec, WorkloadSpec
from bench_llm.launch.config import ParallelConfig
from bench_llm.results.sweep_rows import CapacityRecord, CellColumns, PointRow, WorkloadColumns


class SweepInterrupted(Exception):
    """Ctrl-C / SIGTERM during a load: the sweep stops; --resume reruns this cell."""


@dataclass
class CellOutcome:
    status: str  # complete | failed
    reason: str | None = None
    log_tail: str | None = None
    points: list[PointRow] = field(default_factory=list)
    #: workload tag -> capacity record (capacity search / rate sweeps)
    capacity: dict[str, CapacityRecord] = field(default_factory=dict)
    engine_version: str | None = None
    engine_argv: str | None = None
    #: what the cell's engine says about itself (version and server-info routes, launch/profiles.py)
    engine_info: dict[str, Any] | None = None
    prefix_cache_reset: str | None = None
    #: what limits a complete cell, from its points (``limiting_factor``); computed where the
    #: cell ran, so the sweep's own process reads no Parquet while cells run (bench/sweep/parallel.py)
    limiting_factor: str | None = None


def failed_deployment(points: list[PointRow]) -> str | None:
    """Why a cell whose loads (nearly) all failed is a failed deployment, its most frequent
    errors first (None: enough of its requests succeeded, ``bench.errors.too_few_succeeded``)."""
    done = [p for p in points if p.measured]
    ok = sum(p.ok for p in done)
    counted = sum(p.requests - int(p.metrics.get("cancelled") or 0) for p in done)
    if not done or not too_few_succeeded(ok, counted):
        return None
    errors: dict[str, int] = {}
    for p in done:
        top = p.metrics.get("top_error")
        if top:
            errors[str(top)] = errors.get(str(top), 0) + int(p.metrics.get("failed") or 0)
    top = sorted(errors, key=lambda e: -errors[e])[:3]
    head = f"requests failed: {' | '.join(top)}; " if top else "requests failed; "
    return head + f"{counted - ok} of {counted} requests of its loads failed (read the engine log)"


def config_columns(spec: SweepSpec, cfg: ParallelConfig, cell_id: str) -> CellColumns:
    return CellColumns(
        cell_id=cell_id,
        engine=spec.for_cell(cfg).engine,
        model=spec.model,
        gpu=spec.gpu,
        tp=cfg.tp,
        pp=cfg.pp,
        dp=cfg.dp,
        ep=cfg.ep,
        dcp=cfg.dcp,
        pcp=cfg.pcp,
        disagg=str(cfg.disagg) if cfg.disagg else None,
        gpus=cfg.gpus,
        axes=cfg.axes,
        tuning=tuning_json(cfg),
    )


def workload_columns(w: WorkloadSpec) -> WorkloadColumns:
    """The workload values a point ran with: its tag, and the named workload or the synthetic
    lengths (each a workload axis of the sweep, ``MatrixSpec``)."""
    return WorkloadColumns(
        workload=w.tag,
        workload_name=w.name,
        input_tokens=None if w.name else w.input_tokens,
        output_tokens=None if w.name else w.output_tokens,
    )


def logs_tail(cdir: Path, lines: int = 20) -> str:
    """The tail of the cell's engine log(s): engine.log, then any per-process logs."""
    logs = sorted(cdir.glob("engine*.log"), key=lambda p: (p.name != "engine.log", p.name))
    parts = []
    for p in logs:
        t = tail(p, lines)
        if t:
            parts.append(t if len(logs) == 1 else f"== {p.name} ==\n{t}")
    return "\n".join(parts)

