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
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from bench_llm.analysis.capacity import CapacityResult, Probe, capacity_from_probes, judge_load
from bench_llm.analysis.capacity_points import point_metrics
from bench_llm.analysis.confidence import CONFIDENCE, separation
from bench_llm.analysis.headline import build_headline, headline_lines
from bench_llm.analysis.load import load_run
from bench_llm.analysis.recommend_types import (
    CellCapacity,
    CellStatus,
    Configuration,
    Definitions,
    Lightest,
    LoadVerdict,
    Pick,
    Recommendation,
    Separation,
    WorkloadRecommendation,
)
from bench_llm.analysis.server_signals import server_signals
from bench_llm.analysis.slo import SLO
from bench_llm.results.reader import ResultsError, read_parquet_file, read_run_meta, read_server_metrics
from bench_llm.results.sweep_layout import CELLS_FILE, points_files, read_cells_table, read_sweep_json

#: Capacities per GPU within this fraction of the best count as tied (no target rate).
TIE_FRACTION = 0.05
#: TTFT counts as queue-dominated when queue time is at least this share of it.
QUEUE_SHARE = 0.5
KV_FULL = 0.95
#: How to measure what a re-judged sweep did not probe (the per-cell note; the message names
#: the whole command, ``resume_command``).
PROBE_HINT = "bench sweep --resume with these SLOs probes the missing loads"
#: The settings a load's verdict depends on: ``bench sweep --resume`` may change them, and
#: then re-judges the measured loads and probes what the new verdicts need.
JUDGING = ("slo", "attainment_pct", "confidence")

ADVICE = {
    "queueing": "TTFT is mostly queue time: add replicas (DP) or admission control",
    "prefill": "TTFT is mostly prefill: more TP or PCP per replica, prefix caching, or disaggregated prefill",
    "prefill_unloaded": (
        "TTFT misses the target even at the lightest load: prefill itself is too slow; "
        "more TP or PCP per replica or prefix caching (more replicas will not help)"
    ),
    "decode": (
        "TPOT rises with load (decode-bound): the step reads weights and KV and pays TP collectives; "
        "prefer fewer collectives (smaller TP, more replicas) or a smaller batch per replica"
    ),
    "decode_unloaded": (
        "TPOT misses the target even at the lightest load: one decode step is too slow; "
        "more TP per replica (memory bandwidth per request)"
    ),
    "kv_cache": "KV cache full or requests preempted: DCP, or more memory per replica (larger TP, fewer replicas)",
    "errors": "requests failed or timed out: read the engine log",
    "none": "no tested load failed: capacity is at least the highest load tried",
    "tuning": "a swept engine flag limits this configuration: the same layout with another value serves more",
}
#: ``ADVICE`` for a cell without tensor parallelism: no TP collectives to blame, no DCP to add
#: (DCP splits the TP group's KV), so the levers named are ones a TP1 cell has.
ADVICE_TP1 = {
    "decode": (
        "TPOT rises with load (decode-bound): each step reads the weights and every running request's KV; "
        "spread the batch over more replicas (DP) or cap it per replica (max running requests)"
    ),
    "kv_cache": (
        "KV cache full or requests preempted: more KV memory per replica (TP2 halves the weights per GPU) "
        "or fewer running requests per replica"
    ),
}
#: Each engine's flag capping the running batch (launch/tuning.py, "max running requests"): swept,
#: it is a cause of queueing the diagnosis names.
RUNNING_CAP_FLAGS = frozenset({"max-num-seqs", "max-running-requests", "max-batch-size"})
#: Lightest-load latencies closer than this (relative) do not name a "fastest single request".
SINGLE_REQUEST_MARGIN = 0.10


