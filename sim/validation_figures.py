"""The shipped validation rows as data, and the model's median error computed from them.

``sim.validation.rows()`` needs 70-90 s of CPU, too much for a sweep to recompute each time it
states the model's error; ``python -m sim.validation --update-docs`` writes the rows it computed
into ``validation_rows.json`` beside this module (the same rows as docs/simulator.md's table), and
``median_abs_error`` reads them. Held-out rows only (fitted rows are not evidence); rows that
compare ratios (``speed-up x``) have no metric kind and are left out.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

#: Written by ``python -m sim.validation --update-docs``; shipped with the package.
PATH = Path(__file__).with_name("validation_rows.json")

#: A row's figure -> the metric it measures (capacity rests on all four).
_KINDS = (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("itl", "tpot_ms"), ("token ms", "tpot_ms"), ("e2e", "e2e_ms"),
          ("req/s", "throughput"), ("tok/s", "throughput"))  # fmt: skip


@dataclass(frozen=True)
class Row:
    """One validation figure: the published value beside the simulated one (``sim.validation``
    computes them; ``validation_rows.json`` ships them)."""

    source: str  # key of sim.validation.SOURCES
    config: str
    figure: str
    published: float
    simulated: float
    fitted: bool = False
    #: held out, but a choice was made after its simulated figure had been seen (sim/validation.py)
    seen: bool = False

    @property
    def ratio(self) -> float:
        return self.simulated / self.published

    @property
    def error(self) -> float:
        return self.ratio - 1.0

    @property
    def abs_error(self) -> float:
        return abs(self.error)


def metric_kind(figure: str) -> str | None:
    """``ttft_ms``, ``tpot_ms`` (TPOT, ITL, per-token time), ``e2e_ms`` or ``throughput``; None: a ratio."""
    low = figure.lower()
    return next((kind for key, kind in _KINDS if key in low), None)


def write(rows: list[object], path: Path = PATH) -> None:
    """``rows``: the computed rows (``sim.validation.rows()``)."""
    data = [{f.name: getattr(r, f.name) for f in dataclasses.fields(Row)} for r in rows]
    path.write_text(json.dumps(data, indent=1) + "\n")


def load(path: Path = PATH) -> list[Row]:
    return [Row(**d) for d in json.loads(path.read_text())]


def median_abs_errors(rows: list[Row] | None = None) -> dict[str, tuple[float, int]]:
    """Per metric kind: (median |simulated / published - 1| over the held-out rows, their count)."""
    rows = load() if rows is None else rows
    by_kind: dict[str, list[float]] = {}
    for r in rows:
        kind = metric_kind(r.figure)
        if kind is not None and not r.fitted:
            by_kind.setdefault(kind, []).append(r.abs_error)
    return {k: (statistics.median(v), len(v)) for k, v in by_kind.items()}
