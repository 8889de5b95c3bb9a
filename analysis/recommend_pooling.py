"""A cell's loads pooled and judged: one row per load value, its repeats and re-measurements
pooled (``pooled_loads``, the verdict of ``analysis.capacity.judge_load``), and the cell's
capacity read from them (``cell_capacity``, ``rate_probes``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from bench_llm.analysis.capacity import CapacityResult, Probe, capacity_from_probes, judge_load
from bench_llm.analysis.confidence import CONFIDENCE
from bench_llm.analysis.recommend_types import CellCapacity

#: How to measure what a re-judged sweep did not probe (the per-cell note; the message names
#: the whole command, ``resume_command``).
PROBE_HINT = "bench sweep --resume with these SLOs probes the missing loads"


def pooled_loads(points: pd.DataFrame, attainment_pct: float, level: float = CONFIDENCE) -> pd.DataFrame:
    """One row per load value: repeats pooled (attainment weighted by requests) and judged
    (``passed``, ``verdict``); the one-at-a-time baseline first (``_base``), then by load."""
    done = points[points["status"].isin(["complete", "interrupted"])].copy()
    if done.empty:
        return done
    done["_w"] = done["requests"].astype(float)
    role = done["role"] if "role" in done else pd.Series("load", index=done.index)
    done["_base"] = role.fillna("load").eq("baseline")
    done = done.reset_index(drop=True)  # positions = index labels (the groups below are read by position)
    # every column read once, as a whole (a pandas column access per group and column cost
    # more than the rest of the sweep's judging); the groups then slice these
    columns = list(done.columns)
    values = {c: done[c].tolist() for c in columns}
    pooled_cols = [
        c
        for c in columns
        if c.startswith(("ttft_", "tpot_", "e2e_", "miss_share_", "server_"))
        or c in ("attainment", "throughput_rps", "goodput_rps", "admitted_rps")
    ]
    numeric = {c: pd.to_numeric(done[c], errors="coerce").to_numpy(dtype=float) for c in pooled_cols}
    weights = done["_w"].to_numpy()
    saturated = done["saturated"].fillna(False).to_numpy()
    reasons_all = done["saturation_reason"].tolist() if "saturation_reason" in done else None
    run_dirs = done["run_dir"].tolist()
    roles = done["role"].tolist() if "role" in done else None
    out = []
    for pos in _group_positions(values["_base"], values["load_kind"], values["load_value"]):
        w = weights[pos]
        row = {c: values[c][pos[0]] for c in columns}
        for col in pooled_cols:
            vals = numeric[col][pos]
            ok = ~np.isnan(vals)
            row[col] = float(np.average(vals[ok], weights=w[ok])) if ok.any() and w[ok].sum() > 0 else float("nan")
        row["requests"] = int(w.sum())
        row["saturated"] = bool(saturated[pos].any())
        reasons = [] if reasons_all is None else [r for r in (reasons_all[i] for i in pos) if not pd.isna(r)]
        row["saturation_reason"] = reasons[0] if reasons else None
        row["runs"] = [r for r in (run_dirs[i] for i in pos) if not pd.isna(r)]
        row["confirmed"] = roles is not None and any(roles[i] == "confirm" for i in pos)
        records = [{k: (None if _missing(v) else v) for k, v in ((c, values[c][i]) for c in columns)} for i in pos]
        _judge(row, records, attainment_pct, level)
        out.append(row)
    df = pd.DataFrame(out)
    # the one-at-a-time baseline first (the lightest load), then by load
    return df.sort_values(["_base", "load_value"], ascending=[False, True], kind="stable").reset_index(drop=True)


def _group_positions(*keys: list[Any]) -> list[np.ndarray]:
    """Row positions of each distinct key (``DataFrame.groupby(keys, sort=True)``'s groups, in
    its order: keys sorted, rows in table order, rows with a missing key left out)."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, key in enumerate(zip(*keys)):
        if not any(_missing(k) for k in key):
            groups.setdefault(key, []).append(i)
    return [np.array(groups[k], dtype=np.intp) for k in sorted(groups)]