def advice(code: str, layout: dict[str, Any] | None = None, tuning: dict[str, str] | None = None) -> str:
    """``ADVICE[code]`` naming only levers the cell has: at TP1 no TP collectives and no DCP;
    with EP, that the busiest expert's GPU sets each MoE step (at the swept imbalance, if any)."""
    layout = layout or {}
    tp, ep = _int(layout.get("tp")), _int(layout.get("ep"))
    text = ADVICE_TP1.get(code, ADVICE[code]) if tp == 1 else ADVICE[code]
    cap = next(((k, v) for k, v in (tuning or {}).items() if k in RUNNING_CAP_FLAGS), None)
    if code == "queueing" and cap is not None:
        text = (f"TTFT is mostly queue time, with the running batch capped by the swept {cap[0]}={cap[1]}: "
                f"a larger {cap[0]}, more replicas (DP), or admission control")  # fmt: skip
    if ep > 1 and code not in ("errors", "none", "tuning"):
        skew = (tuning or {}).get("expert-imbalance")
        text += (f"; with EP{ep} the busiest expert's GPU sets every MoE step"
                 + (f" (expert imbalance {skew}: {skew}x the mean expert load)" if skew else
                    " (a skewed expert load slows the whole group)"))  # fmt: skip
    return text


def _int(v: Any) -> int:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return 0
    return int(f) if math.isfinite(f) else 0


def _cell_layout(points: pd.DataFrame) -> tuple[dict[str, Any], dict[str, str]]:
    """(the cell's parallel sizes, its tuning-axis values) from its points' columns."""
    first = points.iloc[0] if len(points) else pd.Series(dtype=object)
    layout = {k: first.get(k) for k in ("tp", "pp", "dp", "ep", "dcp", "pcp") if k in points}
    return layout, _tuning(first.get("tuning"))


def _tuning(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    if not isinstance(raw, str) or not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in parsed.items()} if isinstance(parsed, dict) else {}


# -- reading ---------------------------------------------------------------------------


def read_cells(sweep: Path) -> pd.DataFrame:
    table = read_cells_table(sweep)
    if table is None:
        raise ResultsError(f"{sweep}: not a sweep folder (no {CELLS_FILE})")
    return table.to_pandas()


def load_points(sweep: Path, cell_id: str | None = None, slo: dict[str, float] | None = None) -> pd.DataFrame:
    """Every load of the sweep (or of one cell), one row each; configuration as columns.

    With ``slo`` given, attainment and the miss shares are recomputed from each load's
    run folder under those bounds.
    """
    sweep = Path(sweep)
    files = points_files(sweep, cell_id)
    if not files:
        return pd.DataFrame()
    frames = [read_parquet_file(f).to_pandas() for f in files]
    df = pd.concat(frames, ignore_index=True, sort=False)
    if slo is not None:
        df = _rescore(sweep, df, SLO.from_dict(slo))
    return df


def sweep_dataset(sweep: Path) -> ds.Dataset:
    """The points as one Arrow dataset partitioned by cell (hive: ``cell=<id>``)."""
    files = points_files(sweep)
    schemas = [pq.read_schema(f) for f in files]
    schema = pa.unify_schemas(schemas, promote_options="permissive") if schemas else None
    if schema is not None:
        schema = schema.append(pa.field("cell", pa.string()))
    return ds.dataset(files, format="parquet", partitioning="hive", partition_base_dir=str(sweep), schema=schema)


def _rescore(sweep: Path, df: pd.DataFrame, slo: SLO) -> pd.DataFrame:
    return pd.DataFrame([rescore_point(sweep, rec, slo) for rec in df.to_dict("records")])


def rescore_point(sweep: Path, rec: dict[str, Any], slo: SLO) -> dict[str, Any]:
    """One point (a row of points.parquet, changed in place) with its attainment, goodput and
    miss shares recomputed under ``slo`` from its run folder's request table."""
    rd = rec.get("run_dir")
    if rec.get("status") in ("complete", "interrupted") and isinstance(rd, str) and (Path(sweep) / rd).exists():
        run = load_run(Path(sweep) / rd)
        server = read_server_metrics(Path(sweep) / rd)
        m = point_metrics(run, slo, server_signals(server), server)
        for k in list(rec):
            if k.startswith("miss_share_"):
                rec.pop(k)
        rescored = ("attainment", "attainment_low", "attainment_high", "attainment_deff", "met", "goodput_rps")
        rec.update({k: v for k, v in m.as_row().items() if k in rescored or k.startswith("miss_share_")})
    return rec


