"""The report's "Model error" section: on a sweep run on the simulated engine, each cell's
capacity and each load's TTFT, TPOT and throughput with the model's error as an interval, and
where that error comes from, read from the sweep's Parquet only (the ``model_error_*`` columns
of ``points.parquet`` and ``cells.parquet``, results/schema.py). None on a measured sweep."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from bench_llm.analysis.recommend_io import load_points
from bench_llm.analysis.report.figures import esc
from bench_llm.results.schema import MODEL_ERROR_SOURCE, model_error_column

#: (figure column, the metric whose error it carries, header)
_LOAD_FIGURES = (
    ("ttft_p50_ms", "ttft_ms", "TTFT p50 ms"),
    ("ttft_p90_ms", "ttft_ms", "TTFT p90 ms"),
    ("tpot_p50_ms", "tpot_ms", "TPOT p50 ms"),
    ("tpot_p90_ms", "tpot_ms", "TPOT p90 ms"),
    ("throughput_rps", "throughput", "served req/s"),
)


def interval_text(value: Any, error: Any) -> str:
    """``x [x(1-e), x(1+e)]`` (``–`` where either is missing)."""
    try:
        v, e = float(value), float(error)
    except (TypeError, ValueError):
        return "–"
    if not (math.isfinite(v) and math.isfinite(e)):
        return "–"
    return f"{v:.4g} [{v * (1 - e):.4g}, {v * (1 + e):.4g}]"


def model_error_html(sweep: Path, cells: pd.DataFrame | None) -> tuple[str, str] | None:
    """(the section's HTML, its source sentence), or None when no figure of the sweep is simulated."""
    points = load_points(sweep)
    column = model_error_column("capacity")
    if points.empty or column not in points or points[column].dropna().empty:
        return None
    source = str(points[MODEL_ERROR_SOURCE].dropna().iloc[0])
    parts = [f"<p>These figures are the simulated engine's: a measured engine may differ by the model's "
             f"error, shown as an interval (a median |error|, not a bound). Source: {esc(source)}.</p>"]  # fmt: skip
    if cells is not None and column in cells and "capacity_rps" in cells:
        rows = [[esc(str(r["cell_id"])), esc(interval_text(r["capacity_rps"], r[column])),
                 esc(_pct(r[column]))] for _, r in cells.iterrows() if r.get("status") == "complete"]  # fmt: skip
        parts.append("<h3>Capacity</h3>" + _table(["cell", "capacity req/s [model interval]", "model error"], rows,
                                                 "model-error-cells"))  # fmt: skip
    body = []
    for _, r in points.iterrows():
        body.append([esc(str(r.get("cell_id"))), esc(str(r.get("load_label")))]
                    + [esc(interval_text(r.get(fig), r.get(model_error_column(m)))) for fig, m, _ in _LOAD_FIGURES])
    headers = ["cell", "load", *(f"{h} [model interval]" for _, _, h in _LOAD_FIGURES)]
    parts.append("<h3>Per load</h3>" + _table(headers, body, "model-error-loads"))
    return "".join(parts), source


def _pct(v: Any) -> str:
    try:
        return f"±{100 * float(v):.1f}%"
    except (TypeError, ValueError):
        return "–"


def _table(headers: list[str], rows: list[list[str]], cls: str) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class='{cls}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
