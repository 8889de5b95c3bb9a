"""Rendering a summary as a plain-text table."""

from __future__ import annotations

import math

from bench_llm.analysis.failures import error_line
from bench_llm.analysis.kinds import kinds_lines
from bench_llm.analysis.summary_types import (
    PromptLengths,
    RequestCounts,
    RunSummary,
    SloAttainment,
    TimingCheck,
    TokenAccounting,
)

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
#: Gaps between a request's chunks: no sequence's with n > 1 (docs/metrics.md)
_GAPS = ("itl_ms", "chunk_gap_ms")


def anomaly_text(requests: RequestCounts) -> str:
    """'3 anomalous records (token_before_first_byte 2, negative_gap 1)'."""
    kinds = ", ".join(f"{k} {v}" for k, v in requests.anomaly_kinds.items())
    n = requests.anomalies
    return f"{n} anomalous record{'s' if n != 1 else ''}" + (f" ({kinds})" if kinds else "")


def one_read_text(timing: TimingCheck) -> str:
    return (
        f"{timing.one_read_responses} of {timing.multi_token_responses} responses arrived in one read "
        "(their token gaps are the client's, not the engine's)"
    )


def _f(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.2f}" if abs(v) < 1000 else f"{v:,.0f}"


def format_summary(s: RunSummary, title: str = "") -> str:
    lines: list[str] = []
    if title:
        lines.append(title)
    r = s.requests
    errs = ", ".join(f"{k} {v}" for k, v in sorted(r.errors.items())) or "none"
    lines.append(
        f"requests: {r.measured} measured, {r.ok} ok, {r.failed} failed ({errs}); "
        f"{r.warmup_excluded} warm-up excluded; "
        + (f"{r.cooldown_excluded} cool-down excluded; " if r.cooldown_excluded else "")
        + f"{r.cancelled_at_end} cancelled at end"
    )
    if r.anomalies:
        lines.append(f"ANOMALIES: {anomaly_text(r)}: excluded from every figure below (docs/metrics.md, Record invariants)")
    if r.top_errors:
        lines.append("most frequent errors: " + error_line(r.top_errors))
    if r.non_streaming:
        lines.append(f"non-streaming: {r.non_streaming} requests answered in one response: E2E only "
                     "(no TTFT, TPOT or ITL for them)")
    t = s.throughput
    lines.append(
        f"window {s.window_s:.2f} s: {t.requests_per_s:.2f} req/s, "
        f"{t.output_tokens_per_s:,.0f} output tok/s, {t.total_tokens_per_s:,.0f} total tok/s"
    )
    lines += _latency_table(s)
    if s.slo is not None:
        lines.append(_slo_line(s.slo))
    lines += _token_lines(s.tokens, r.ok)
    lines.extend(kinds_lines(s.kinds or {}))
    for w in s.client.warnings:
        lines.append(f"WARNING: {w}")
    return "\n".join(lines)


def _latency_table(s: RunSummary) -> list[str]:
    pcols = [f"p{p:g}".replace(".", "_") for p in s.percentiles]
    header = f"{'metric':<32}{'n':>8}{'mean':>11}" + "".join(f"{c:>11}" for c in pcols)
    rows: list[str] = []
    for key, label in _LABELS.items():
        m = s.latency.get(key)
        if key in _GAPS and s.timing.several_sequences and (not m or not m["n"]):
            rows.append(f"{label:<32}not measured: {s.timing.several_sequences} responses of n > 1 sequences "
                        "(their chunks interleave)")
            continue
        if not m or not m["n"]:
            continue
        if key in _PER_TOKEN and not s.timing.itl_measurable:
            rows.append(f"{label:<32}not measurable: {one_read_text(s.timing)}")
            continue
        rows.append(f"{label:<32}{m['n']:>8}{_f(m['mean']):>11}" + "".join(f"{_f(m[c]):>11}" for c in pcols))
    if rows:
        return [header, "-" * len(header), *rows]
    return ["latency: no request succeeded, nothing to measure"]


def _slo_line(slo: SloAttainment) -> str:
    objs = ", ".join(f"{k}<={v:g}" for k, v in slo.objectives.items())
    lo, hi = slo.attainment_interval
    ci = f", 95% CI {100 * lo:.1f}-{100 * hi:.1f}%" if lo == lo and hi == hi else ""
    return (
        f"SLO ({objs}): attainment {100 * slo.attainment:.1f}% ({slo.met}/{slo.judged}{ci}), "
        f"goodput {slo.goodput_rps:.2f} req/s"
    )


def _token_lines(tok: TokenAccounting, ok: int) -> list[str]:
    src = ", ".join(f"{k} {v}" for k, v in tok.sources.items()) or "-"
    lines = [
        f"token counts from: {src}; chunk-vs-server mismatches {tok.chunk_vs_server_mismatches}; "
        f"shorter than requested {tok.shorter_than_requested}"
        + (f"; LONGER than requested {tok.longer_than_requested}" if tok.longer_than_requested else ""),
        _prompt_line(tok.prompt),
    ]
    if tok.prompt.warning:
        lines.append(f"WARNING: {tok.prompt.warning}")
    if tok.reasoning is not None:
        rz = tok.reasoning
        lines.append(
            f"reasoning: {rz.requests} requests reasoned; per request {rz.reasoning_tokens_mean:.1f} reasoning + "
            f"{rz.answer_tokens_mean:.1f} answer tokens (total {rz.reasoning_tokens:,} + {rz.answer_tokens:,}); "
            "TTFT counts the first token of either kind, TTFO the first answer token"
        )
    if set(tok.finish_reasons) - {"length", "none"}:  # shown only where some request did not run to its length
        lines.append(
            "finish reasons: " + ", ".join(f"{k} {v}" for k, v in tok.finish_reasons.items())
            + f"; natural stops {tok.natural_stops}/{ok}"
        )
    return lines


def _prompt_line(p: PromptLengths) -> str:
    if not p.compared:
        return "prompt tokens: the server reported none (requested lengths unchecked)"
    return (
        f"prompt tokens, server vs requested (n={p.compared}): {100 * p.exact_share:.0f}% exact"
        + (f" (counting the {p.engine_added} start token{'s' if p.engine_added > 1 else ''} the engine adds)"
           if p.engine_added else "")
        + ", "
        f"p50 ratio {p.ratio_p50:.2f}, {100 * p.off_share:.0f}% off by more than 5%"
    )
