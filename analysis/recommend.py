"""The recommendation and the limiting-resource diagnosis of a sweep, from its Parquet alone.

Inputs: ``cells.parquet`` (which cells ran, failed, were skipped), each cell's
``points.parquet`` (one row per load with the configuration as columns) and, when the SLO
is changed after the fact, the load run folders themselves (recomputed from their request
tables). Rules (docs/sweeps.md):

* A configuration *meets the SLOs at the target load* when a measured load at or above the
  target rate had at least the attainment target of requests meeting every SLO and was not
  saturated, and no lower load failed (its capacity is at least the target).
* The recommendation is the smallest such configuration: fewest GPUs, then fewest parallel
  axes, then the highest capacity. Without a target rate: the highest capacity per GPU
  (ties within 5 % go to fewer GPUs, then fewer axes).
* The limiting resource of a configuration is read at its *knee*, the lowest load that
  failed, against its lightest load: which SLO the misses are on, how much of TTFT is queue
  time (server histogram when scraped, otherwise TTFT growth over the lightest load), and
  KV-cache usage / preemptions when the server reported them.

The recommendation is a ``Recommendation`` (analysis/recommend_types.py): its
``to_json()`` is ``recommendation.json``, and the report, the headline
(analysis/headline.py), ``bench recommend`` and the sweep read it back with
``read_recommendation``/``Recommendation.from_json``, so one shape serves all; a
configuration's evidence carries the ``miss_share_*``/``server_*`` columns its points have.
What is computed on the way is typed too: ``Diagnosis``, ``CellCapacity``,
``analysis.capacity_points.PointMetrics``, ``CapacityResult``.

This module assembles the recommendation from its parts: the sweep's folder read
(analysis/recommend_io.py), each cell's loads pooled and its capacity (recommend_pooling.py),
what limits each configuration (recommend_diagnosis.py), the pick and whether it is separated
(recommend_choice.py), and the text (recommend_text.py, ``format_recommendation``).
"""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench_llm.analysis.capacity_repeats import cell_interval, load_repeat_points
from bench_llm.analysis.confidence import CONFIDENCE
from bench_llm.analysis.recommend_choice import choose, per_gpu_separation, same_gpus_tradeoffs, target_separation
from bench_llm.analysis.recommend_diagnosis import Diagnosis, diagnose_cell, swept_causes, tried_levers
from bench_llm.analysis.recommend_io import (
    definition_settings,
    judging_settings,
    load_points,
    read_cells,
    rescore_point,
    resume_command,
    sweep_settings,
)
from bench_llm.analysis.recommend_pooling import cell_capacity, float_or_nan, load_text, one_at_a_time, pooled_loads
from bench_llm.analysis.recommend_text import definitions as recommend_definitions
from bench_llm.analysis.recommend_types import (
    CellCapacity,
    CellStatus,
    Configuration,
    Lightest,
    LoadVerdict,
    Pick,
    Recommendation,
    Separation,
    WorkloadRecommendation,
)
from bench_llm.analysis.slo import SLO
from bench_llm.results.schema import MODEL_ERROR_SOURCE, model_error_column