def resume_command(sweep: Path, slo: dict[str, float]) -> str:
    """The command that probes the loads a re-judged sweep lacks (bench/sweep/cell.py)."""
    return f"bench sweep --resume --out {sweep} --slo {SLO.from_dict(slo)}"


def _settings_from_definition(sweep: Path) -> dict[str, Any]:
    """Fallback when no load ran (every cell failed): the definition in sweep.json."""
    try:
        data = read_sweep_json(sweep)
    except (OSError, ValueError):
        return {}
    if data is None:
        return {}
    spec = data.get("spec") or {}
    return {
        "slo": spec.get("slo") or {},
        "attainment_pct": spec.get("attainment_pct"),
        "target_rate": spec.get("target_rate"),
        "target_concurrency": spec.get("target_concurrency"),
        "sweep": spec,
    }


def _judging(settings: dict[str, Any]) -> dict[str, Any]:
    spec = settings.get("sweep") or {}
    return {k: spec.get(k) for k in JUDGING}


def sweep_settings(sweep: Path, points: pd.DataFrame) -> dict[str, Any]:
    """SLO, attainment target and target load as the sweep ran them (from a run's metadata)."""
    for rd in points.get("run_dir", pd.Series(dtype=object)).dropna():
        try:
            meta = read_run_meta(Path(sweep) / rd)
        except (ResultsError, OSError):
            continue
        cfg: dict[str, Any] = meta.get("config") or {}
        if "slo" in cfg:
            return cfg
    return {}


