"""The sweep folder's layout is declared once (results/sweep_layout.py): bench writes it and
analysis reads it by the same names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench_llm.results import sweep_layout as layout

REPO = Path(__file__).resolve().parents[2]
NAMES = (layout.SWEEP_FILE, layout.CELLS_FILE, layout.POINTS_FILE, layout.RECOMMENDATION_FILE)


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    }


@pytest.mark.parametrize("package", ["analysis", "bench", "benchmarks", "results"])
def test_file_names_are_declared_once(package: str) -> None:
    offenders = [
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted((REPO / package).rglob("*.py"))
        if path != REPO / "results" / "sweep_layout.py"
        for name in sorted(_string_constants(path) & set(NAMES))
    ]
    assert not offenders, f"sweep file names re-declared outside results/sweep_layout.py: {offenders}"


def test_bench_writes_what_analysis_reads(tmp_path: Path) -> None:
    from bench_llm.analysis.recommend_io import load_points, read_cells, sweep_dataset
    from bench_llm.bench.sweep import store

    assert store.POINTS_FILE is layout.POINTS_FILE and store.CELLS_SCHEMA is layout.CELLS_SCHEMA
    store.write_cells(tmp_path, [{"cell_id": "tp1", "status": "complete", "gpus": 1}])
    from bench_llm.results.sweep_rows import PointRow

    points = [PointRow.from_row({"cell_id": "tp1", "load_value": v}) for v in (2.0, 4.0)]
    store.write_points(tmp_path, "tp1", points)
    store.write_sweep_json(tmp_path, {"spec": {"slo": {"ttft_ms": 500.0}}})
    assert (tmp_path / "cell=tp1" / "points.parquet").exists()
    assert store.load_dir(tmp_path, "tp1", "rate-2") == tmp_path / "cell=tp1" / "load=rate-2"
    assert layout.is_sweep(tmp_path) and not layout.is_sweep(tmp_path / "cell=tp1")
    assert list(read_cells(tmp_path)["cell_id"]) == ["tp1"]
    assert list(load_points(tmp_path)["load_value"]) == [2.0, 4.0]
    assert layout.points_files(tmp_path, "tp1") == layout.points_files(tmp_path) != []
    assert layout.points_files(tmp_path, "tp2") == []
    assert sweep_dataset(tmp_path).to_table().column("cell").to_pylist() == ["tp1", "tp1"]
    assert layout.read_sweep_json(tmp_path) == {"spec": {"slo": {"ttft_ms": 500.0}}}
    assert layout.read_sweep_json(tmp_path / "cell=tp1") is None and layout.read_cells_table(tmp_path / "x") is None
