"""The choice among a sweep's configurations: the pick (``choose``: the smallest meeting the
target load, or the most load per GPU), whether it is separated from the runner-up or too
close to call (``per_gpu_separation``, ``target_separation``), and what the same GPUs trade
between one fast request and more concurrent ones (``same_gpus_tradeoffs``)."""

from __future__ import annotations

import math
from typing import Any

from bench_llm.analysis.confidence import separation
from bench_llm.analysis.recommend_diagnosis import TIE_FRACTION, layout_id
from bench_llm.analysis.recommend_types import Configuration, Lightest, LoadVerdict, Pick, Separation, model_interval

#: Lightest-load latencies closer than this (relative) do not name a "fastest single request".
SINGLE_REQUEST_MARGIN = 0.10


def per_gpu_separation(configs: list[Configuration], rec: Pick) -> Separation | None:
    """Is the recommended configuration's capacity per GPU separated from the runner-up's?
    (analysis.confidence.separation on the intervals: lower = passed with a margin, upper = lowest fail.)"""
    pick = next(c for c in configs if c.cell_id == rec.cell_id)
    others = [c for c in configs if c.cell_id != pick.cell_id and c.capacity_rps]
    if not others:
        return None
    runner = max(others, key=lambda c: (c.capacity_rps or 0.0) / c.gpus)  # every one has a capacity
    sep = separation(pick.cell_id, _per_gpu_bracket(pick), runner.cell_id, _per_gpu_bracket(runner))
    return Separation(runner.cell_id, sep.separated, sep.text + " (per GPU" + _model_note(pick, runner) + ")")


def target_separation(configs: list[Configuration], rec: Pick | None, target: float) -> Separation | None:
    """With a target load the answer is the smallest configuration meeting it: is that decided?

    Every configuration the choice would prefer (fewer GPUs, fewer parallel axes; any, when
    none met the target) and that fell short must have failed, decided, at or below the target.
    One that passed below the target and never failed at or below it has a bracket that holds
    the target: a repeat may find it meeting the target, so the answer is too close to call.
    """
    def rank(c: Configuration) -> tuple[int, int]:
        return int(c.gpus), int(c.axes)

    picked = None if rec is None else next((c for c in configs if c.cell_id == rec.cell_id), None)
    short = [
        c for c in configs
        if c.capacity_rps and c.capacity_rps < target - 1e-9 and (picked is None or rank(c) < rank(picked))
    ]  # fmt: skip
    if not short:
        return None
    runner = max(short, key=lambda c: c.capacity_rps or 0.0)
    open_ = [c for c in short if _top(c) is None or _top(c) > target + 1e-9  # type: ignore[operator]
             or model_target_call(c.cell_id, c.capacity_rps, c.model_error, target) is not None]  # fmt: skip
    name = rec.cell_id if rec is not None else "no configuration"
    if not open_:
        why = (f"failed at {runner.upper_rps:.4g} req/s" if runner.capacity.interval_seeds is None
               else f"another seed's capacity lies below {_top(runner):.4g} req/s")  # fmt: skip
        return Separation(runner.cell_id, True, f"{name} is separated from {runner.cell_id}: {runner.cell_id} {why}, "
                          f"at or below the target {target:g}")  # fmt: skip
    c = max(open_, key=lambda c: c.capacity_rps or 0.0)
    fails = f"failed only at {c.upper_rps:.4g} req/s" if c.upper_rps else "no load failed"
    if c.capacity.interval_seeds and _top(c) is not None:
        fails = f"another seed's capacity may reach {_top(c):.4g} req/s ({c.capacity.interval_seeds} seeds)"
    # a simulated capacity: a measured engine may do better by the model's error
    call = model_target_call(c.cell_id, c.capacity_rps, c.model_error, target)
    return Separation(
        c.cell_id,
        False,
        f"{name} and {c.cell_id} are too close to call at {target:g} req/s ({c.cell_id} passed "
        f"{c.capacity_rps:.4g} req/s and {fails}" + (f"; {call})" if call else ": it may meet the target too)"),
    )


def model_target_call(cell_id: str, capacity_rps: float | None, model_error: float | None, target: float) -> str | None:
    """The one rule, and its words, for a simulated capacity against a target load (used by
    ``target_separation`` and by the sweep's model-error lines, bench/sweep/model_error.py): the
    capacity's model interval ``[c(1-e), c(1+e)]`` (``model_interval``) holds the target, so a
    measured engine may meet it or fall short: too close to call on the model alone. None: a
    measured capacity (no error), or an interval wholly on one side of the target."""
    interval = model_interval(capacity_rps, model_error)
    if interval is None or model_error is None:
        return None
    lo, hi = interval
    if lo >= target - 1e-9 or hi < target - 1e-9:
        return None
    return (f"too close to call against the target {target:g} req/s: {cell_id} [{lo:.4g}, {hi:.4g}] at the simulated "
            f"engine's error ±{model_error:.1%}: a measured engine may meet it or fall short")  # fmt: skip