# -- per-cell numbers --------------------------------------------------------------------


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
            float(r["load_value"]), bool(r["passed"]), _f(r.get("attainment")), bool(r["saturated"]),
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


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What limits a configuration (``diagnose_cell``): an ``ADVICE`` code, its explanation,
    and the evidence (a JSON payload: the knee's figures beside the lightest load's, and
    the ``miss_share_*``/``server_*`` columns it has)."""

    limiting_factor: str
    explanation: str
    evidence: dict[str, Any]


def diagnose_cell(
    points: pd.DataFrame,
    slo: dict[str, float],
    attainment_pct: float,
    level: float = CONFIDENCE,
    pooled: pd.DataFrame | None = None,
) -> Diagnosis:
    """Which resource limits this configuration, read from its loads (one cell, one workload).
    ``pooled``: ``pooled_loads(points, attainment_pct, level)`` when the caller has it already."""
    if pooled is None:
        pooled = pooled_loads(points, attainment_pct, level)
    if pooled.empty:
        return Diagnosis("unknown", "no measured loads", {})
    base = pooled.iloc[0]
    failing = pooled[pooled["verdict"] == "fail"]  # the knee is a decided failure, not an undecided load
    knee = failing.iloc[0] if len(failing) else None
    if knee is None:
        top = pooled.iloc[-1]
        return Diagnosis("none", ADVICE["none"] + f" ({_load_text(top)})", _evidence(base, top, None))
    queue_ms, queue_src = _queue_estimate(base, knee)
    ev = _evidence(base, knee, (queue_ms, queue_src))
    code = _limiting_code(base, knee, slo, queue_ms)
    layout, tuning = _cell_layout(points)
    return Diagnosis(code, advice(code, layout, tuning) + f" (at {_load_text(knee)})", ev)


def _limiting_code(base: pd.Series, knee: pd.Series, slo: dict[str, float], queue_ms: float) -> str:
    """The ``ADVICE`` code of the knee (the lowest failing load) against the lightest load."""
    kv = _f(knee.get("server_kv_cache_usage_max"))
    pre = _f(knee.get("server_preemptions"))
    miss = {k[len("miss_share_") :]: _f(knee[k]) for k in knee.index if str(k).startswith("miss_share_")}
    failed_share = _f(knee.get("failed")) / max(1.0, _f(knee.get("requests"))) if "failed" in knee else float("nan")
    if (math.isfinite(kv) and kv >= KV_FULL) or (math.isfinite(pre) and pre > 0):
        return "kv_cache"
    if math.isfinite(failed_share) and failed_share > 0.5:
        return "errors"
    ttft_miss = miss.get("ttft_ms", 0.0) + miss.get("ttfo_ms", 0.0)
    tpot_miss = miss.get("tpot_ms", 0.0) + miss.get("itl_max_ms", 0.0)
    ttft_slo = slo.get("ttft_ms") or slo.get("ttfo_ms")
    tpot_slo = slo.get("tpot_ms")
    if tpot_miss > ttft_miss and tpot_miss > 0:
        base_tpot = _f(base.get("tpot_p90_ms"))
        return "decode_unloaded" if tpot_slo and base_tpot > tpot_slo else "decode"
    if not (ttft_miss > 0 or knee["saturated"]):
        return "errors" if failed_share > 0 else "queueing"
    base_ttft = _f(base.get("ttft_p90_ms"))
    if ttft_slo and base_ttft > ttft_slo and knee.name == base.name:
        return "prefill_unloaded"
    if ttft_slo and _f(base.get("ttft_p50_ms")) > ttft_slo:
        return "prefill_unloaded"
    ttft = _f(knee.get("ttft_p50_ms"))
    queued = math.isfinite(queue_ms) and ttft > 0 and queue_ms >= QUEUE_SHARE * ttft
    return "queueing" if queued or (knee["saturated"] and not (ttft_miss > 0)) else "prefill"


def _queue_estimate(base: pd.Series, knee: pd.Series) -> tuple[float, str]:
    server = _f(knee.get("server_queue_time_mean_ms"))
    if math.isfinite(server):
        return server, "server queue-time histogram (mean)"
    a, b = _f(knee.get("ttft_p50_ms")), _f(base.get("ttft_p50_ms"))
    if math.isfinite(a) and math.isfinite(b):
        return max(0.0, a - b), "client: median TTFT above the lightest load's"
    return float("nan"), "unavailable"


def _evidence(base: pd.Series, point: pd.Series, queue: tuple[float, str] | None) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "lightest_load": _load_text(base),
        "point": _load_text(point),
        "runs": point.get("runs"),
        "attainment": _f(point.get("attainment")),
        "requests": int(point.get("requests", 0)),
        "saturated": bool(point.get("saturated")),
        "saturation_reason": point.get("saturation_reason"),
    }
    for k in ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms", "throughput_rps"):
        ev[k] = _f(point.get(k))
        ev[f"lightest_{k}"] = _f(base.get(k))
    for k in point.index:
        if str(k).startswith("miss_share_") or str(k).startswith("server_"):
            v = _f(point[k])
            if math.isfinite(v):
                ev[str(k)] = v
    if queue is not None:
        ev["queue_ms"], ev["queue_source"] = queue
    return ev


def _load_text(row: pd.Series) -> str:
    v = float(row["load_value"])
    text = f"{v:g} req/s" if row["load_kind"] == "rate" else f"concurrency {int(v)}"
    return "one request at a time (baseline)" if bool(row.get("_base", False)) else text


def _f(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return f


# -- the recommendation -----------------------------------------------------------------


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
    definition = _settings_from_definition(sweep)
    # a sweep resumed with other SLOs (bench sweep --resume --slo) is judged by its definition
    rejudged = bool(settings and definition) and _judging(definition) != _judging(settings)
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
    definitions = Definitions(
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
    cell_rows = cells.to_dict("records")
    cell_list = [CellStatus(**{f: _clean(c.get(f)) for f in _CELL_FIELDS}) for c in cell_rows]

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
    workloads = {
        w: _recommend_workload(
            points[points["workload"] == w], cell_rows, slo_used, att, target, target_c, precision, level,
            resume_command(sweep, slo_used) if slo_used else "",
        )
        for w in dict.fromkeys(points["workload"].dropna())
    }  # fmt: skip
    return result(workloads, [u for wr in workloads.values() for u in wr.untrustworthy])


#: The columns of cells.parquet a recommendation carries (``CellStatus``).
_CELL_FIELDS = tuple(f.name for f in fields(CellStatus))


def _recommend_workload(
    points: pd.DataFrame,
    cells: list[dict[str, Any]],
    slo: dict[str, float],
    att: float,
    target: float | None,
    target_c: int | None,
    precision: float | None,
    level: float = CONFIDENCE,
    resume: str = "",
) -> WorkloadRecommendation:
    status = {c["cell_id"]: c for c in cells}
    configs = [
        _configuration(str(cell_id), g, slo, att, precision, level)
        for cell_id, g in points.groupby("cell_id", sort=False)
        if status.get(cell_id, {}).get("status") in (None, "complete")
    ]
    configs.sort(key=lambda c: (c.gpus, c.axes, c.cell_id))
    configs = _tried_levers(_swept_causes(configs))
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
    rec, message = _choose(configs, target, target_c)
    separation: Separation | None = None
    judged = False
    maybe: list[Configuration] = []
    short: list[str] | None = None
    if rec is not None and target is None and target_c is None:
        separation, judged = _separation(configs, rec), True
    if target is None and target_c is None:
        # without a target the pick is the most load per GPU: a configuration whose capacity is
        # unknown below a rate that would beat it per GPU might be the answer
        best = (rec.capacity_rps_per_gpu if rec else None) or 0.0
        maybe = [c for c in configs if c.unknown_below_rps is not None and c.unknown_below_rps / c.gpus > best]
    elif target is not None and (sep := _target_separation(configs, rec, target)) is not None:
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
        same_gpus_tradeoffs=_tradeoffs(configs), approximate_prompts=approx,
    )  # fmt: skip


def _configuration(
    cell_id: str, g: pd.DataFrame, slo: dict[str, float], att: float, precision: float | None, level: float
) -> Configuration:
    """One configuration of the recommendation: its capacity, diagnosis, lightest load and
    every load's pooled verdict."""
    gpus = int(g["gpus"].iloc[0])
    axes = int(g["axes"].iloc[0]) if "axes" in g else 0
    pooled = pooled_loads(g, att, level)  # once per cell: the capacity and the diagnosis read it too
    cap = cell_capacity(g, att, precision, level, pooled)
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
            _load_text(base) if base is not None else None,
            _clean(_f(base.get("ttft_p50_ms"))) if base is not None else None,
            _clean(_f(base.get("tpot_p50_ms"))) if base is not None else None,
        ),
        loads=[_point_summary(r) for _, r in pooled.iterrows()],
    )


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


