"""A planned sweep (``bench sweep --plan``): measure only the cells the model cannot rule out.

Before anything is launched, the whole matrix runs on the simulated engine in virtual time (the
same matrix, workload, SLOs and capacity search; a calibrated profile through the simulated
engine's ``--config`` when given). Each cell's predicted capacity carries the model's error as an
interval, ``[c(1-e), c(1+e)]``: ``e`` from the held-out residuals a ``bench sim calibrate``
profile records, else the shipped validation bar (``DEFAULT_ERROR``), else what the user states.

Then cells are measured one at a time, most promising first; after each, the measured capacity
replaces that cell's interval, the planner's constants are re-fitted on every load measured so far
(``plan_refit``: the calibration's fit, kept cheap) and the cells still in play are predicted
again with the re-fitted model, their interval from then on the re-fit's held-out error (never
narrower than the re-fitted model's capacity error on the measured cells), and ranked again. A cell is held back while its
interval cannot hold the answer; the planned sweep stops when no unmeasured cell can, so the
recommendation (``analysis.recommend`` on the measured cells alone) is decided by measurement.
The rule follows the recommendation's own:

- with a target rate, the smallest configuration (GPUs, then parallel axes) whose capacity meets
  it, the highest capacity among equals: a cell is ruled out when even its interval's top misses
  the target, or a measured cell at fewer GPUs (axes) meets it, or one of its size meets it with
  more than its interval's top;
- without one, the most capacity per GPU, cells within ``TIE_FRACTION`` of the best tied (GPU
  count decides): a cell is ruled out when its interval's top per GPU is below the best lower
  bound less a margin (the tie fraction or the capacity search's precision, the larger).

The risk is the model's: a cell whose real capacity lies outside its interval may be ruled out
wrongly. The report says which cells were measured, which were skipped and why.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench_llm.analysis.recommend_types import model_interval
from bench_llm.bench.calibrate import SimArgs
from bench_llm.bench.sweep import store
from bench_llm.bench.sweep.spec import SweepSpec
from bench_llm.core.errors import BenchError

Echo = Callable[[str], None]

#: The model's relative error when no calibrated profile states one: the shipped validation's
#: bar (docs/simulator.md, Validation: held-out rows within ±20 %).
DEFAULT_ERROR = 0.20
DEFAULT_SOURCE = "the shipped validation (held-out rows within ±20 %, docs/simulator.md)"
#: Written into the sweep folder: predictions, intervals, what was measured and skipped.
PLAN_FILE = "plan.json"
HELD = "not measured (planned sweep): "


@dataclass(frozen=True)
class PlanSettings:
    #: The simulated engine's ``--config`` profile for the planner (``bench sim calibrate``).
    profile: Path | None = None
    #: The planner's model preset (default: the sweep's model).
    model: str | None = None
    #: The model's relative error, stated by the user (overrides the profile's and the re-fits').
    error: float | None = None
    #: Re-fit the planner's constants on the measured cells after each one (``plan_refit``).
    refit: bool = True
    #: Reads a simulated engine's recorded arguments (``bench sim serve``'s parser, passed in by the
    #: command); needed to re-fit on cells measured on the simulated engine.
    sim_args: SimArgs | None = None


@dataclass
class PlanCell:
    cell_id: str
    gpus: int
    axes: int
    predicted: float | None
    lo: float
    hi: float
    measured: float | None = None
    status: str = "pending"  # pending | measured | failed | skipped
    reason: str | None = None
    #: The measured cell's time from its start to its end (engine start-up, capacity search).
    seconds: float | None = None
    #: The first prediction (the planner's profile, before any re-fit) and the latest re-fit's.
    first: float | None = None
    refit: float | None = None

    def __post_init__(self) -> None:
        if self.first is None:
            self.first = self.predicted


@dataclass(frozen=True)
class RefitRound:
    """One re-fit of the planner: after which cell, the interval it set and where that came from."""

    after: str
    error: float
    held_out: float
    metric: str
    #: the re-fitted model's largest |predicted / measured - 1| capacity over the measured cells
    capacity_residual: float
    fitted: int
    held: int
    moved: tuple[tuple[str, float, float], ...]


@dataclass
class PlanResult:
    error: float
    source: str
    cells: list[PlanCell]
    order: list[str] = field(default_factory=list)
    plan_s: float = 0.0
    measured_s: float = 0.0
    predicted_pick: str | None = None
    interrupted: bool = False
    refits: list[RefitRound] = field(default_factory=list)
    refit_s: float = 0.0
    #: the last re-fitted profile's text (a ``--config`` file for the simulated engine)
    refit_profile: str | None = None

    @property
    def launches(self) -> int:
        """Cells measured (or launched and failed), by this call or, resumed, before it."""
        return sum(1 for c in self.cells if c.status in ("measured", "failed"))


def model_error(settings: PlanSettings) -> tuple[float, str]:
    """The model's relative error on a cell's capacity and where it comes from: the user's, the
    profile's largest held-out median |error| over its metrics (capacity rests on all of them),
    or ``DEFAULT_ERROR``."""
    if settings.error is not None:
        if not 0 <= settings.error < 1:
            raise BenchError(f"plan error {settings.error:g}: give a fraction in [0, 1), e.g. 0.2")
        return settings.error, "stated (--plan-error)"
    if settings.profile is not None:
        from bench_llm.bench.sweep.model_error import held_out_errors

        errors = held_out_errors(settings.profile)
        if errors:
            worst = max(errors, key=lambda k: errors[k])
            return errors[worst], f"{settings.profile}'s held-out residuals (largest median |error|: {worst})"
    return DEFAULT_ERROR, DEFAULT_SOURCE


def planner_spec(spec: SweepSpec, settings: PlanSettings) -> SweepSpec:
    """The sweep as the simulated engine runs it in virtual time: the same matrix, workloads,
    SLOs and capacity search; the engine's own ``--config`` replaced by the planner's profile (a
    real engine's arguments are its own: the simulated engine takes only the matrix's flags)."""
    args = [a for a in spec.engine_args if not a.startswith("--config=")] if spec.engine == "sim" else []
    args = [a for i, a in enumerate(args) if a != "--config" and (i == 0 or args[i - 1] != "--config")]
    if settings.profile is not None:
        args.append(f"--config={settings.profile}")
    return replace(spec, engine="sim", model=settings.model or spec.model, clock="virtual", engine_args=tuple(args),
                   engine_env=(), engine_version=None, endpoints=(), cluster=None)  # fmt: skip


def check(spec: SweepSpec) -> None:
    """What a planned sweep needs: capacities to rank (a capacity search under SLOs) and a matrix."""
    if not spec.loads.capacity or not spec.slo:
        raise BenchError("--plan ranks cells by capacity: give --capacity and --slo")
    if spec.target_concurrency is not None:
        raise BenchError("--plan: --target-concurrency is not planned (capacity in req/s is); use --target-rate")
    if spec.endpoints:
        raise BenchError("--plan: running deployments (--url) are measured as they are; there is nothing to skip")


def predict(spec: SweepSpec, settings: PlanSettings, error: float, echo: Echo, jobs: int | None = 1) -> list[PlanCell]:
    """Every runnable cell's predicted capacity (the first workload's) and interval."""
    from bench_llm.bench.sweep.orchestrate import run_sweep

    sim = planner_spec(spec, settings)
    # one search per cell: a prediction is the capacity alone, its interval the model's error
    # (the repeat searches' seeds interval would cost twice the search again and go unread)
    sim = replace(sim, loads=replace(sim.loads, capacity_repeats=0))
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        folder = Path(tmp) / "plan"
        run_sweep(sim, folder, echo=lambda line: None, jobs=jobs, progress=False)
        rows = store.read_cell_rows(folder)
    failed = [r for r in rows if r.status == "failed"]
    if failed:  # a cell the model cannot run is no cell it can rule out
        raise BenchError(f"--plan: the simulated engine could not run {failed[0].cell_id}: {failed[0].reason} "
                         "(--plan-model names the preset it models, --plan-config a profile)")  # fmt: skip
    cells = []
    for r in rows:
        if r.status == "skipped":
            continue
        cap = r.capacity_rps if r.status == "complete" else None
        c = float(cap or 0.0)
        lo, hi = model_interval(c, error) or (c, c)  # (a float capacity and error: always an interval)
        cells.append(PlanCell(r.cell_id, r.cell.gpus, r.cell.axes, cap, lo, hi))
    return cells


def _bounds(c: PlanCell) -> tuple[float, float]:
    return (c.measured, c.measured) if c.measured is not None else (c.lo, c.hi)


def next_cell(cells: list[PlanCell], target: float | None, margin: float) -> tuple[PlanCell | None, dict[str, str]]:
    """The next cell to measure (None: the answer is decided by what was measured) and, for each
    unmeasured cell ruled out, why."""
    pending = [c for c in cells if c.status == "pending"]
    done = [c for c in cells if c.status == "measured"]
    why: dict[str, str] = {}
    if target is not None:
        meeting = [m for m in done if (m.measured or 0.0) >= target - 1e-9]
        for c in pending:
            smaller = [m for m in meeting if (m.gpus, m.axes) < (c.gpus, c.axes)]
            same = [m for m in meeting if (m.gpus, m.axes) == (c.gpus, c.axes) and (m.measured or 0.0) > c.hi]
            if c.hi < target:
                why[c.cell_id] = f"its interval's top, {c.hi:.3g} req/s, is below the target {target:g} req/s"
            elif smaller:
                why[c.cell_id] = f"{smaller[0].cell_id} ({smaller[0].gpus} GPU(s)) was measured to meet the target"
            elif same:
                why[c.cell_id] = (f"{same[0].cell_id}, of its size, was measured at {same[0].measured:.3g} req/s, "
                                  f"above its interval's top {c.hi:.3g}")  # fmt: skip
        open_ = [c for c in pending if c.cell_id not in why]
        return min(open_, key=lambda c: (c.gpus, c.axes, -c.hi), default=None), why
    best = max(
        (_bounds(c)[0] / c.gpus for c in cells if c.status in ("pending", "measured")), default=0.0
    )
    floor = (1 - margin) * best
    for c in pending:
        if c.hi / c.gpus < floor or c.hi <= 0:
            why[c.cell_id] = (f"its interval's top, {c.hi / c.gpus:.3g} req/s per GPU, is below "
                              f"{floor:.3g} (the best lower bound {best:.3g} less {margin:.0%})")  # fmt: skip
    open_ = [c for c in pending if c.cell_id not in why]
    return max(open_, key=lambda c: (c.hi / c.gpus, -c.gpus), default=None), why


def predicted_pick(cells: list[PlanCell], target: float | None) -> str | None:
    """The model's own answer (the point predictions, the recommendation's rule)."""
    runnable = [c for c in cells if c.predicted]
    if target is not None:
        ok = [c for c in runnable if (c.predicted or 0.0) >= target]
        return min(ok, key=lambda c: (c.gpus, c.axes, -(c.predicted or 0.0), c.cell_id)).cell_id if ok else None
    if not runnable:
        return None
    return max(runnable, key=lambda c: ((c.predicted or 0.0) / c.gpus, -c.gpus)).cell_id


def run_planned(
    spec: SweepSpec,
    out: Path,
    settings: PlanSettings,
    *,
    resume: bool = False,
    launcher: Any = None,
    echo: Echo = print,
    progress: bool | None = None,
    command: tuple[str, ...] = (),
    jobs: int | None = 1,
) -> PlanResult:
    """Plan on the model, then measure cell by cell until the answer is decided by measurement.
    ``out`` is an ordinary sweep folder (the held-back cells are rows skipped with the reason)
    plus ``plan.json``."""
    from bench_llm.bench.sweep.orchestrate import run_sweep

    check(spec)
    error, source = model_error(settings)
    t0 = time.monotonic()
    cells = predict(spec, settings, error, echo, jobs=None if jobs is None else jobs)
    result = PlanResult(error, source, cells, plan_s=time.monotonic() - t0)
    result.predicted_pick = predicted_pick(cells, spec.target_rate)
    echo(f"plan: {len(cells)} cells simulated in virtual time in {result.plan_s:.1f} s; model error ±{error:.0%} "
         f"from {source}; the model's pick: {result.predicted_pick or 'none'}")  # fmt: skip
    by_id = {c.cell_id: c for c in cells}
    margin = max(0.05, spec.loads.capacity_precision or 0.0)
    work = Path(tempfile.mkdtemp(prefix="bench-plan-refit-"))
    if resume:
        _read_measured(out, by_id)
        if any(c.status == "measured" for c in cells):
            _refit_round(spec, settings, out, result, work, echo, jobs)
    t1 = time.monotonic()
    first = not resume
    while True:
        for c in cells:  # every cell not measured is ranked again on what is measured now
            if c.status == "skipped":
                c.status, c.reason = "pending", None
        nxt, why = next_cell(cells, spec.target_rate, margin)
        for c in cells:
            if c.cell_id in why:
                c.status, c.reason = "skipped", why[c.cell_id]
        if nxt is None:
            break
        result.order.append(nxt.cell_id)
        echo(f"plan: measuring {nxt.cell_id} (predicted {nxt.predicted or 0:.3g} req/s, "
             f"interval {nxt.lo:.3g}-{nxt.hi:.3g})")  # fmt: skip
        allowed = nxt.cell_id

        def hold(cid: str, allowed: str = allowed) -> str | None:
            c = by_id.get(cid)
            if cid == allowed or c is None or c.status == "measured":
                return None
            return HELD + (c.reason or "still in play, not measured yet (the sweep stopped before its turn)")

        res = run_sweep(spec, out, resume=not first, launcher=launcher, echo=_quiet(echo, first), progress=progress,
                        command=command, jobs=1, hold=hold)  # fmt: skip
        first = False
        _read_measured(out, by_id)
        if nxt.status == "pending":  # no row came back: cut short
            nxt.status = "failed"
        if res.interrupted:
            result.interrupted = True
            break
        if nxt.status == "measured":
            _refit_round(spec, settings, out, result, work, echo, jobs)
    result.measured_s = time.monotonic() - t1 - result.refit_s
    shutil.rmtree(work, ignore_errors=True)
    _final_rows(spec, out, by_id)
    (Path(out) / PLAN_FILE).write_text(json.dumps(plan_json(result, spec), indent=2, sort_keys=True) + "\n")
    return result


def _refit_round(
    spec: SweepSpec, settings: PlanSettings, out: Path, result: PlanResult, work: Path, echo: Echo, jobs: int | None
) -> None:
    """Re-fit the planner on the measured cells, predict every cell again with it, and give the
    cells still in play the re-fitted prediction and interval (the measured keep their figures)."""
    from bench_llm.bench.sweep.plan_refit import base_config, refit

    measured = [c for c in result.cells if c.status == "measured" and c.measured]
    if not settings.refit or not measured:
        return
    t0 = time.monotonic()
    try:
        base = base_config(spec.engine, settings.model or spec.model, spec.gpu, settings.profile)
        r = refit(out, [c.cell_id for c in measured], base, settings.sim_args, work, len(result.refits) + 1)
        new = None if r is None else {c.cell_id: c for c in predict(spec, replace(settings, profile=r.profile), 0.0,
                                                                     echo, jobs=jobs)}  # fmt: skip
    except BenchError as exc:  # the re-fitted model could not run a cell: keep the predictions
        echo(f"plan: re-fit not used: {exc}")
        r = new = None
    result.refit_s += time.monotonic() - t0
    if r is None or new is None:
        return
    residual = max((abs((new[c.cell_id].predicted or 0.0) / (c.measured or 1.0) - 1) for c in measured if c.cell_id in new),
                   default=0.0)  # fmt: skip
    if settings.error is not None:
        error, source = settings.error, "stated (--plan-error)"
    else:
        error = max(r.error, residual)
        cells = ", ".join(c.cell_id for c in measured)
        source = (f"the planner re-fitted on {r.fitted} measured load(s) of {cells}: held-out median |error| "
                  f"{r.error:.1%} ({r.metric}, {r.held} load(s))")  # fmt: skip
        if residual > r.error:
            source += f"; its capacity error on the measured cells, {residual:.1%}, is larger and is used"
    for c in result.cells:
        p = new.get(c.cell_id)
        if p is None:
            continue
        c.refit = p.predicted
        if c.status in ("pending", "skipped"):
            c.predicted = p.predicted
            c.lo, c.hi = (p.predicted or 0.0) * (1 - error), (p.predicted or 0.0) * (1 + error)
    result.error, result.source = error, source
    result.refits.append(RefitRound(measured[-1].cell_id if not result.order else result.order[-1], error, r.error,
                                    r.metric, residual, r.fitted, r.held, r.moved))  # fmt: skip
    result.refit_profile = r.profile.read_text()
    moved = ", ".join(f"{n} {b:.3g}->{a:.3g}" for n, b, a in r.moved)
    echo(f"plan: re-fitted on {len(measured)} measured cell(s) ({moved}); interval now ±{error:.1%}"
         + (f"; left out: {'; '.join(r.excluded)}" if r.excluded else ""))


def _quiet(echo: Echo, first: bool) -> Echo:
    """The per-round lines a resumed round repeats (cells kept or skipped in earlier rounds) left out."""
    repeated = ("done ", "sweep ") if first else ("done ", "sweep ", "skip ")
    return lambda line: None if line.startswith(repeated) else echo(line)


def _read_measured(out: Path, by_id: dict[str, PlanCell]) -> None:
    for r in store.read_cell_rows(out):
        c = by_id.get(r.cell_id)
        if c is None:
            continue
        if r.started_unix_s and r.ended_unix_s:
            c.seconds = float(r.ended_unix_s) - float(r.started_unix_s)
        if r.status == "complete":
            c.status, c.measured, c.reason = "measured", float(r.capacity_rps or 0.0), None
        elif r.status == "failed":
            c.status, c.reason = "failed", r.reason


def _final_rows(spec: SweepSpec, out: Path, by_id: dict[str, PlanCell]) -> None:
    """The skipped cells' rows with the final reason (the last round stored the one before)."""
    rows = []
    for r in store.read_cell_rows(out):
        c = by_id.get(r.cell_id)
        if c is not None and c.status == "skipped" and r.status == "skipped":
            r = replace(r, reason=HELD + (c.reason or ""))
        rows.append(r)
    store.write_cell_rows(out, rows)


