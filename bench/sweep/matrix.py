"""Expanding the matrix into cells, and deciding which cells can run at all."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass

from bench_llm.bench.sweep.spec import SweepSpec
from bench_llm.core.layout import Layout, ModelShape, shape_problems
from bench_llm.launch.config import Disagg, ParallelConfig

#: (engine, config) -> reasons the engine cannot run it (empty when fine).
UnsupportedFn = Callable[[str, ParallelConfig], list[str]]


@dataclass(frozen=True)
class PlannedCell:
    #: The parallel configuration; a tuning cell's flags are its ``extra_args`` (``--NAME=VALUE``).
    config: ParallelConfig
    #: Why the cell will not run (None: it runs).
    skip_reason: str | None = None
    #: The tuning-axis values this cell runs with, ((flag, value), ...).
    tuning: tuple[tuple[str, str], ...] = ()
    #: skipped because the layout itself is invalid or the engine refuses it (no number of GPUs
    #: would run it), not for want of GPUs: ``impossible_matrix`` decides by this, not the wording
    refused: bool = False

    @property
    def cell_id(self) -> str:
        return tuned_cell_id(self.config, self.tuning)


def tuning_args(tuning: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """The engine arguments of a tuning cell (``--max-num-seqs=8``)."""
    return tuple(f"--{name}={value}" for name, value in tuning)


def tuned_cell_id(config: ParallelConfig, tuning: tuple[tuple[str, str], ...]) -> str:
    """``tp2-max-num-seqs_8``: the parallel id (without the extra-args hash) then each flag_value,
    with characters a folder name should not hold replaced."""
    if not tuning:
        return config.cell_id
    return "-".join([parallel_id(config), *_tuning_parts(tuning)])


def tuning_json(config: ParallelConfig) -> str | None:
    """The tuning values a cell ran with, ``{"max-num-seqs": "8"}`` as JSON (None: no tuning axis)."""
    import json

    pairs = [arg[2:].split("=", 1) for arg in config.extra_args if arg.startswith("--") and "=" in arg]
    return json.dumps({k: v for k, v in pairs}, sort_keys=True) if pairs else None


def parallel_id(config: ParallelConfig) -> str:
    """The configuration's id from its parallel axes alone (no extra-args hash)."""
    return ParallelConfig(config.tp, config.pp, config.dp, config.ep, config.dcp, config.pcp, config.disagg).cell_id


def _tuning_parts(tuning: tuple[tuple[str, str], ...]) -> list[str]:
    return [f"{name}_{re.sub(r'[^A-Za-z0-9.]', '_', value)}" for name, value in tuning]


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
    if spec.endpoints:
        return _deployments(spec)
    m = spec.matrix
    cells: list[PlannedCell] = []
    seen: set[str] = set()
    order = {t: i for i, t in enumerate(m.tuning_values())}
    for tp, pp, dp, ep, dcp, pcp, disagg, tuning in itertools.product(
        m.tp, m.pp, m.dp, m.ep, m.dcp, m.pcp, _disagg_values(m.disagg), order
    ):
        args = tuning_args(tuning)
        try:
            cfg = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, dcp=dcp, pcp=pcp, disagg=disagg, extra_args=args)
        except ValueError as exc:
            cfg = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep, pcp=pcp, disagg=disagg)
            name = "-".join([cfg.cell_id, f"dcp{dcp}", *_tuning_parts(tuning)])
            if name not in seen:
                seen.add(name)
                cells.append(_Invalid(cfg, f"invalid configuration: {exc}", tuning, refused=True, name=name))
            continue
        cid = tuned_cell_id(cfg, tuning)
        if cid in seen:
            continue
        seen.add(cid)
        reason = _shape_refusal(spec, cfg)
        refused = reason is not None
        if reason is None:
            reason = _gpu_shortfall(spec, cfg)
        if reason is None and unsupported is not None:
            reasons = unsupported(spec.engine, cfg)
            if reasons:
                reason, refused = f"{spec.engine} does not support it: " + "; ".join(reasons), True
        cells.append(PlannedCell(cfg, reason, tuning, refused))
    # smallest first; a tuning axis keeps the order its values were given in
    cells.sort(key=lambda c: (c.config.gpus, c.config.axes, parallel_id(c.config), order.get(c.tuning, 0)))
    return cells


def impossible_matrix(planned: list[PlannedCell]) -> str | None:
    """The error when no cell of the matrix can exist (each an invalid layout or one the engine
    refuses): the sweep is refused before anything runs. None when some cell can run, or only
    the GPUs available stop them."""
    if not planned or any(c.skip_reason is None for c in planned):
        return None
    if not all(c.refused for c in planned):
        return None
    return "no cell of the matrix can run: " + "; ".join(f"{c.cell_id}: {c.skip_reason}" for c in planned)



def model_shape(engine: str, model: str) -> ModelShape | None:
    """The model's shape where bench knows it: the simulated engine's presets (a real engine's
    model is a path or hub name whose shape bench does not read)."""
    if engine != "sim":
        return None
    from bench_llm.sim.presets import MODELS

    return MODELS.get(model)


def _shape_refusal(spec: SweepSpec, cfg: ParallelConfig) -> str | None:
    """Why the model's shape cannot take ``cfg``'s sizes (core/layout.py; None: it can, or unknown)."""
    shape = model_shape(spec.engine, spec.model)
    if shape is None:
        return None
    problems = shape_problems(Layout(cfg.tp, cfg.pp, cfg.dp, cfg.ep, cfg.dcp, cfg.pcp), shape)
    return "invalid configuration: " + "; ".join(problems) if problems else None


def _gpu_shortfall(spec: SweepSpec, cfg: ParallelConfig) -> str | None:
    """Why ``cfg`` does not fit the sweep's GPUs (None: it fits, or there is no limit)."""
    if spec.gpus is not None and cfg.gpus > spec.gpus:
        return f"needs {cfg.gpus} GPUs, {spec.gpus} available"
    return None


def _deployments(spec: SweepSpec) -> list[PlannedCell]:
    """One cell per running deployment (``spec.endpoints``), smallest first, in the order given
    at equal GPUs; bench starts none of them, so only the GPUs available can skip one."""
    cells = []
    for e in spec.endpoints:
        cfg = ParallelConfig(deployment=e.name, deployment_gpus=e.gpus)
        cells.append(PlannedCell(cfg, _gpu_shortfall(spec, cfg)))
    return sorted(cells, key=lambda c: c.config.gpus)


@dataclass(frozen=True)
class _Invalid(PlannedCell):
    name: str = ""

    @property
    def cell_id(self) -> str:
        return self.name