def _top(c: Configuration) -> float | None:
    """The top of a configuration's capacity interval (the repeats' or margin-decided,
    docs/sweeps.md), else of its probe bracket: "too close to call" uses the intervals."""
    return c.capacity.interval_high_rps if c.capacity.interval_high_rps is not None else c.upper_rps


def _per_gpu_bracket(c: Configuration) -> tuple[float | None, float | None]:
    """Per GPU: the capacity interval (``interval_low_rps``, ``interval_high_rps``: rates
    decided with a margin; the probe bracket's ends where there are none), so "too close to
    call" uses the intervals meant to hold another seed's answer."""
    lo, hi = c.capacity.interval_low_rps or c.capacity_rps, c.capacity.interval_high_rps or c.upper_rps
    model = c.model_interval_rps  # a simulated capacity: widened by the model's error (results/schema.py)
    if model is not None:
        lo, hi = min(lo or model[0], model[0]), max(hi or model[1], model[1])
    return (lo / c.gpus if lo else None), (hi / c.gpus if hi else None)


def _model_note(*configs: Configuration) -> str:
    """Says the intervals compared hold the simulated engine's error, and where it comes from."""
    sim = [c for c in configs if c.model_error is not None]
    if not sim:
        return ""
    return (f"; simulated capacities widened by the model's error ±{max(c.model_error or 0.0 for c in sim):.1%}, "
            f"from {sim[0].model_error_source}")


def choose(configs: list[Configuration], target: float | None, target_c: int | None) -> tuple[Pick | None, str]:
    def order(c: Configuration) -> tuple[Any, ...]:
        return (c.gpus, c.axes, -(c.capacity_rps or 0.0), c.cell_id)

    if target is not None:
        ok = [c for c in configs if c.capacity_rps is not None and c.capacity_rps >= target - 1e-9]
        if not ok:
            best = max(configs, key=lambda c: c.capacity_rps or 0.0, default=None)
            hint = (
                f"; the highest capacity measured is {best.cell_id} at {best.capacity_rps:g} req/s"
                if best and best.capacity_rps
                else ""
            )
            return None, f"no configuration meets the SLOs at {target:g} req/s{hint}"
        pick = min(ok, key=order)
        ev = _evidence_at(pick, target)
        return _rec(pick, ev), f"the smallest configuration meeting the SLOs at {target:g} req/s"
    if target_c is not None:
        ok = [c for c in configs if (c.max_concurrency or 0) >= target_c]
        if not ok:
            return None, f"no configuration meets the SLOs at concurrency {target_c}"
        pick = min(ok, key=order)
        return _rec(pick, _evidence_at(pick, float(target_c), "concurrency")), (
            f"the smallest configuration meeting the SLOs at concurrency {target_c}"
        )
    with_cap = [c for c in configs if c.capacity_rps]
    if with_cap:
        top = max(with_cap, key=lambda c: (c.capacity_rps_per_gpu, -c.gpus))
        # within noise of the best: its bracket is not separated from the best's (or within
        # TIE_FRACTION): then GPU count decides
        tied = [
            c
            for c in with_cap
            if c is top
            or (c.capacity_rps_per_gpu or 0.0) >= (1 - TIE_FRACTION) * (top.capacity_rps_per_gpu or 0.0)
            or not separation(top.cell_id, _per_gpu_bracket(top), c.cell_id, _per_gpu_bracket(c)).separated
        ]
        pick = min(tied, key=order)
        close = [c.cell_id for c in tied if c is not pick]
        why = (
            f"; too close to call with {', '.join(close)}: the choice falls to GPU count" if close else ""
        )
        return _rec(pick, _evidence_at(pick, pick.capacity_rps or 0.0)), (
            f"the most load per GPU within the SLOs ({pick.capacity_rps_per_gpu:.3g} req/s per GPU; "
            f"no --target-rate given, so no smaller configuration is preferred for meeting one){why}"
        )
    with_c = [c for c in configs if c.max_concurrency]
    if with_c:
        pick = max(with_c, key=lambda c: ((c.capacity.throughput_rps_at_max or 0) / c.gpus, -c.gpus, -c.axes))
        return _rec(pick, _evidence_at(pick, float(pick.max_concurrency or 0), "concurrency")), (
            "the highest SLO-meeting throughput per GPU (no --target-concurrency given)"
        )
    return None, "no configuration met the SLOs at any tested load"


