"""The answer of a sweep in a few lines: what to deploy, how much it serves, by what margin,
what limits it and what to verify next.

Read from the recommendation (``recommendation.json``, analysis/recommend_types.py) alone, so the HTML report's first
screen and the terminal text say the same thing. The *what to verify next* column follows the
decision table problem → configuration → what to check (docs/sweeps.md): the limiting resource
names the problem, the recommendation's advice the configuration lever, and the check is the
measurement that would confirm or refute that diagnosis before GPUs are bought.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench_llm.analysis.recommend_types import Configuration, LoadVerdict, Pick, Recommendation

#: limiting factor -> what to measure next to confirm the diagnosis (the "what to check" column).
VERIFY_NEXT = {
    "queueing": "server queue time at the knee load (queue_seconds histogram) against TTFT; then one more DP replica at that load",
    "prefill": "prefill time per prompt token at the knee and the prefix-cache hit rate; then a TP/PCP step up or a disaggregated prefill pool",
    "prefill_unloaded": "TTFT at one request at a time against the prompt length; prefill speed per replica, not load, is the problem",
    "decode": "TPOT against the running batch (running gauge) at the knee; then the same GPUs as more replicas (with smaller TP where TP > 1)",
    "decode_unloaded": "TPOT at one request at a time against the weight + KV bytes read per step; then a larger TP per replica",
    "kv_cache": "peak KV-cache usage and the preemption counter at the knee; then DCP or a larger TP per replica",
    "errors": "the failed requests' error types (requests/ error_type) and the engine log at the knee",
    "none": "no tested load failed, so capacity is only a lower bound: sweep rates above the highest tried",
    "tuning": "the swept flag against the running and waiting gauges at the knee; then values between the two tried",
    "unknown": "give an SLO (--slo) so that loads pass or fail and a limit can be found",
}
#: Margins below this fraction are too small to prefer one configuration on capacity alone.
CLOSE_MARGIN = 0.05


@dataclass(frozen=True)
class Headline:
    """One sweep's answer. Capacities are req/s within the SLOs; ``None`` when not measured."""

    name: str
    gpus: int
    capacity_rps: float | None
    capacity_per_gpu: float | None
    interval_per_gpu: tuple[float | None, float | None]  # (low, high); high None = open above
    interval_note: str
    runner_up: str | None
    runner_up_per_gpu: float | None
    margin_pct: float | None
    #: The recommendation's separation verdict on the capacity brackets (analysis.confidence):
    #: "... is separated from ..." or "... too close to call ..."; "" when it has none.
    separation: str
    limiting_factor: str
    diagnosis: str
    verify_next: str
    message: str
    evidence: LoadVerdict | None  # the load the pick was measured at
    slo: dict[str, float]
    attainment_pct: float | None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _interval(cfg: Configuration | None, pick: Pick) -> tuple[tuple[float | None, float | None], str]:
    """The capacity interval per GPU: the probe bracket [highest passing rate, lowest failing
    rate) of the picked configuration (the pick alone when its configuration is not listed)."""
    gpus = _gpus(pick, cfg)
    lo = _num(cfg.capacity_rps if cfg is not None else pick.capacity_rps)
    hi = _num(cfg.upper_rps) if cfg is not None else None
    if lo is None:
        return (None, None), "no capacity under the SLOs"
    if hi is None:
        return (lo / gpus, None), "lower bound: no tested load failed"
    low = _num(cfg.capacity.interval_low_rps) if cfg is not None else None
    high = _num(cfg.capacity.interval_high_rps) if cfg is not None else None
    seeds = cfg.capacity.interval_seeds if cfg is not None else None
    if low is not None and seeds:  # (docs/sweeps.md, Capacity and its interval: its measured coverage)
        high = high if high is not None else hi
        return (low / gpus, high / gpus), f"interval: another workload seed's capacity, 90% over {seeds} seeds"
    if low is not None and low < lo:  # (docs/sweeps.md, Confidence: its measured coverage)
        high = high if high is not None else hi
        return (low / gpus, high / gpus), "interval: loads decided with a margin either side"
    return (lo / gpus, hi / gpus), "bracket: highest passing to lowest failing load tried"


