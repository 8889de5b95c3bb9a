"""A recommendation as text: ``format_recommendation`` (what ``bench recommend`` and the sweep
print), its configuration table, and the definitions of its figures (``definitions``)."""

from __future__ import annotations

import math
from typing import Any

from bench_llm.analysis.headline import build_headline, headline_lines
from bench_llm.analysis.recommend_types import CellStatus, Configuration, Definitions, Recommendation


def definitions(att: float, level: float, precision: float | None) -> Definitions:
    """The recommendation's definitions of its figures, at its attainment target, confidence
    level and search precision."""
    return Definitions(
        capacity_rps=(
            f"highest offered rate that passed (>= {att:g}% of requests met every SLO, decided "
            f"{_decided(level)}, and the load was not saturated; DistServe goodput); "
            + (
                f"searched by bracketing and bisection to {100 * precision:g}% precision"
                if precision
                else "here the highest listed rate that passed below the lowest that failed"
            )
        ),
        goodput_rps="single run: requests meeting every SLO per second of the run window",
        attainment=(
            "share of judged requests (failures and drain-deadline cancellations count as misses; anomalous "
            f"records are left out) meeting every SLO, with its {100 * level:g}% Wilson interval"
        ),
        verdict=(
            f"a load passes when its whole attainment interval is at or above {att:g}%, fails when it is wholly "
            "below (or the load saturated), and is undecided otherwise, when under-sampled, or when the client "
            "could not measure it truthfully"
        ),
    )


def format_recommendation(rec: Recommendation) -> str:
    lines: list[str] = []
    slo = ", ".join(f"{k}<={v:g}" for k, v in rec.slo.items()) or "none"
    tgt = rec.target_rate
    per_job = any(k.startswith("job_") for k in rec.slo)  # job SLOs: loads of session graphs, judged per job
    lines.append(
        f"SLO: {slo}; attainment target {_pct(rec.attainment_pct):g}% of {'jobs' if per_job else 'requests'}"
        + (f"; target load {tgt:g} {'jobs/s' if per_job else 'req/s'}" if tgt else "")
    )
    if per_job:
        lines.append("units: the loads are session graphs judged per job: every rate and capacity below written "
                     "'req/s' is jobs per second")
    head = headline_lines(build_headline(rec), rec.message)
    if len(rec.workloads) > 1:  # the headline is the first workload's; each has its own pick
        head.insert(1, f"  for workload {next(iter(rec.workloads))}; each workload's own pick is below")
    lines += head
    if not rec.workloads:
        lines.append(_table([], rec.cells))
        lines.append(f"RECOMMENDATION: none: {rec.message}")
    for w, wr in rec.workloads.items():
        if len(rec.workloads) > 1:
            lines.append(f"\nworkload {w}:")
        lines.append(_table(wr.configurations, rec.cells))
        r = wr.recommendation
        if r:
            plural = "s" if r.gpus != 1 else ""
            lines.append(f"RECOMMENDATION: {r.cell_id} ({r.gpus} GPU{plural}): {wr.message}")
            if wr.untrustworthy:
                lines.append(f"  UNTRUSTWORTHY: {len(wr.untrustworthy)} load(s) could not be measured truthfully (listed below)")
            if wr.provisional:
                lines.append(
                    "  PROVISIONAL: a configuration that could change the answer was not probed at these loads; "
                    f"probe them with: {wr.resume_command}"
                )
            ev = r.evidence
            if ev:
                lines.append(
                    f"  evidence: at {ev.load}, {100 * (ev.attainment or 0):.1f}% of {ev.requests} requests met every SLO; "
                    f"TTFT p90 {_ms(ev.ttft_p90_ms)}, TPOT p90 {_ms(ev.tpot_p90_ms, 1)}, "
                    f"{ev.throughput_rps or 0:.2f} req/s served"
                    + (f" ({', '.join(ev.runs)})" if ev.runs else "")
                )
        else:
            lines.append(f"RECOMMENDATION: none: {wr.message}")
        sep = wr.separation
        if sep:
            lines.append(f"  {'separated' if sep.separated else 'TOO CLOSE TO CALL'}: {sep.text}")
        if wr.short_of_target:
            lines.append(f"  short of {rec.target_rate:g} req/s: " + "; ".join(wr.short_of_target))
        for c in wr.configurations:
            why = _unconfirmed(c)
            if why:
                lines.append(f"  NOT CONFIRMED: {c.cell_id}: {why}")
        for items, title in (
            (wr.untrustworthy, "UNTRUSTWORTHY (the client could not measure it truthfully; it decides nothing)"),
            (wr.under_sampled, "too short or not stationary (cannot pass)"),
            (wr.undecided, "undecided (the sample cannot decide)"),
            (wr.unknown, "unknown"),
        ):
            for item in items:
                lines.append(f"  {title}: {item}")
        for item in wr.approximate_prompts or []:
            lines.append(f"  PROMPTS APPROXIMATE (capacity is for the prompts sent, not the lengths asked for; exact "
                         f"with the engine's /tokenize or --tokenizer DIR): {item}")  # fmt: skip
        for c in wr.configurations:
            lines.append(f"  {c.cell_id}: {c.diagnosis}")
        for t in wr.same_gpus_tradeoffs or []:
            lines.append(f"  {t}")
    lines.append("capacity_rps: " + rec.definitions.capacity_rps + ".")
    lines.append(
        f"capacity req/s column: L-U = passed at L, failed at U (each decided {_decided(rec.confidence)}); "
        "L+ = nothing failed above L; <U? = not probed below U."
    )
    lines.append("goodput (per load): " + rec.definitions.goodput_rps + ".")
    return "\n".join(lines)