def recommend(
    sweep: Path,
    slo: dict[str, float] | None = None,
    attainment_pct: float | None = None,
    target_rate: float | None = None,
    target_concurrency: int | None = None,
    confidence: float | None = None,
) -> Recommendation:
    sweep = Path(sweep)
    cells = read_cells(sweep)
    stored = load_points(sweep)
    settings = sweep_settings(sweep, stored) if not stored.empty else {}
    definition = definition_settings(sweep)
    # a sweep resumed with other SLOs (bench sweep --resume --slo) is judged by its definition
    rejudged = bool(settings and definition) and judging_settings(definition) != judging_settings(settings)
    if not settings or rejudged:
        settings = definition
    slo_used = dict(slo) if slo is not None else dict(settings.get("slo") or {})
    points = load_points(sweep, slo=slo_used) if slo is not None or rejudged else stored
    att = attainment_pct if attainment_pct is not None else float(settings.get("attainment_pct") or 90.0)
    target = target_rate if target_rate is not None else settings.get("target_rate")
    target_c = target_concurrency if target_concurrency is not None else settings.get("target_concurrency")
    spec = settings.get("sweep") or {}
    loads = spec.get("loads") or {}
    precision = loads.get("capacity_precision") if loads.get("capacity") else None
    # a sweep stored before verdicts had intervals was judged on the point estimate
    level = float(confidence if confidence is not None else spec.get("confidence", 0.0 if spec else CONFIDENCE))
    definitions = recommend_definitions(att, level, precision)
    cell_list = [CellStatus(**{f: _clean(c.get(f)) for f in _CELL_FIELDS}) for c in cells.to_dict("records")]

    def result(workloads: dict[str, WorkloadRecommendation], untrustworthy: list[str] | None) -> Recommendation:
        first = next(iter(workloads.values()), None)
        return Recommendation(
            sweep=str(sweep), slo=slo_used, attainment_pct=att, confidence=level, target_rate=target,
            target_concurrency=target_c, definitions=definitions, cells=cell_list, workloads=workloads,
            recommendation=first.recommendation if first else None,
            message=first.message if first else "no load was measured in this sweep (see each cell's reason)",
            untrustworthy=untrustworthy,
        )  # fmt: skip

    if points.empty:
        return result({}, None)
    repeats = load_repeat_points(sweep)  # the capacity intervals' repeat searches (analysis/capacity_repeats.py)
    if not repeats.empty and (slo is not None or rejudged):
        repeats = pd.DataFrame([rescore_point(sweep, r, SLO.from_dict(slo_used)) for r in repeats.to_dict("records")])
    workloads = {
        w: _recommend_workload(
            points[points["workload"] == w], cell_list, slo_used, att, target, target_c, precision, level,
            resume_command(sweep, slo_used) if slo_used else "",
            repeats[repeats["workload"] == w] if not repeats.empty else repeats,
        )
        for w in dict.fromkeys(points["workload"].dropna())
    }  # fmt: skip
    return result(workloads, [u for wr in workloads.values() for u in wr.untrustworthy])


#: The columns of cells.parquet a recommendation carries (``CellStatus``).
_CELL_FIELDS = tuple(f.name for f in fields(CellStatus))


