"""A planned sweep learns from its own measurements: after each measured cell, the planner's
constants are re-fitted on the loads measured so far (``sim.calibrate.fit``, the fit of
``bench sim calibrate``), and the cells still in play are ranked again with the re-fitted model.

Kept cheap, since it runs once per measured cell: three constants (``PLAN_KNOBS``: the per-step
fixed time, the CPU time per sequence in a step, the weights' read rate), one coordinate-descent
round without the simplex polish, on at most ``MAX_LOADS`` loads spread over the measured cells.
Every third of those loads (a capacity's confirmation of
thousands of requests left out: ``MAX_SENDS``) is held out: the re-fitted model's median |error| on them (the largest
over TTFT, TPOT, E2E and throughput) is the planner's interval from then on, never narrower
than the re-fitted model's own capacity error on the cells already measured.

The loads a calibration would refuse are left out here too (``bench.calibrate.screened_loads``:
a saturated client, anomalous records). Layering: bench (reads the sweep's run folders).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_llm.bench.calibrate import BaseConfig, SimArgs, screened_loads, split_held_out
from bench_llm.bench.sweep.store import cell_dir
from bench_llm.core.errors import BenchError
from bench_llm.sim.calibrate import KNOBS, Knob, MeasuredLoad, fit, score, with_values

#: The constants a planned sweep re-fits (the rest keep the planner's values).
PLAN_KNOBS: tuple[Knob, ...] = tuple(k for k in KNOBS if k.name in ("t_fixed_ms", "per_seq_us", "mbu"))
#: At most this many measured loads are replayed per re-fit (held-out ones included).
MAX_LOADS = 9
#: Every this-many-th of them is held out (scored, not fitted on).
HOLD_EVERY = 3
#: Loads of more requests than this (a capacity's confirmation, thousands of requests) cost more
#: to replay than they teach a three-constant fit; used only when too few smaller loads remain.
MAX_SENDS = 600
#: Engines whose simulated profile the planner starts from for a real engine's runs.
_SIM_PROFILES = ("vllm", "sglang", "tgi")


@dataclass(frozen=True)
class Refit:
    """One re-fit: the profile written for the planner, its held-out error and what moved."""

    profile: Path
    #: the re-fitted model's held-out median |error| (the largest over the metrics) and its metric
    error: float
    metric: str
    fitted: int
    held: int
    #: (table.name, before, after) per re-fitted constant
    moved: tuple[tuple[str, float, float], ...]
    #: runs left out (a saturated client or anomalous records), named
    excluded: tuple[str, ...] = ()


def spread(loads: Sequence[MeasuredLoad], most: int) -> list[MeasuredLoad]:
    """At most ``most`` of ``loads``, evenly spaced over them (their order: cell, then load)."""
    n = len(loads)
    if n <= most:
        return list(loads)
    return [loads[round(i * (n - 1) / (most - 1))] for i in range(most)]


def base_config(engine: str, model: str, gpu: str | None, profile: Path | None) -> BaseConfig:
    """What the simulator assumes for a real engine's runs: the planner's model, GPU and profile."""
    return BaseConfig(preset=model, gpu=gpu or "h100", profile=engine if engine in _SIM_PROFILES else "vllm",
                      config=profile)  # fmt: skip


def refit(
    sweep: Path, cells: Sequence[str], base: BaseConfig, sim_args: SimArgs | None, work: Path, round_: int
) -> Refit | None:
    """Re-fit the planner's constants on the loads of the measured ``cells`` of ``sweep``; the
    profile is written into ``work`` (None: too few loads to hold any out)."""
    paths = [cell_dir(sweep, c) for c in cells if cell_dir(sweep, c).is_dir()]
    if not paths:
        return None
    try:
        screened = screened_loads(paths, base, sim_args)
    except BenchError:
        return None  # nothing calibratable measured yet
    small = [ld for ld in screened.loads if len(ld.sends) <= MAX_SENDS]
    loads = spread(small if len(small) >= HOLD_EVERY else screened.loads, MAX_LOADS)
    if len(loads) < HOLD_EVERY:
        return None
    fit_loads, held = split_held_out(loads, (), HOLD_EVERY)
    fitted = fit(fit_loads, PLAN_KNOBS, rounds=1, restarts=0)
    scores = [s for s in score(held, lambda ld: with_values(ld.timing, fitted.after)) if s.median_abs_error == s.median_abs_error]
    worst = max(scores, key=lambda s: s.median_abs_error)
    path = work / f"refit-{round_}.toml"
    path.write_text(profile_text(base.config, fitted.after))
    moved = tuple((f"{k.table}.{k.name}", fitted.before[k], v) for k, v in fitted.after.items())
    return Refit(path, worst.median_abs_error, worst.metric, len(fit_loads), len(held), moved,
                 tuple(f"{e.name}: {e.reason}" for e in screened.excluded))  # fmt: skip


def profile_text(base: Path | None, values: dict[Knob, float]) -> str:
    """A ``--config`` profile: ``base``'s tables with the fitted constants written over them."""
    data: dict[str, dict[str, Any]] = {}
    if base is not None:
        with open(base, "rb") as f:
            data = {k: dict(v) for k, v in tomllib.load(f).items() if isinstance(v, dict)}
    for k, v in values.items():
        data.setdefault(k.table, {})[k.name] = float(v)
    lines = ["# the planner's constants re-fitted on the cells this planned sweep measured (bench/sweep/plan_refit.py)"]
    for table, rows in data.items():
        lines += ["", f"[{table}]"] + [f"{name} = {json.dumps(value)}" for name, value in rows.items()]
    return "\n".join(lines) + "\n"