def _pct(v: float | None) -> float:
    return math.nan if v is None else v


def _decided(level: float) -> str:
    return f"at {100 * level:g}% confidence" if level > 0 else "on the point estimate (--confidence 0)"


def _ms(v: Any, digits: int = 0) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.{digits}f} ms"


def _unconfirmed(c: Configuration) -> str | None:
    """Why a configuration's capacity is not confirmed: its search ran confirmation loads
    (docs/sweeps.md, Confirmation) and none at the capacity held (None: confirmed, or no
    confirmation was run, as in a rate list)."""
    cap = c.capacity_rps
    tried = [p for p in c.loads if p.confirmed and not p.baseline]
    if cap is None or not tried or any(p.confirmed and abs(p.load_value - cap) < 1e-9 for p in tried):
        return None
    rates = ", ".join(f"{p.load_value:g}" for p in sorted(tried, key=lambda p: p.load_value))
    return (f"its capacity {cap:g} req/s rests on a probe; the confirmation loads at {rates} req/s "
            "did not hold (read it as a bound to verify, not an answer)")  # fmt: skip


def _table(configs: list[Configuration], cells: list[CellStatus]) -> str:
    w = max([20] + [len(str(c.cell_id)) + 2 for c in cells])
    header = (f"{'cell':<{w}}{'GPUs':>5}  {'status':<9}{'capacity req/s':>15}{'per GPU':>9}  {'met at cap':>15}"
              f"  {'max goodput':>12}  {'limited by':<18}")  # fmt: skip
    lines = [header, "-" * len(header)]
    by_id = {c.cell_id: c for c in configs}
    for cell in cells:
        cid = cell.cell_id
        c = by_id.get(cid)
        if c is None:
            reason = cell.reason.splitlines()[0] if cell.reason else ""
            reason = reason if len(reason) <= 100 else reason[:97] + "..."
            lines.append(f"{cid:<{w}}{cell.gpus or 0:>5}  {cell.status:<9}{'':>15}{'':>9}  {'':>15}  {'':>12}  {reason}")
            continue
        cap = c.capacity_rps
        if cap is not None:
            capt = f"{cap:g}" + (f"-{c.upper_rps:g}" if c.upper_rps is not None else "+")
            pg = f"{c.capacity_rps_per_gpu:.3g}"
        elif c.max_concurrency:
            capt, pg = f"c={c.max_concurrency}", ""
        elif c.unknown_below_rps is not None:
            capt, pg = f"<{c.unknown_below_rps:g}?", ""
        else:
            capt, pg = "none", ""
        good = max((p.goodput_rps or 0.0 for p in c.loads if not p.baseline), default=0.0)
        # the attainment beside the capacity: its load pooled (probe and confirmation runs)
        at = next((p for p in c.loads if cap is not None and p.load_kind == "rate" and not p.baseline
                   and abs(p.load_value - cap) < 1e-9 and p.attainment is not None), None)  # fmt: skip
        met = f"{100 * (at.attainment or 0.0):.1f}% of {at.requests}" if at is not None else ""
        if at is not None and not at.confirmed and any(p.confirmed for p in c.loads):
            met += "?"  # the search confirmed other rates, none held: this one is unconfirmed
        lines.append(f"{cid:<{w}}{c.gpus:>5}  {'complete':<9}{capt:>15}{pg:>9}  {met:>15}  {good:>12.2f}  "
                     f"{c.limiting_factor:<18}")  # fmt: skip
    return "\n".join(lines)
