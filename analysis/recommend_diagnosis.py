"""What limits a configuration, and the advice that names its lever.

The limiting resource is read at the cell's *knee*, the lowest load that failed, against its
lightest load: which SLO the misses are on, how much of TTFT is queue time (server histogram
when scraped, otherwise TTFT growth over the lightest load), and KV-cache usage / preemptions
when the server reported them (``diagnose_cell``). Across the configurations of a sweep, a
swept flag that limits a layout (``swept_causes``) and a lever the matrix already tried on the
same GPUs (``tried_levers``) are named instead of advice the table contradicts.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from bench_llm.analysis.confidence import CONFIDENCE
from bench_llm.analysis.recommend_pooling import float_or_nan, load_text, pooled_loads
from bench_llm.analysis.recommend_types import Configuration

#: Capacities per GPU within this fraction of the best count as tied (no target rate; the choice,
#: analysis/recommend_choice.py); a configuration below ``1 - TIE_FRACTION`` of another serves clearly less.
TIE_FRACTION = 0.05
#: TTFT counts as queue-dominated when queue time is at least this share of it.
QUEUE_SHARE = 0.5
KV_FULL = 0.95

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
        return Diagnosis("none", ADVICE["none"] + f" ({load_text(top)})", _evidence(base, top, None))
    queue_ms, queue_src = _queue_estimate(base, knee)
    ev = _evidence(base, knee, (queue_ms, queue_src))
    code = _limiting_code(base, knee, slo, queue_ms)
    layout, tuning = _cell_layout(points)
    return Diagnosis(code, advice(code, layout, tuning) + f" (at {load_text(knee)})", ev)


def _limiting_code(base: pd.Series, knee: pd.Series, slo: dict[str, float], queue_ms: float) -> str:
    """The ``ADVICE`` code of the knee (the lowest failing load) against the lightest load."""
    kv = float_or_nan(knee.get("server_kv_cache_usage_max"))
    pre = float_or_nan(knee.get("server_preemptions"))
    miss = {k[len("miss_share_") :]: float_or_nan(knee[k]) for k in knee.index if str(k).startswith("miss_share_")}
    failed_share = float_or_nan(knee.get("failed")) / max(1.0, float_or_nan(knee.get("requests"))) if "failed" in knee else float("nan")
    if (math.isfinite(kv) and kv >= KV_FULL) or (math.isfinite(pre) and pre > 0):
        return "kv_cache"
    if math.isfinite(failed_share) and failed_share > 0.5:
        return "errors"
    ttft_miss = miss.get("ttft_ms", 0.0) + miss.get("ttfo_ms", 0.0)
    tpot_miss = miss.get("tpot_ms", 0.0) + miss.get("itl_max_ms", 0.0)
    ttft_slo = slo.get("ttft_ms") or slo.get("ttfo_ms")
    tpot_slo = slo.get("tpot_ms")
    if tpot_miss > ttft_miss and tpot_miss > 0:
        base_tpot = float_or_nan(base.get("tpot_p90_ms"))
        return "decode_unloaded" if tpot_slo and base_tpot > tpot_slo else "decode"
    if not (ttft_miss > 0 or knee["saturated"]):
        return "errors" if failed_share > 0 else "queueing"
    base_ttft = float_or_nan(base.get("ttft_p90_ms"))
    if ttft_slo and base_ttft > ttft_slo and knee.name == base.name:
        return "prefill_unloaded"
    if ttft_slo and float_or_nan(base.get("ttft_p50_ms")) > ttft_slo:
        return "prefill_unloaded"
    ttft = float_or_nan(knee.get("ttft_p50_ms"))
    queued = math.isfinite(queue_ms) and ttft > 0 and queue_ms >= QUEUE_SHARE * ttft
    return "queueing" if queued or (knee["saturated"] and not (ttft_miss > 0)) else "prefill"


def _queue_estimate(base: pd.Series, knee: pd.Series) -> tuple[float, str]:
    server = float_or_nan(knee.get("server_queue_time_mean_ms"))
    if math.isfinite(server):
        return server, "server queue-time histogram (mean)"
    a, b = float_or_nan(knee.get("ttft_p50_ms")), float_or_nan(base.get("ttft_p50_ms"))
    if math.isfinite(a) and math.isfinite(b):
        return max(0.0, a - b), "client: median TTFT above the lightest load's"
    return float("nan"), "unavailable"


def _evidence(base: pd.Series, point: pd.Series, queue: tuple[float, str] | None) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "lightest_load": load_text(base),
        "point": load_text(point),
        "runs": point.get("runs"),
        "attainment": float_or_nan(point.get("attainment")),
        "requests": int(point.get("requests", 0)),
        "saturated": bool(point.get("saturated")),
        "saturation_reason": point.get("saturation_reason"),
    }
    for k in ("ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms", "throughput_rps"):
        ev[k] = float_or_nan(point.get(k))
        ev[f"lightest_{k}"] = float_or_nan(base.get(k))
    for k in point.index:
        if str(k).startswith("miss_share_") or str(k).startswith("server_"):
            v = float_or_nan(point[k])
            if math.isfinite(v):
                ev[str(k)] = v
    if queue is not None:
        ev["queue_ms"], ev["queue_source"] = queue
    return ev


def _tuning_part(name: str, value: str) -> str:
    """A tuning value's part of a cell id (as bench/sweep/matrix.py ``tuned_cell_id`` writes it)."""
    return f"{name}_{re.sub(r'[^A-Za-z0-9.]', '_', value)}"


def layout_id(c: Configuration) -> str:
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


def tried_levers(configs: list[Configuration]) -> list[Configuration]:
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


def swept_causes(configs: list[Configuration]) -> list[Configuration]:
    """A configuration that differs from another only in swept flags and serves clearly less
    (below ``1 - TIE_FRACTION`` of it) is limited by those flags: its diagnosis names the
    axis and what the other value serves, not a lever (replicas, TP) it was never given."""
    out = []
    for c in configs:
        mine = _tuning(c.tuning)
        siblings = [o for o in configs if o is not c and layout_id(o) == layout_id(c)
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

