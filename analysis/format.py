"""Rendering a summary as a plain-text table."""

from __future__ import annotations

import math
from typing import Any

from analysis.failures import error_line
from analysis.kinds import kinds_lines

_LABELS = {
    "ttft_ms": "TTFT (ms)",
    "ttfo_ms": "TTFO, first answer token (ms)",
    "tpot_ms": "TPOT (ms)",
    "itl_ms": "ITL, per token (ms)",
    "chunk_gap_ms": "Chunk gap (ms)",
    "e2e_ms": "E2E (ms)",
    "schedule_lag_ms": "Send lag vs schedule (ms)",
}


#: Per-token timings, not measurable when most responses arrived in one read.
_PER_TOKEN = ("tpot_ms", "itl_ms", "chunk_gap_ms")


def anomaly_text(requests: dict[str, Any]) -> str:
    """'3 anomalous records (token_before_first_byte 2, negative_gap 1)'."""
    kinds = ", ".join(f"{k} {v}" for k, v in (requests.get("anomaly_kinds") or {}).items())
    n = requests.get("anomalies", 0)
    return f"{n} anomalous record{'s' if n != 1 else ''}" + (f" ({kinds})" if kinds else "")


def one_read_text(timing: dict[str, Any]) -> str:
    return (
        f"{timing['one_read_responses']} of {timing['multi_token_responses']} responses arrived in one read "
        "(their token gaps are the client's, not the engine's)"
    )


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
    if r.get("anomalies"):
        lines.append(f"ANOMALIES: {anomaly_text(r)}: excluded from every figure below (docs/metrics.md, Record invariants)")
    top = r.get("top_errors") or []
    if top:
        lines.append("most frequent errors: " + error_line(top))
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
    rows: list[str] = []
    timing = s.get("timing") or {}
    per_token_ok = timing.get("itl_measurable", True)
    for key, label in _LABELS.items():
        m = s["latency"].get(key)
        if not m or not m["n"]:
            continue
        if key in _PER_TOKEN and not per_token_ok:
            rows.append(f"{label:<32}not measurable: {one_read_text(timing)}")
            continue
        rows.append(f"{label:<32}{m['n']:>8}{_f(m['mean']):>11}" + "".join(f"{_f(m[c]):>11}" for c in pcols))
    if rows:
        lines += [header, "-" * len(header), *rows]
    else:
        lines.append("latency: no request succeeded, nothing to measure")
    if "slo" in s:
        slo = s["slo"]
        objs = ", ".join(f"{k}<={v:g}" for k, v in slo["objectives"].items())
        judged = slo.get("judged", r["measured"])
        lo, hi = slo.get("attainment_interval") or (float("nan"), float("nan"))
        ci = f", 95% CI {100 * lo:.1f}-{100 * hi:.1f}%" if lo == lo and hi == hi else ""
        lines.append(
            f"SLO ({objs}): attainment {100 * slo['attainment']:.1f}% ({slo['met']}/{judged}{ci}), "
            f"goodput {slo['goodput_rps']:.2f} req/s"
        )
    tok = s["tokens"]
    src = ", ".join(f"{k} {v}" for k, v in tok["sources"].items()) or "-"
    lines.append(
        f"token counts from: {src}; chunk-vs-server mismatches {tok['chunk_vs_server_mismatches']}; "
        f"shorter than requested {tok['shorter_than_requested']}"
        + (f"; LONGER than requested {tok['longer_than_requested']}" if tok.get("longer_than_requested") else "")
    )
    lines.append(_prompt_line(tok.get("prompt") or {}))
    if (tok.get("prompt") or {}).get("warning"):
        lines.append(f"WARNING: {tok['prompt']['warning']}")
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
    lines.extend(kinds_lines(s.get("kinds") or {}))
    for w in s["client"].get("warnings", []):
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)


def _prompt_line(p: dict[str, Any]) -> str:
    if not p.get("compared"):
        return "prompt tokens: the server reported none (requested lengths unchecked)"
    return (
        f"prompt tokens, server vs requested (n={p['compared']}): {100 * p['exact_share']:.0f}% exact, "
        f"p50 ratio {p['ratio_p50']:.2f}, {100 * p['off_share']:.0f}% off by more than 5%"
    )