def _separation(configs: list[Configuration], rec: Pick) -> Separation | None:
    """Is the recommended configuration's capacity per GPU separated from the runner-up's?
    (analysis.confidence.separation on the intervals: lower = passed with a margin, upper = lowest fail.)"""
    pick = next(c for c in configs if c.cell_id == rec.cell_id)
    others = [c for c in configs if c.cell_id != pick.cell_id and c.capacity_rps]
    if not others:
        return None
    runner = max(others, key=lambda c: (c.capacity_rps or 0.0) / c.gpus)  # every one has a capacity
    sep = separation(pick.cell_id, _per_gpu_bracket(pick), runner.cell_id, _per_gpu_bracket(runner))
    return Separation(runner.cell_id, sep.separated, sep.text + " (per GPU)")


def _target_separation(configs: list[Configuration], rec: Pick | None, target: float) -> Separation | None:
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
    open_ = [c for c in short if c.upper_rps is None or c.upper_rps > target + 1e-9]
    name = rec.cell_id if rec is not None else "no configuration"
    if not open_:
        return Separation(
            runner.cell_id,
            True,
            f"{name} is separated from {runner.cell_id}: {runner.cell_id} failed at "
            f"{runner.upper_rps:.4g} req/s, at or below the target {target:g}",
        )
    c = max(open_, key=lambda c: c.capacity_rps or 0.0)
    fails = f"failed only at {c.upper_rps:.4g} req/s" if c.upper_rps else "no load failed"
    return Separation(
        c.cell_id,
        False,
        f"{name} and {c.cell_id} are too close to call at {target:g} req/s ({c.cell_id} passed "
        f"{c.capacity_rps:.4g} req/s and {fails}: it may meet the target too)",
    )