def plan_json(result: PlanResult, spec: SweepSpec) -> dict[str, Any]:
    return {
        "model_error": result.error,
        "model_error_source": result.source,
        "target_rate": spec.target_rate,
        "predicted_pick": result.predicted_pick,
        "measured_order": result.order,
        "plan_seconds": round(result.plan_s, 3),
        "measured_seconds": round(result.measured_s, 3),
        "refit_seconds": round(result.refit_s, 3),
        "cells": [
            {"cell_id": c.cell_id, "gpus": c.gpus, "predicted_rps": c.predicted, "interval_rps": [c.lo, c.hi],
             "first_predicted_rps": c.first, "refit_rps": c.refit,
             "measured_rps": c.measured, "status": c.status, "reason": c.reason, "seconds": c.seconds}
            for c in result.cells
        ],  # fmt: skip
        "refits": [
            {"after": r.after, "error": r.error, "held_out_error": r.held_out, "held_out_metric": r.metric,
             "capacity_residual": r.capacity_residual, "fitted_loads": r.fitted, "held_out_loads": r.held,
             "constants": {n: [b, a] for n, b, a in r.moved}}
            for r in result.refits
        ],  # fmt: skip
        "refit_profile": result.refit_profile,
    }


def engine_hours(result: PlanResult) -> str:
    """GPU-hours the measured cells took, and about how many the skipped ones would have (each at
    the measured cells' mean seconds per GPU)."""
    done = [c for c in result.cells if c.status in ("measured", "failed") and c.seconds is not None]
    used = sum((c.seconds or 0.0) * c.gpus for c in done) / 3600
    per_gpu = sum(c.seconds or 0.0 for c in done) / max(1, sum(c.gpus for c in done))
    saved = sum(c.gpus for c in result.cells if c.status == "skipped") * per_gpu / 3600
    return f"engine-hours (GPU-hours): {used:.3g} used, about {saved:.3g} saved"