def _gpus(pick: Pick, cfg: Configuration | None) -> int:
    return int(pick.gpus or (cfg.gpus if cfg is not None else 0) or 1)


def build_headline(rec: Recommendation | None) -> Headline | None:
    """The headline of a recommendation, or None when nothing is recommended."""
    if rec is None or rec.recommendation is None:
        return None
    pick = rec.recommendation
    name = str(pick.cell_id)
    workload = rec.first_workload()
    configs = workload.configurations if workload is not None else []
    cfg = next((c for c in configs if c.cell_id == name), None)
    gpus = _gpus(pick, cfg)
    per_gpu = _num(pick.capacity_rps_per_gpu)
    others = [c for c in configs if c.cell_id != name and _num(c.capacity_rps_per_gpu) is not None]
    runner = max(others, key=lambda c: float(c.capacity_rps_per_gpu or 0.0), default=None)
    runner_pg = _num(runner.capacity_rps_per_gpu) if runner else None
    margin = 100 * (per_gpu / runner_pg - 1) if per_gpu is not None and runner_pg else None
    interval, note = _interval(cfg, pick)
    factor = str((cfg.limiting_factor if cfg is not None else None) or "unknown")
    sep = workload.separation if workload is not None else None
    return Headline(
        name=name,
        gpus=gpus,
        capacity_rps=_num(pick.capacity_rps),
        capacity_per_gpu=per_gpu,
        interval_per_gpu=interval,
        interval_note=note,
        runner_up=str(runner.cell_id) if runner else None,
        runner_up_per_gpu=runner_pg,
        margin_pct=margin,
        separation=sep.text if sep is not None else "",
        limiting_factor=factor,
        diagnosis=cfg.diagnosis if cfg is not None else "",
        verify_next=VERIFY_NEXT.get(factor, VERIFY_NEXT["unknown"]),
        message=rec.message,
        evidence=pick.evidence,
        slo={k: float(v) for k, v in rec.slo.items() if _num(v) is not None},
        attainment_pct=_num(rec.attainment_pct),
    )


def capacity_text(h: Headline) -> str:
    """'32 req/s per GPU (≥ 32: lower bound …)' or 'no capacity under the SLOs'."""
    if h.capacity_per_gpu is None:
        return "capacity not measured (concurrency sweep or no passing rate)"
    lo, hi = h.interval_per_gpu
    if lo is not None and hi is not None:
        span = f"[{lo:.3g}, {hi:.3g})" if h.interval_note.startswith("bracket") else f"[{lo:.3g}, {hi:.3g}]"
    elif lo is not None:
        span = f"≥ {lo:.3g}"
    else:
        span = "interval not measured"
    return f"{h.capacity_per_gpu:.3g} req/s per GPU {span} ({h.interval_note})"


def margin_text(h: Headline) -> str:
    if h.runner_up is None or h.margin_pct is None:
        return "no runner-up with a measured capacity"
    if h.separation:  # the measured verdict on the brackets, not the point estimates
        close = f" - {h.separation}"
    else:
        close = " - too close to call on capacity alone" if abs(h.margin_pct) < 100 * CLOSE_MARGIN else ""
    return f"{h.margin_pct:+.0f}% per GPU over {h.runner_up} ({h.runner_up_per_gpu:.3g} req/s per GPU){close}"


def headline_lines(h: Headline | None, message: str = "") -> list[str]:
    """The same headline as the report's first screen, as terminal text."""
    if h is None:
        return [f"RECOMMENDED: none: {message}" if message else "RECOMMENDED: none"]
    plural = "s" if h.gpus != 1 else ""
    return [
        f"RECOMMENDED: {h.name} ({h.gpus} GPU{plural}), {capacity_text(h)}",
        f"  margin: {margin_text(h)}",
        f"  limited by: {h.limiting_factor}: {h.diagnosis}" if h.diagnosis else f"  limited by: {h.limiting_factor}",
        f"  verify next: {h.verify_next}",
    ]