def _recommend_workload(
    points: pd.DataFrame,
    cells: list[CellStatus],
    slo: dict[str, float],
    att: float,
    target: float | None,
    target_c: int | None,
    precision: float | None,
    level: float = CONFIDENCE,
    resume: str = "",
    repeats: pd.DataFrame | None = None,
) -> WorkloadRecommendation:
    status = {c.cell_id: c.status for c in cells}
    configs = [
        _configuration(str(cell_id), g, slo, att, precision, level, _of_cell(repeats, str(cell_id)))
        for cell_id, g in points.groupby("cell_id", sort=False)
        if status.get(str(cell_id)) in (None, "complete")
    ]
    configs.sort(key=lambda c: (c.gpus, c.axes, c.cell_id))
    configs = tried_levers(swept_causes(configs))
    lists = (
        [f"{c.cell_id} at {p.load}: {p.untrustworthy}" for c in configs for p in c.loads if p.untrustworthy],
        # (a load that failed anyway needs no longer run: only those it kept from passing)
        [f"{c.cell_id} at {p.load}: {p.under_sampled}" for c in configs for p in c.loads
         if p.under_sampled and p.verdict != "fail"],  # fmt: skip
        [
            f"{c.cell_id} at {p.load}: {p.verdict_reason}"
            for c in configs
            for p in c.loads
            # the one-at-a-time baseline is no capacity probe: its few requests cannot pass, and its
            # verdict stays in the configuration's loads (the evidence table), not in this list
            if p.verdict == "undecided" and not p.untrustworthy and not p.baseline
        ],
        [
            f"{c.cell_id} ({c.gpus_text}): not probed below {c.unknown_below_rps:g} req/s"
            for c in configs
            if c.unknown_below_rps is not None
        ],
    )  # untrustworthy, under-sampled, undecided, unknown
    approx = _approximate_prompts(points) or None
    if not slo:
        return WorkloadRecommendation(
            configs, *lists, recommendation=None, message="no SLO given: nothing to recommend against (pass --slo)",
            approximate_prompts=approx,
        )
    rec, message = choose(configs, target, target_c)
    separation: Separation | None = None
    judged = False
    maybe: list[Configuration] = []
    short: list[str] | None = None
    if rec is not None and target is None and target_c is None:
        separation, judged = per_gpu_separation(configs, rec), True
    if target is None and target_c is None:
        # without a target the pick is the most load per GPU: a configuration whose capacity is
        # unknown below a rate that would beat it per GPU might be the answer
        best = (rec.capacity_rps_per_gpu if rec else None) or 0.0
        maybe = [c for c in configs if c.unknown_below_rps is not None and c.unknown_below_rps / c.gpus > best]
    elif target is not None and (sep := target_separation(configs, rec, target)) is not None:
        separation = sep
    if target is not None:
        short = [
            f"{c.cell_id} ({c.gpus_text}): "
            + (
                f"capacity {c.capacity_rps:g} req/s"
                if c.capacity_rps
                else f"unknown: not probed below {c.unknown_below_rps:g} req/s"
                if c.unknown_below_rps is not None
                else "no capacity under the SLOs"
            )
            for c in configs
            if (c.capacity_rps or 0.0) < target - 1e-9
        ]
        # a configuration not probed down to the target might meet it: the answer waits on it
        maybe = [c for c in configs if c.unknown_below_rps is not None and c.unknown_below_rps > target + 1e-9]
        maybe = [c for c in maybe if rec is None or (c.gpus, c.axes) < (rec.gpus, _axes(configs, rec))]
    if maybe:
        message = _provisional_message(maybe, rec, message, resume)
    return WorkloadRecommendation(
        configs, *lists, recommendation=rec, message=message, separation=separation, separation_judged=judged,
        provisional=bool(maybe), resume_command=resume if maybe else None, short_of_target=short,
        same_gpus_tradeoffs=same_gpus_tradeoffs(configs), approximate_prompts=approx,
    )  # fmt: skip


def _of_cell(repeats: pd.DataFrame | None, cell_id: str) -> pd.DataFrame:
    if repeats is None or repeats.empty or "cell_id" not in repeats:
        return pd.DataFrame()
    return repeats[repeats["cell_id"] == cell_id]


def _configuration(
    cell_id: str, g: pd.DataFrame, slo: dict[str, float], att: float, precision: float | None, level: float,
    repeats: pd.DataFrame | None = None,
) -> Configuration:
    """One configuration of the recommendation: its capacity (its interval from the cell's
    repeat searches, ``repeats``, when it has them), diagnosis, lightest load and every load's
    pooled verdict."""
    gpus = int(g["gpus"].iloc[0])
    axes = int(g["axes"].iloc[0]) if "axes" in g else 0
    pooled = pooled_loads(g, att, level)  # once per cell: the capacity and the diagnosis read it too
    cap = cell_capacity(g, att, precision, level, pooled)
    if repeats is not None and not repeats.empty:
        cap = cell_interval(cap, repeats, att, level)
    diag = diagnose_cell(g, slo, att, level, pooled) if slo else Diagnosis("unknown", "no SLO given", {})
    base = pooled.iloc[0] if len(pooled) else None
    return Configuration(
        cell_id=cell_id,
        gpus=gpus,
        axes=axes,
        tuning=_clean(g["tuning"].iloc[0]) if "tuning" in g else None,
        capacity=CellCapacity(**{f: _clean(getattr(cap, f)) for f in _CAPACITY_FIELDS}),
        capacity_rps_per_gpu=(cap.capacity_rps / gpus) if cap.capacity_rps else None,
        limiting_factor=diag.limiting_factor,
        diagnosis=diag.explanation,
        evidence=_clean_dict(diag.evidence),
        lightest=Lightest(
            load_text(base) if base is not None else None,
            _clean(float_or_nan(base.get("ttft_p50_ms"))) if base is not None else None,
            _clean(float_or_nan(base.get("tpot_p50_ms"))) if base is not None else None,
            base is not None and one_at_a_time(base),
        ),
        loads=[_point_summary(r) for _, r in pooled.iterrows()],
        model_error=_clean(float_or_nan(_first(g, model_error_column("capacity")))),
        model_error_source=_clean(_first(g, MODEL_ERROR_SOURCE)),
    )