def _rec(pick: Configuration, evidence: LoadVerdict | None) -> Pick:
    return Pick(pick.cell_id, pick.gpus, pick.capacity_rps, pick.capacity_rps_per_gpu, evidence)


def _evidence_at(cfg: Configuration, value: float, kind: str = "rate") -> LoadVerdict | None:
    """The passing load closest above ``value`` (else the highest passing one)."""
    passing = [p for p in cfg.loads if p.passed and not p.baseline and p.load_kind == kind]
    above = [p for p in passing if p.load_value >= value - 1e-9]
    if above:
        return min(above, key=lambda p: p.load_value)
    return max(passing, key=lambda p: p.load_value) if passing else None


def same_gpus_tradeoffs(configs: list[Configuration]) -> list[str]:
    """Same GPUs, spent on one fast request (lowest unloaded latency) or on more concurrent ones
    (highest capacity). A "fastest" claim needs a lead beyond ``SINGLE_REQUEST_MARGIN`` over the
    next configuration, and is not made between cells of one layout that differ only in a swept
    flag at one request at a time (a batching flag cannot change a lone request: the gap is the
    host's noise). It says "single request" only where the lightest load was one at a time."""
    lines = []
    by_gpus: dict[int, list[Configuration]] = {}
    for c in configs:
        by_gpus.setdefault(c.gpus, []).append(c)
    for gpus, group in sorted(by_gpus.items()):
        if len(group) < 2:
            continue
        lat = [c for c in group if c.lightest.ttft_p50_ms is not None]
        if not lat:
            continue

        def score(c: Configuration) -> float:
            return (c.lightest.ttft_p50_ms or math.inf) + 100 * (c.lightest.tpot_p50_ms or 0)

        ranked = sorted(lat, key=score)
        fastest = ranked[0]
        caps = {c.cell_id: (c.capacity_rps or c.capacity.throughput_rps_at_max or 0.0) for c in group}
        best = max(caps.values())
        leaders = [cid for cid, v in caps.items() if best > 0 and v >= (1 - TIE_FRACTION) * best]
        fl = fastest.lightest
        single = all(_one_at_a_time(c.lightest) for c in ranked)
        same_layout = len({layout_id(c) for c in ranked}) == 1
        clear = len(ranked) < 2 or _clear_lead(fastest, ranked[1])
        what = "fastest single request" if single else "lowest latency at its lightest load"
        fast_text = (
            f"{fastest.cell_id} gives the {what} "
            f"(TTFT p50 {fl.ttft_p50_ms:,.0f} ms, TPOT p50 {fl.tpot_p50_ms or float('nan'):.1f} ms at {fl.load})"
        )
        if not clear or (single and same_layout):
            why = ("one layout, and one request at a time does not exercise the swept flag" if single and same_layout
                   else f"within {100 * SINGLE_REQUEST_MARGIN:.0f}% of each other")  # fmt: skip
            fast_text = f"unloaded latency ties ({why})"
            fastest = None  # type: ignore[assignment]
        if fastest is not None and len(leaders) == 1 and leaders[0] == fastest.cell_id:
            lines.append(f"{gpus} GPUs: {fastest.cell_id} gives both the {what} and the highest capacity")
        elif len(leaders) != 1:
            lines.append(f"{gpus} GPUs: {fast_text}; capacities tie within the loads tried")
        else:
            most = next(c for c in group if c.cell_id == leaders[0])
            cap = most.capacity_rps
            lines.append(
                f"{gpus} GPUs: {fast_text}; {most.cell_id} serves the most concurrent load"
                + (f" ({cap:g} req/s within the SLOs)" if cap else "")
            )
    return lines


def _clear_lead(fast: Configuration, next_: Configuration) -> bool:
    """``fast`` leads ``next_`` by more than ``SINGLE_REQUEST_MARGIN`` in TTFT or TPOT p50."""
    m = 1 + SINGLE_REQUEST_MARGIN
    a, b = fast.lightest, next_.lightest
    ttft = a.ttft_p50_ms is not None and b.ttft_p50_ms is not None and b.ttft_p50_ms > m * a.ttft_p50_ms
    tpot = a.tpot_p50_ms is not None and b.tpot_p50_ms is not None and b.tpot_p50_ms > m * a.tpot_p50_ms
    return bool(ttft or tpot)


def _one_at_a_time(lightest: Lightest) -> bool:
    if lightest.one_at_a_time is not None:
        return lightest.one_at_a_time
    # a recommendation.json written before ``one_at_a_time``: its load's name is all it has
    load = lightest.load
    return bool(load) and ("one request at a time" in str(load) or str(load) == "concurrency 1")

