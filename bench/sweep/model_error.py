"""The simulated engine's error on a sweep's capacities: an interval per cell, and its source.

A capacity the simulated engine reports is the model's, not a measurement: a measured engine
differs from it. The model's relative error ``e`` turns each capacity ``c`` into ``[c(1-e),
c(1+e)]``. ``e`` is the largest held-out median |error| over the metrics a capacity rests on
(TTFT, TPOT/ITL, E2E, throughput), taken from

- the calibration's held-out residuals, when the cells ran with a ``bench sim calibrate``
  profile (``--engine-arg=--config=FILE``, whose ``# held out, <metric>: median |error| X%``
  comments this module reads, for the planned sweep too), else
- the shipped validation rows (``sim.validation_figures``: published figures vs the simulated
  engine, held-out rows only).

A cell whose interval holds the target is "too close to call" on the model alone (the
recommendation's rule, ``analysis.recommend_choice.model_target_call``): only measurement
decides it. A median error is not a bound: about half of the measured figures lie outside it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_llm.analysis.recommend_choice import model_target_call
from bench_llm.analysis.recommend_types import Recommendation, model_interval
from bench_llm.core.errors import BenchError
from bench_llm.results.schema import MODEL_ERROR_METRICS, MODEL_ERROR_SOURCE, model_error_column

_HELD_OUT = re.compile(r"^#\s*held out, ([^:]+): median \|error\| ([0-9.]+)%")


@dataclass(frozen=True)
class ModelError:
    #: relative error, e.g. 0.18
    fraction: float
    #: the metric it is the median error of
    metric: str
    source: str


def held_out_errors(profile: Path) -> dict[str, float]:
    """A ``bench sim calibrate`` profile's held-out median |error| per metric (fractions); {} if none."""
    try:
        text = Path(profile).read_text()
    except OSError as exc:
        raise BenchError(f"{profile}: {exc.strerror}") from None
    return {m.group(1): float(m.group(2)) / 100 for line in text.splitlines() if (m := _HELD_OUT.match(line.strip()))}


def profile_arg(engine_args: tuple[str, ...]) -> Path | None:
    """The simulated engine's ``--config`` file among a sweep's engine arguments (None: none)."""
    for i, a in enumerate(engine_args):
        if a.startswith("--config="):
            return Path(a.split("=", 1)[1])
        if a == "--config" and i + 1 < len(engine_args):
            return Path(engine_args[i + 1])
    return None


def sim_model_error(engine_args: tuple[str, ...] = ()) -> ModelError:
    """The simulated engine's error for cells run with these engine arguments (module docstring)."""
    profile = profile_arg(engine_args)
    note = ""
    if profile is not None:
        errors = held_out_errors(profile)
        if errors:
            worst = max(errors, key=lambda k: errors[k])
            return ModelError(errors[worst], worst, f"{profile}'s held-out residuals (bench sim calibrate), "
                              f"largest median |error| of its {len(errors)} metrics: {worst}")  # fmt: skip
        note = f"; {profile} states no held-out error"
    from bench_llm.sim.validation_figures import median_abs_errors

    errors_n = median_abs_errors()
    worst = max(errors_n, key=lambda k: errors_n[k][0])
    err, n = errors_n[worst]
    return ModelError(err, worst, f"the shipped validation rows (bench sim validate), held-out median |error| "
                      f"of {worst} over {n} published rows, the largest of its metrics{note}")  # fmt: skip


#: A calibrated profile's metric names (``sim.calibrate.score``) -> the columns' (``MODEL_ERROR_METRICS``).
_PROFILE_METRICS = {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "e2e_ms": "e2e_ms", "throughput_rps": "throughput"}


@dataclass(frozen=True)
class MetricErrors:
    """The model's relative error per metric (``MODEL_ERROR_METRICS`` less capacity; None: no
    figure for it) and where they come from; a capacity's is the largest of them."""

    errors: tuple[tuple[str, float | None], ...]
    source: str

    @property
    def capacity(self) -> float | None:
        known = [e for _, e in self.errors if e is not None]
        return max(known) if known else None

    def columns(self) -> dict[str, Any]:
        """The ``MODEL_ERROR_FIELDS`` columns of a simulated sweep's point or cell row."""
        out: dict[str, Any] = {model_error_column(m): e for m, e in self.errors}
        out[model_error_column("capacity")] = self.capacity
        out[MODEL_ERROR_SOURCE] = self.source
        return out