def format_plan(result: PlanResult, recommended: str | None) -> list[str]:
    """Predicted vs measured for each measured cell, the cells skipped and why, what was saved."""
    lines = [f"planned sweep: model error ±{result.error:.1%} from {result.source}"]
    measured = [c for c in result.cells if c.status in ("measured", "failed")]
    lines.append(f"  {'cell':<28}{'first':>8}{'predicted req/s at launch':>30}{'re-fitted':>10}{'measured':>10}{'error':>8}")
    for c in sorted(measured, key=lambda c: result.order.index(c.cell_id) if c.cell_id in result.order else -1):
        pred = f"{c.predicted or 0:.3g} ({c.lo:.3g}-{c.hi:.3g})"
        refit = "-" if c.refit is None else f"{c.refit:.3g}"
        if c.status == "failed" or c.measured is None:
            lines.append(f"  {c.cell_id:<28}{c.first or 0:>8.3g}{pred:>30}{refit:>10}{'failed':>10}")
            continue
        err = f"{(c.predicted or 0) / c.measured - 1:+.0%}" if c.measured else "n/a"
        lines.append(f"  {c.cell_id:<28}{c.first or 0:>8.3g}{pred:>30}{refit:>10}{c.measured:>10.3g}{err:>8}")
    for r in result.refits:
        lines.append(f"  re-fit after {r.after}: on {r.fitted} load(s), held-out median |error| {r.held_out:.1%} "
                     f"({r.metric}, {r.held} load(s)), capacity error on the measured cells {r.capacity_residual:.1%}; "
                     f"interval ±{r.error:.1%}")  # fmt: skip
    skipped = [c for c in result.cells if c.status == "skipped"]
    for c in skipped:
        lines.append(f"  skipped {c.cell_id} (predicted {c.predicted or 0:.3g} req/s): {c.reason}")
    total = len(result.cells)
    times = [c.seconds for c in result.cells if c.status in ("measured", "failed") and c.seconds is not None]
    per = sum(times) / len(times) if times else 0.0
    lines.append(
        f"  launches: {result.launches} of {total} ({total - result.launches} saved); the measured cells took "
        f"{sum(times):.0f} s, so about {per * (total - result.launches):.0f} s saved at their mean {per:.0f} s per cell; "
        f"planning took {result.plan_s:.1f} s, re-fitting {result.refit_s:.1f} s"
    )
    lines.append("  " + engine_hours(result))
    if recommended is not None:
        agree = "agrees" if recommended == result.predicted_pick else f"differs: the model picked {result.predicted_pick}"
        done = [c.cell_id for c in result.cells if c.status == "measured"]
        lines.append(f"  the recommendation below is measured ({', '.join(done)} measured); the model {agree}")
    if result.interrupted:
        lines.append("  interrupted: the recommendation is not decided yet; rerun with --plan --resume")
    return lines