def _first(g: pd.DataFrame, column: str) -> Any:
    """The column's first non-null value in the cell's points (None: absent or all null)."""
    if column not in g:
        return None
    values = g[column].dropna()
    return values.iloc[0] if len(values) else None


_CAPACITY_FIELDS = tuple(f.name for f in fields(CellCapacity))


def _provisional_message(maybe: list[Configuration], rec: Pick | None, message: str, resume: str) -> str:
    """Configurations not probed where they could change the answer: the answer waits on them
    (PROVISIONAL), and the message says which loads are missing and the command that probes them."""
    return (message + "; " if rec else "") + (
        "not known for "
        + ", ".join(f"{c.cell_id} ({c.gpus_text}, not probed below {c.unknown_below_rps:g} req/s)" for c in maybe)
        + f": probe the missing loads with `{resume}`"
    )


def _axes(configs: list[Configuration], rec: Pick) -> int:
    return next((int(c.axes) for c in configs if c.cell_id == rec.cell_id), 0)


def _point_summary(r: pd.Series) -> LoadVerdict:
    return LoadVerdict(
        load=load_text(r),
        load_kind=_clean(r["load_kind"]),
        load_value=float(r["load_value"]),
        baseline=bool(r.get("_base", False)),
        passed=bool(r["passed"]),
        attainment=_clean(float_or_nan(r.get("attainment"))),
        goodput_rps=_clean(float_or_nan(r.get("goodput_rps"))),
        throughput_rps=_clean(float_or_nan(r.get("throughput_rps"))),
        requests=int(r.get("requests", 0)),
        saturated=bool(r["saturated"]),
        saturation_reason=_clean(r.get("saturation_reason")),
        runs=_clean(r.get("runs")),
        verdict=_clean(r.get("verdict")),
        verdict_reason=_clean(r.get("verdict_reason")),
        attainment_low=_clean(float_or_nan(r.get("attainment_low"))),
        attainment_high=_clean(float_or_nan(r.get("attainment_high"))),
        untrustworthy=_clean(r.get("untrustworthy")),
        under_sampled=_clean(r.get("under_sampled")),
        ttft_p50_ms=_clean(float_or_nan(r.get("ttft_p50_ms"))),
        ttft_p90_ms=_clean(float_or_nan(r.get("ttft_p90_ms"))),
        tpot_p50_ms=_clean(float_or_nan(r.get("tpot_p50_ms"))),
        tpot_p90_ms=_clean(float_or_nan(r.get("tpot_p90_ms"))),
        e2e_p90_ms=_clean(float_or_nan(r.get("e2e_p90_ms"))),
        confirmed=bool(r.get("confirmed") is True or r.get("confirmed") == True),  # noqa: E712 (numpy bools)
    )


def _approximate_prompts(points: pd.DataFrame) -> list[str]:
    """Per configuration whose loads sent prompts off the lengths asked for: how many loads and
    by how much (the points' ``prompt_approximate``/``prompt_ratio_p50``)."""
    if "prompt_approximate" not in points or "prompt_ratio_p50" not in points:
        return []
    out = []
    for cell, g in points.groupby("cell_id", sort=False):
        off = g[g["prompt_approximate"].notna()]
        if off.empty:
            continue
        r = off["prompt_ratio_p50"].astype("float64").dropna()
        if r.empty:
            out.append(f"{cell}: {len(off)} of {len(g)} loads, {off['prompt_approximate'].iloc[0]}")
            continue
        span = f"{r.min():.2f}x" if r.max() - r.min() < 0.005 else f"{r.min():.2f}-{r.max():.2f}x"
        out.append(f"{cell}: {len(off)} of {len(g)} loads, the engine counted {span} the requested prompt length (p50)")
    return out


def _clean(v: Any) -> Any:
    if isinstance(v, (np.generic,)):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _clean_dict(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _clean(v) for k, v in d.items()}

