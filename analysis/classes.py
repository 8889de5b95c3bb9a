"""Per-class breakdown of a mixed workload (the ``length_class`` of each request: the mix
component it was drawn from, 'short', 'long' …). A mix's aggregate percentiles hide the
minority class: 10 % long prompts barely move the overall TTFT p50 while missing every SLO."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bench_llm.analysis.summary import SummaryOptions, summarize


def classes_of(table: pa.Table) -> list[str]:
    """The classes present among measured requests (none for an unmixed workload)."""
    if "length_class" not in table.column_names:
        return []
    measured = table.filter(pc.equal(table["phase"], "measure"))
    return sorted(v for v in pc.unique(measured["length_class"]).to_pylist() if v is not None)


def class_breakdown(table: pa.Table, options: SummaryOptions = SummaryOptions()) -> list[dict[str, Any]]:
    """One summary row per class: share of requests, TTFT/TPOT/E2E percentiles, attainment.

    The rows are a JSON payload (``bench summary --json``'s ``classes``), kept as dicts."""
    names = classes_of(table)
    if len(names) < 2:
        return []
    total = sum(1 for p in table["phase"].to_pylist() if p == "measure")
    rows = []
    for name in names:
        part = table.filter(pc.fill_null(pc.equal(table["length_class"], name), False))
        s = summarize(part, options)
        lat = s.latency
        row: dict[str, Any] = {
            "class": name,
            "requests": s.requests.measured,
            "share": s.requests.measured / total if total else float("nan"),
            "failed": s.requests.failed,
            "input_tokens_mean": float(pc.mean(part.filter(pc.equal(part["phase"], "measure"))["input_tokens_target"]).as_py() or 0),
        }
        for metric in ("ttft_ms", "tpot_ms", "e2e_ms"):
            for stat in ("p50", "p95"):
                row[f"{metric[:-3]}_{stat}_ms"] = lat[metric][stat]
        if s.slo is not None:
            row["attainment"] = s.slo.attainment
        rows.append(row)
    return rows


def format_breakdown(rows: list[dict[str, Any]]) -> list[str]:
    head = f"{'class':<12}{'requests':>9}{'share':>7}{'in tok':>8}{'TTFT p50':>10}{'TTFT p95':>10}{'TPOT p50':>10}{'TPOT p95':>10}{'E2E p50':>10}{'SLO met':>9}"
    lines = ["per class (the mix component of each request):", head]
    for r in rows:
        att = f"{100 * r['attainment']:.1f}%" if "attainment" in r else "-"
        lines.append(
            f"{r['class']:<12}{r['requests']:>9}{100 * r['share']:>6.1f}%{r['input_tokens_mean']:>8,.0f}{r['ttft_p50_ms']:>10,.1f}"
            f"{r['ttft_p95_ms']:>10,.1f}{r['tpot_p50_ms']:>10,.2f}{r['tpot_p95_ms']:>10,.2f}{r['e2e_p50_ms']:>10,.1f}{att:>9}"
        )
    return lines
