"""Rendering a summary as a plain-text table."""

from __future__ import annotations

import math
from typing import Any

_LABELS = {
    "ttft_ms": "TTFT (ms)",
    "ttfo_ms": "TTFO, first answer token (ms)",
    "tpot_ms": "TPOT (ms)",
    "itl_ms": "ITL, per token (ms)",
    "chunk_gap_ms": "Chunk gap (ms)",
    "e2e_ms": "E2E (ms)",
    "schedule_lag_ms": "Send lag vs schedule (ms)",
}


def _f(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.2f}" if abs(v) < 1000 else f"{v:,.0f}"


def format_summary(s: dict[str, Any], title: str = "") -> str:
    lines: list[str] = []
    if title:
        lines.append(title)
    r = s["requests"]
    errs = ", ".join(f"{k} {v}" for k, v in sorted(r["errors"].items())) or "none"
    lines.append(
        f"requests: {r['measured']} measured, {r['ok']} ok, {r['failed']} failed ({errs}); "
        f"{r['warmup_excluded']} warm-up excluded; {r['cancelled_at_end']} cancelled at end"
    )
    if r.get("non_streaming"):
        lines.append(f"non-streaming: {r['non_streaming']} requests answered in one response: E2E only "
                     "(no TTFT, TPOT or ITL for them)")
    t = s["throughput"]
    lines.append(
        f"window {s['window_s']:.2f} s: {t['requests_per_s']:.2f} req/s, "
        f"{t['output_tokens_per_s']:,.0f} output tok/s, {t['total_tokens_per_s']:,.0f} total tok/s"
    )
    ps = s["percentiles"]
    pcols = [f"p{p:g}".replace(".", "_") for p in ps]
    header = f"{'metric':<32}{'n':>8}{'mean':>11}" + "".join(f"{c:>11}" for c in pcols)
    lines.append(header)
    lines.append("-" * len(header))
    for key, label in _LABELS.items():
        m = s["latency"].get(key)
        if not m or not m["n"]:
            continue
        lines.append(f"{label:<32}{m['n']:>8}{_f(m['mean']):>11}" + "".join(f"{_f(m[c]):>11}" for c in pcols))
    if "slo" in s:
        slo = s["slo"]
        objs = ", ".join(f"{k}<={v:g}" for k, v in slo["objectives"].items())
        lines.append(
            f"SLO ({objs}): attainment {100 * slo['attainment']:.1f}% ({slo['met']}/{r['measured']}), "
            f"goodput {slo['goodput_rps']:.2f} req/s"
        )
    tok = s["tokens"]
    src = ", ".join(f"{k} {v}" for k, v in tok["sources"].items()) or "-"
    lines.append(
        f"token counts from: {src}; chunk-vs-server mismatches {tok['chunk_vs_server_mismatches']}; "
        f"shorter than requested {tok['shorter_than_requested']}"
    )
    if "reasoning" in tok:
        rz = tok["reasoning"]
        lines.append(
            f"reasoning: {rz['requests']} requests reasoned; per request {rz['reasoning_tokens_mean']:.1f} reasoning + "
            f"{rz['answer_tokens_mean']:.1f} answer tokens (total {rz['reasoning_tokens']:,} + {rz['answer_tokens']:,}); "
            "TTFT counts the first token of either kind, TTFO the first answer token"
        )
    reasons = tok.get("finish_reasons") or {}
    if set(reasons) - {"length", "none"}:  # shown only where some request did not run to its length
        lines.append(
            "finish reasons: " + ", ".join(f"{k} {v}" for k, v in reasons.items())
            + f"; natural stops {tok['natural_stops']}/{r['ok']}"
        )
    for w in s["client"].get("warnings", []):
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)
