"""A capacity search that stops below loads bench's client could not offer records a typed client
limit (results.sweep_rows.ClientLimit) in cells.parquet: found from the cell's typed points, the
host's load average kept with it. In virtual time, the client limit forced on rates above 6 req/s."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench_llm.bench.sweep.store import read_cells
from bench_llm.results.sweep_rows import CellRow, ClientLimit

WHY = "client-limited: bench's client was saturated in 9 of 10 windows"


def test_a_client_limited_search_records_a_typed_lower_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench_llm.bench.sweep import cell_loads
    from bench_llm.bench.sweep.orchestrate import run_sweep
    from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec, WorkloadSpec

    real = cell_loads.run_load

    def limited_above_6(**kw: Any) -> Any:
        measured = real(**kw)
        if kw["load"].kind == "rate" and kw["load"].value > 6.0:
            figures = replace(measured.figures, untrustworthy=WHY, client_limited=WHY, client_saturated=True)
            measured = replace(measured, figures=figures)
        return measured

    monkeypatch.setattr(cell_loads, "run_load", limited_above_6)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.234, 0.0, 0.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    spec = SweepSpec(
        engine="sim", model="llama-3.1-8b", gpu="h100", gpus=1, matrix=MatrixSpec(tp=(1,)),
        loads=LoadSpec(capacity=True, capacity_start=4.0, requests=50, max_requests=400, capacity_repeats=0),
        workloads=(WorkloadSpec(input_tokens=128, output_tokens=16),), slo={"ttft_ms": 500.0, "tpot_ms": 50.0},
    )  # fmt: skip
    lines: list[str] = []
    run_sweep(spec, tmp_path / "s", echo=lines.append, progress=False)
    (rec,) = CellRow.from_row(read_cells(tmp_path / "s")[0]).capacity.values()
    assert rec.capacity_rps == 6.0
    # the lowest limited load above the capacity, measured again with twice the client processes
    assert rec.client_limit == ClientLimit(6.5, 2, WHY, 1.23)
    said = [ln for ln in lines if "client-limited: bench's client could not offer" in ln]
    assert len(said) == 1 and said[0].endswith("(host load average 1.2 on 8 CPUs)")
    assert "capacity ≥ 6 req/s" in said[0] and "--workers 4" in said[0]