def _judge(row: dict[str, Any], records: list[dict[str, Any]], attainment_pct: float, level: float) -> None:
    """The load's pooled verdict (analysis.capacity.judge_load) into ``row``; the pooled
    figures are those of the runs the client measured truthfully. ``records``: the load's
    runs, one dict each (missing values as None)."""
    if all(r.get("attainment") is None for r in records):  # no SLO: saturation alone
        row.update(passed=not row["saturated"], verdict="pass" if not row["saturated"] else "fail", verdict_reason=None)
        row.update(untrustworthy=None, under_sampled=None, attainment_low=math.nan, attainment_high=math.nan, sure=False)
        return
    j = judge_load(records, attainment_pct, level)
    row.update(
        saturated=j.saturated,  # a stalled client's "saturation" is not the server's
        passed=j.passed,
        verdict=j.verdict,
        verdict_reason=j.reason or None,
        untrustworthy=j.untrustworthy,
        under_sampled=j.under_sampled,
        attainment_low=j.low,
        attainment_high=j.high,
        sure=j.sure,
    )
    if j.judged:
        row["attainment"], row["requests"] = j.attainment, j.judged


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def cell_capacity(
    points: pd.DataFrame,
    attainment_pct: float,
    precision: float | None,
    level: float = CONFIDENCE,
    pooled: pd.DataFrame | None = None,
) -> CellCapacity:
    """Capacity of one cell and workload (rate loads), or the best passing concurrency.
    ``pooled``: ``pooled_loads(points, attainment_pct, level)`` when the caller has it already."""
    if pooled is None:
        pooled = pooled_loads(points, attainment_pct, level)
    if pooled.empty:
        return CellCapacity(note="no measured loads")
    rates = pooled[(pooled["load_kind"] == "rate") & ~pooled["_base"]]
    if len(rates):
        res = capacity_from_probes(rate_probes(pooled), precision if precision else float("nan"))
        unknown_below, note = _unprobed(pooled, rates, res)
        return CellCapacity(
            kind="rate",
            capacity_rps=res.capacity_rps,
            upper_rps=res.upper_rps,
            interval_low_rps=res.interval_low_rps,
            interval_high_rps=res.interval_high_rps,
            precision=precision,
            achieved_precision=res.achieved_precision,
            converged=res.converged if precision else res.upper_rps is not None,
            undecided=list(res.undecided),
            level=res.level,
            note=note,
            unknown_below_rps=unknown_below,
        )
    conc = pooled[(pooled["load_kind"] == "concurrency") & ~pooled["_base"]]
    good = conc[conc["passed"]]
    best = good.iloc[-1] if len(good) else None
    return CellCapacity(
        kind="concurrency",
        max_concurrency=int(best["load_value"]) if best is not None else None,
        throughput_rps_at_max=float(best["throughput_rps"]) if best is not None else None,
        note="" if best is not None else "no tested concurrency met the SLOs",
    )


def rate_probes(pooled: pd.DataFrame) -> list[Probe]:
    """The rate loads of a pooled cell (``pooled_loads``), as the capacity search's probes."""
    rates = pooled[(pooled["load_kind"] == "rate") & ~pooled["_base"]] if len(pooled) else pooled
    return [
        Probe(
            float(r["load_value"]), bool(r["passed"]), float_or_nan(r.get("attainment")), bool(r["saturated"]),
            r.get("verdict") == "undecided", str(r.get("verdict_reason") or ""), isinstance(r.get("sure"), (bool, np.bool_)) and bool(r.get("sure")),
        )
        for _, r in rates.iterrows()
    ]  # fmt: skip


def _unprobed(pooled: pd.DataFrame, rates: pd.DataFrame, res: CapacityResult) -> tuple[float | None, str]:
    """When no probed rate passed: is that a verdict (the configuration fails even one
    request at a time) or a gap (nothing below the lowest probed rate was measured, as after
    re-judging with tighter SLOs)? A gap is said, never turned into "no capacity".
    Returns the rate below which capacity is unknown (None: no gap) and the capacity's note."""
    if res.capacity_rps is not None or rates.empty:
        return None, res.note
    base = pooled[pooled["_base"]]
    if len(base) and base.iloc[0].get("verdict") == "fail":
        return None, "fails the SLOs even one request at a time" + (f"; {res.note}" if res.note else "")
    lowest = float(rates["load_value"].min())
    return lowest, (
        f"not probed below {lowest:g} req/s: capacity unknown there "
        f"({PROBE_HINT}); {res.note}"
    )


def one_at_a_time(row: pd.Series) -> bool:
    """A pooled load sent one request at a time: the baseline, or concurrency 1."""
    return bool(row.get("_base", False)) or (row["load_kind"] == "concurrency" and float(row["load_value"]) == 1.0)


def load_text(row: pd.Series) -> str:
    """A pooled load's name: "2 req/s", "concurrency 4", or the one-at-a-time baseline."""
    v = float(row["load_value"])
    text = f"{v:g} req/s" if row["load_kind"] == "rate" else f"concurrency {int(v)}"
    return "one request at a time (baseline)" if bool(row.get("_base", False)) else text


def float_or_nan(v: Any) -> float:
    """``float(v)``, NaN for what is no number (None, text)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return f