@functools.lru_cache(maxsize=16)
def metric_errors(engine_args: tuple[str, ...] = ()) -> MetricErrors:
    """Per metric, the simulated engine's error for cells run with these engine arguments: the
    calibrated profile's held-out median |error| per metric, else the shipped validation rows'."""
    metrics = [m for m in MODEL_ERROR_METRICS if m != "capacity"]
    profile = profile_arg(engine_args)
    note = ""
    if profile is not None:
        held = {_PROFILE_METRICS.get(k, k): v for k, v in held_out_errors(profile).items()}
        if held:
            return MetricErrors(tuple((m, held.get(m)) for m in metrics),
                                f"{profile}'s held-out residuals per metric (bench sim calibrate)")  # fmt: skip
        note = f"; {profile} states no held-out error"
    from bench_llm.sim.validation_figures import median_abs_errors

    shipped = median_abs_errors()
    counts = ", ".join(f"{k} {n}" for k, (_, n) in sorted(shipped.items()))
    return MetricErrors(tuple((m, shipped[m][0] if m in shipped else None) for m in metrics),
                        f"the shipped validation rows' held-out median |error| per metric (bench sim validate; "
                        f"published rows: {counts}){note}")  # fmt: skip


def model_error_columns(engine: str, engine_args: tuple[str, ...]) -> dict[str, Any]:
    """The model-error columns of a sweep row: the simulated engine's, none for a measured engine."""
    return metric_errors(tuple(engine_args)).columns() if engine == "sim" else {}


def _fmt(interval: tuple[float, float] | None) -> str:
    return "" if interval is None else f"[{interval[0]:.4g}, {interval[1]:.4g}]"


def model_error_lines(rec: Recommendation, err: ModelError) -> list[str]:
    """The sweep's capacities with the model's interval, and the ones it leaves too close to
    call against the target: decided and phrased by the recommendation's own rule
    (``analysis.recommend_choice.model_target_call``). Whether the pick is separated from its
    runner-up once the intervals are widened by the model's error is the recommendation's
    separation, printed with it."""
    e = err.fraction
    lines = [f"model error: capacities are the simulated engine's; measured engines differ by a median "
             f"±{e:.1%} (source: {err.source})"]  # fmt: skip
    target = rec.target_rate
    for name, wl in rec.workloads.items():
        cells = [c for c in wl.configurations if c.capacity.capacity_rps is not None]
        if not cells:
            continue
        head = f"  {name}: " if len(rec.workloads) > 1 else "  "
        lines.append(head + "; ".join(f"{c.cell_id} {c.capacity.capacity_rps:.4g} req/s -> "
                                      f"{_fmt(model_interval(c.capacity.capacity_rps, e))}" for c in cells))  # fmt: skip
        if target is None:
            continue
        for c in cells:
            call = model_target_call(c.cell_id, c.capacity.capacity_rps, e, target)
            if call is not None:
                lines.append(f"  {call}")
        pick = wl.recommendation
        low = model_interval(pick.capacity_rps if pick is not None else None, e)
        if pick is not None and low is not None and low[0] >= target - 1e-9:
            lines.append(f"  {pick.cell_id} meets the target {target:g} req/s even at its interval's low end")
    return lines


def stored_sweep_lines(sweep_dir: Path, rec: Recommendation) -> list[str]:
    """``model_error_lines`` for a stored sweep (``bench recommend``): none unless it ran on the
    simulated engine (its ``sweep.json`` says so, with the engine arguments its cells ran with)."""
    from bench_llm.results.sweep_layout import read_sweep_json

    spec = (read_sweep_json(sweep_dir) or {}).get("spec") or {}
    if spec.get("engine") != "sim":
        return []
    return model_error_lines(rec, sim_model_error(tuple(str(a) for a in spec.get("engine_args") or ())))
