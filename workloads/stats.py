"""Summary statistics of a planned workload (what ``bench workload show`` prints).

Definitions follow the traces study (STATS.md): percentiles by linear interpolation,
CV = std / mean of inter-arrival gaps, prefix reuse = the longest leading run of
``hash_ids`` blocks seen in earlier requests (infinite cache), in tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bench_llm.workloads.builder import Plan

PCTS = (5, 25, 50, 75, 95, 99)


def length_summary(x: np.ndarray) -> dict[str, float]:
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return {"count": 0}
    out: dict[str, float] = {"count": int(x.size), "mean": float(x.mean()), "min": float(x.min()), "max": float(x.max())}
    for p in PCTS:
        out[f"p{p}"] = float(np.percentile(x, p))
    return out


def arrival_summary(offsets_s: np.ndarray | None) -> dict[str, float] | None:
    if offsets_s is None:
        return None
    t = np.sort(offsets_s[~np.isnan(offsets_s)])
    if t.size < 2:
        return {"count": int(t.size)}
    gaps = np.diff(t)
    span = float(t[-1] - t[0])
    return {
        "count": int(t.size),
        "span_s": span,
        "mean_rate": float((t.size - 1) / span) if span > 0 else float("inf"),
        "gap_cv": float(gaps.std() / gaps.mean()) if gaps.mean() > 0 else 0.0,
        "max_gap_s": float(gaps.max()),
    }


def prefix_reuse(
    hash_ids: Sequence[Sequence[int]],
    input_tokens: Sequence[int],
    block_tokens: int,
    lru_blocks: int | None = None,
) -> float:
    """Fraction of input tokens that are a prefix already sent.

    ``lru_blocks`` None: an infinite prefix cache; else an LRU cache of that many blocks
    (every block of a request is touched when the request is sent).
    """
    from collections import OrderedDict

    seen: OrderedDict[int, None] = OrderedDict()
    reused = total = 0
    for ids, n in zip(hash_ids, input_tokens):
        run = 0
        for h in ids:
            if h in seen:
                run += 1
            else:
                break
        reused += min(run * block_tokens, int(n))
        total += int(n)
        for h in ids:
            seen[h] = None
            seen.move_to_end(h)
        if lru_blocks is not None:
            while len(seen) > lru_blocks:
                seen.popitem(last=False)
    return reused / total if total else 0.0


def plan_summary(plan: Plan) -> dict[str, object]:
    out: dict[str, object] = {
        "name": plan.name,
        "seed": plan.seed,
        "mode": plan.mode,
        "arrival": plan.arrival.text if plan.arrival is not None else "closed",
        "rate": plan.rate,
        "concurrency": plan.concurrency,
        "requests": len(plan),
        "warmup": int(len(plan.warmup_input)),
        "input_tokens": length_summary(plan.input_tokens),
        "output_tokens": length_summary(plan.output_tokens),
        "arrivals": arrival_summary(plan.offsets_s),
    }
    if plan.prefix_tokens:
        groups = plan.prefix_group
        out["prefix_groups"] = {
            "tokens": plan.prefix_tokens,
            "shares": {f"p{g}": float(np.mean(groups == g)) for g in sorted(set(groups.tolist()) - {-1})},
            "none": float(np.mean(groups < 0)),
        }
    if plan.session.max(initial=-1) >= 0:
        sessions = plan.session[plan.session >= 0]
        turns = np.bincount(sessions)
        later = plan.turn > 0
        out["sessions"] = {
            "count": int(len(turns)),
            "turns_mean": float(turns[turns > 0].mean()),
            "think_s_mean": float(plan.think_s[later].mean()) if later.any() else 0.0,
        }
    if plan.graph is not None:
        from bench_llm.workloads.graph_plan import graph_summary

        out["graph"] = graph_summary(plan.graph, plan.input_tokens)
    table = plan.trace
    if table is not None:
        trace: dict[str, object] = {"path": table.path, "format": table.format, "rows": len(table), "dropped": table.dropped}
        if table.hash_ids is not None and plan.trace_rows is not None:
            rows = plan.trace_rows
            trace["prefix_reuse_tokens"] = prefix_reuse(
                [table.hash_ids[r] for r in rows], plan.input_tokens.tolist(), table.block_tokens
            )
        out["trace"] = trace
    return out
