"""Expanding the matrix into cells, and deciding which cells can run at all."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from adapters.launch.config import Disagg, ParallelConfig
from bench.sweep.spec import SweepSpec

#: (engine, config) -> reasons the engine cannot run it (empty when fine).
UnsupportedFn = Callable[[str, ParallelConfig], list[str]]


@dataclass(frozen=True)
class PlannedCell:
    config: ParallelConfig
    #: Why the cell will not run (None: it runs).
    skip_reason: str | None = None

    @property
    def cell_id(self) -> str:
        return self.config.cell_id


def _disagg_values(values: tuple[str, ...]) -> list[Disagg | None]:
    if not values:
        return [None]
    out: list[Disagg | None] = []
    for v in values:
        d = None if v.lower() in ("none", "off", "colocated") else Disagg.parse(v)
        if d not in out:
            out.append(d)
    return out


def expand(spec: SweepSpec, unsupported: UnsupportedFn | None = None) -> list[PlannedCell]:
    """Every cell of the matrix, smallest first (GPUs, then axes), each with a skip reason or None.

    A combination the configuration itself rejects (e.g. dcp not dividing tp) is listed as
    skipped rather than dropped, so the summary shows every point the user asked for.
    """
    m = spec.matrix
    cells: list[PlannedCell] = []
    seen: set[str] = set()
    for tp, pp, dp, ep, dcp, pcp, disagg in itertools.product(
        m.tp, m.pp, m.dp, m.ep, m.dcp, m.pcp, _disagg_values(m.disagg)
    ):
        try:
            cfg = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, dcp=dcp, pcp=pcp, disagg=disagg)
        except ValueError as exc:
            cfg = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, pcp=pcp, disagg=disagg)
            name = f"{cfg.cell_id}-dcp{dcp}"
            if name not in seen:
                seen.add(name)
                cells.append(_Invalid(cfg, f"invalid configuration: {exc}", name))
            continue
        if cfg.cell_id in seen:
            continue
        seen.add(cfg.cell_id)
        reason = None
        if spec.gpus is not None and cfg.gpus > spec.gpus:
            reason = f"needs {cfg.gpus} GPUs, {spec.gpus} available"
        elif unsupported is not None:
            reasons = unsupported(spec.engine, cfg)
            if reasons:
                reason = f"{spec.engine} does not support it: " + "; ".join(reasons)
        cells.append(PlannedCell(cfg, reason))
    cells.sort(key=lambda c: (c.config.gpus, c.config.axes, c.cell_id))
    return cells


@dataclass(frozen=True)
class _Invalid(PlannedCell):
    name: str = ""

    @property
    def cell_id(self) -> str:
        return self.name