def _per_gpu_bracket(c: Configuration) -> tuple[float | None, float | None]:
    """Per GPU: the capacity interval (``interval_low_rps``, ``interval_high_rps``: rates
    decided with a margin; the probe bracket's ends where there are none), so "too close to
    call" uses the intervals meant to hold another seed's answer."""
    lo, hi = c.capacity.interval_low_rps or c.capacity_rps, c.capacity.interval_high_rps or c.upper_rps
    return (lo / c.gpus if lo else None), (hi / c.gpus if hi else None)


def _choose(configs: list[Configuration], target: float | None, target_c: int | None) -> tuple[Pick | None, str]:
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


def _point_summary(r: pd.Series) -> LoadVerdict:
    return LoadVerdict(
        load=_load_text(r),
        load_kind=_clean(r["load_kind"]),
        load_value=float(r["load_value"]),
        baseline=bool(r.get("_base", False)),
        passed=bool(r["passed"]),
        attainment=_clean(_f(r.get("attainment"))),
        goodput_rps=_clean(_f(r.get("goodput_rps"))),
        throughput_rps=_clean(_f(r.get("throughput_rps"))),
        requests=int(r.get("requests", 0)),
        saturated=bool(r["saturated"]),
        saturation_reason=_clean(r.get("saturation_reason")),
        runs=_clean(r.get("runs")),
        verdict=_clean(r.get("verdict")),
        verdict_reason=_clean(r.get("verdict_reason")),
        attainment_low=_clean(_f(r.get("attainment_low"))),
        attainment_high=_clean(_f(r.get("attainment_high"))),
        untrustworthy=_clean(r.get("untrustworthy")),
        under_sampled=_clean(r.get("under_sampled")),
        ttft_p50_ms=_clean(_f(r.get("ttft_p50_ms"))),
        ttft_p90_ms=_clean(_f(r.get("ttft_p90_ms"))),
        tpot_p50_ms=_clean(_f(r.get("tpot_p50_ms"))),
        tpot_p90_ms=_clean(_f(r.get("tpot_p90_ms"))),
        e2e_p90_ms=_clean(_f(r.get("e2e_p90_ms"))),
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


def _tradeoffs(configs: list[Configuration]) -> list[str]:
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
        single = all(_one_at_a_time(c.lightest.load) for c in ranked)
        same_layout = len({_layout_id(c) for c in ranked}) == 1
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


def _one_at_a_time(load: str | None) -> bool:
    return bool(load) and ("one request at a time" in str(load) or str(load) == "concurrency 1")


def _tuning_part(name: str, value: str) -> str:
    """A tuning value's part of a cell id (as bench/sweep/matrix.py ``tuned_cell_id`` writes it)."""
    return f"{name}_{re.sub(r'[^A-Za-z0-9.]', '_', value)}"


def _layout_id(c: Configuration) -> str:
    """The configuration's id without its tuning-axis parts: cells with one layout share it."""
    cid = c.cell_id
    for name, value in _tuning(c.tuning).items():
        cid = cid.replace("-" + _tuning_part(name, value), "")
    return cid


#: The advice codes whose lever is a layout on the same GPUs, and how to recognise it:
#: (its tp compared with this cell's, its dp compared with this cell's) as -1 smaller, +1 larger.
_LAYOUT_LEVERS = {"decode": (-1, 1), "queueing": (0, 1), "prefill": (1, -1), "prefill_unloaded": (1, -1),
                  "decode_unloaded": (1, -1)}  # fmt: skip


def _sizes(cell_id: str) -> dict[str, int] | None:
    """``tp2-dp2-ep4`` -> its axis sizes (1 where absent); None for a name that is no layout."""
    if not re.match(r"^tp\d+(-|$)", cell_id):
        return None
    sizes = {k: 1 for k in ("tp", "pp", "dp", "ep", "dcp", "pcp")}
    for name, v in re.findall(r"(?:^|-)(tp|pp|dp|ep|dcp|pcp)(\d+)(?=-|$)", cell_id):
        sizes[name] = int(v)
    return sizes


def _tried_levers(configs: list[Configuration]) -> list[Configuration]:
    """Where the advice's lever is a layout the matrix measured on the same GPUs (more replicas,
    a smaller or larger TP) and it served less, the diagnosis says so instead of leaving the
    advice to contradict the table."""

    def cap(c: Configuration) -> float:
        return c.capacity_rps or 0.0

    out = []
    for c in configs:
        lever, mine = _LAYOUT_LEVERS.get(c.limiting_factor), _sizes(c.cell_id)
        if lever is None or mine is None or not cap(c):
            out.append(c)
            continue
        tried = []
        for o in configs:
            theirs = _sizes(o.cell_id)
            if o is c or theirs is None or o.gpus != c.gpus or _tuning(o.tuning) != _tuning(c.tuning):
                continue
            if (theirs["ep"] > 1) != (mine["ep"] > 1) or any(theirs[k] != mine[k] for k in ("pp", "dcp", "pcp")):
                continue  # another lever changed too: not the one the advice names
            if all(_cmp(theirs[k], mine[k]) == want for k, want in zip(("tp", "dp"), lever) if want):
                tried.append(o)
        worse = [o for o in tried if cap(o) < (1 - TIE_FRACTION) * cap(c)]
        if not worse or len(worse) != len(tried):
            out.append(c)
            continue
        note = "; the matrix tried that on the same GPUs and it served less: " + ", ".join(
            f"{o.cell_id} {cap(o):g} req/s" if cap(o) else f"{o.cell_id} none" for o in worse) + f" (this one {cap(c):g})"
        out.append(replace(c, diagnosis=c.diagnosis + note))
    return out


def _cmp(a: int, b: int) -> int:
    return (a > b) - (a < b)


def _swept_causes(configs: list[Configuration]) -> list[Configuration]:
    """A configuration that differs from another only in swept flags and serves clearly less
    (below ``1 - TIE_FRACTION`` of it) is limited by those flags: its diagnosis names the
    axis and what the other value serves, not a lever (replicas, TP) it was never given."""
    out = []
    for c in configs:
        mine = _tuning(c.tuning)
        siblings = [o for o in configs if o is not c and _layout_id(o) == _layout_id(c)
                    and set(_tuning(o.tuning)) == set(mine) and _tuning(o.tuning) != mine]  # fmt: skip
        better = max(siblings, key=lambda o: o.capacity_rps or 0.0, default=None)
        theirs, cap = (better.capacity_rps or 0.0, c.capacity_rps or 0.0) if better else (0.0, 0.0)
        if better is None or theirs <= 0 or cap >= (1 - TIE_FRACTION) * theirs:
            out.append(c)
            continue
        other = _tuning(better.tuning)
        flags = [k for k in mine if mine[k] != other[k]]
        symptom = c.diagnosis.split(":", 1)[0] + (f" ({c.diagnosis.rsplit('(at ', 1)[1]}" if "(at " in c.diagnosis else "")
        if flags == ["expert-imbalance"]:  # traffic, not a setting: the busiest expert's GPU sets the step
            k = flags[0]
            out.append(replace(c, limiting_factor="tuning", diagnosis=(
                f"expert imbalance {mine[k]} limits this layout: the busiest expert's GPU carries {mine[k]}x the mean "
                f"expert load and sets every MoE step; at {other[k]} it serves {theirs:g} req/s within the SLOs, at "
                f"{mine[k]} {f'{cap:g} req/s' if cap else 'none'}; symptom: {symptom}")))  # fmt: skip
            continue
        text = (
            f"the swept {', '.join(f'{k}={mine[k]}' for k in flags)} limits this configuration: "
            f"{', '.join(f'{k}={other[k]}' for k in flags)} on the same layout serves {theirs:g} req/s within the SLOs, "
            f"this one {f'{cap:g} req/s' if cap else 'none'}; symptom: {symptom}"
        )
        out.append(replace(c, limiting_factor="tuning", diagnosis=text))
    return out


def _clean(v: Any) -> Any:
    if isinstance(v, (np.generic,)):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _clean_dict(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _clean(v) for k, v in d.items()}


# -- text ------------------------------------------------------------------------------


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
