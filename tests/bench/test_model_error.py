"""The simulated engine's error on a sweep's capacities (bench/sweep/model_error.py, issue 36):
its width and source from a calibrated profile's held-out residuals or from the shipped
validation rows, the intervals and "too close to call"; and the README's main job prints it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench_llm.analysis.recommend_choice import model_target_call
from bench_llm.bench.sweep.model_error import ModelError, model_error_lines, sim_model_error
from bench_llm.sim.validation_figures import Row, median_abs_errors, metric_kind
from tests.conftest import REPO, run_cli

PROFILE = ("# bench sim calibrate: the simulated engine's constants fitted to measured loads.\n"
           "# held out, ttft_ms: median |error| 7.5%, bias +3.0%, r 0.950 (4 loads)\n"
           "# held out, tpot_ms: median |error| 4.0%, bias -1.0%, r 0.990 (4 loads)\n"
           "# held out, throughput_rps: median |error| 2.0%, bias -1.0%, r 0.990 (4 loads)\n"
           "\n[profile]\nper_seq_us = 9  # was 8\n")  # fmt: skip


def test_a_calibrated_profile_gives_its_largest_held_out_error(tmp_path: Path) -> None:
    profile = tmp_path / "host.toml"
    profile.write_text(PROFILE)
    for args in ((f"--config={profile}",), ("--max-num-seqs=8", "--config", str(profile))):
        err = sim_model_error(args)
        assert err.fraction == pytest.approx(0.075) and err.metric == "ttft_ms"
        assert str(profile) in err.source and "held-out residuals" in err.source


def test_without_one_the_shipped_validation_rows_give_it(tmp_path: Path) -> None:
    shipped = median_abs_errors()
    assert set(shipped) == {"ttft_ms", "tpot_ms", "e2e_ms", "throughput"}
    worst = max(shipped, key=lambda k: shipped[k][0])
    err = sim_model_error(())
    assert err.fraction == shipped[worst][0] and err.metric == worst
    assert 0.02 < err.fraction < 0.5  # a median |error|, not the ±20 % bar
    assert "shipped validation rows" in err.source and f"over {shipped[worst][1]} published rows" in err.source
    # a profile that states no held-out error (hand-written) falls back, and says so
    plain = tmp_path / "plain.toml"
    plain.write_text("[profile]\nper_seq_us = 9\n")
    fallback = sim_model_error((f"--config={plain}",))
    assert fallback.fraction == err.fraction and f"{plain} states no held-out error" in fallback.source


def test_the_median_is_over_held_out_rows_of_a_metric() -> None:
    rows = [Row("s", "a", "median TTFT ms", 100, 110), Row("s", "b", "TTFT ms", 100, 70),
            Row("s", "c", "median TTFT ms", 100, 101), Row("s", "d", "TTFT ms", 100, 200, fitted=True),
            Row("s", "e", "output tok/s", 100, 95), Row("s", "f", "speed-up x", 1, 2)]  # fmt: skip
    assert median_abs_errors(rows) == {"ttft_ms": (pytest.approx(0.10), 3), "throughput": (pytest.approx(0.05), 1)}
    assert [metric_kind(f) for f in ("median ITL ms", "token ms", "e2e ms", "req/s", "speed-up x")] == [
        "tpot_ms", "tpot_ms", "e2e_ms", "throughput", None]


def _cell(cid: str, gpus: int, cap: float) -> Any:
    return SimpleNamespace(cell_id=cid, gpus=gpus, capacity=SimpleNamespace(capacity_rps=cap),
                           capacity_rps_per_gpu=cap / gpus)  # fmt: skip


def _rec(target: float | None, cells: list[Any], pick: Any) -> Any:
    wl = SimpleNamespace(configurations=cells, recommendation=SimpleNamespace(
        cell_id=pick.cell_id, gpus=pick.gpus, capacity_rps=pick.capacity.capacity_rps,
        capacity_rps_per_gpu=pick.capacity_rps_per_gpu))  # fmt: skip
    return SimpleNamespace(target_rate=target, workloads={"w": wl})


def test_intervals_and_too_close_to_call() -> None:
    a, b, c = _cell("tp2", 2, 20.0), _cell("tp4", 4, 30.0), _cell("tp2-dp2", 4, 40.0)
    err = ModelError(0.10, "ttft_ms", "src")
    lines = model_error_lines(_rec(38, [a, b, c], c), err)
    assert "median ±10.0% (source: src)" in lines[0]
    assert "tp2 20 req/s -> [18, 22]; tp4 30 req/s -> [27, 33]; tp2-dp2 40 req/s -> [36, 44]" in lines[1]
    # decided and phrased once, by the recommendation's rule: the same words as its separation
    call = model_target_call("tp2-dp2", 40.0, 0.10, 38)
    assert call == ("too close to call against the target 38 req/s: tp2-dp2 [36, 44] at the simulated engine's "
                    "error ±10.0%: a measured engine may meet it or fall short")  # fmt: skip
    assert lines[2:] == [f"  {call}"]  # tp2 [18, 22] and tp4 [27, 33] fall short of 38 whatever the error
    narrow = model_error_lines(_rec(38, [a, b, c], c), ModelError(0.04, "ttft_ms", "src"))
    assert narrow[2:] == ["  tp2-dp2 meets the target 38 req/s even at its interval's low end"]
    wide = model_error_lines(_rec(38, [a, b, c], c), ModelError(0.30, "ttft_ms", "src"))
    assert [x.split(": ")[1].split(" [")[0] for x in wide[2:]] == ["tp4", "tp2-dp2"]  # 30 × 1.3 = 39 reaches 38
    # without a target the pick's separation from its runner-up is the recommendation's, printed with it
    assert model_error_lines(_rec(None, [a, b, c], c), err)[2:] == []
    assert model_target_call("m", 40.0, None, 38) is None  # a measured capacity has no model interval


def _readme_main_job() -> list[str]:
    text = (REPO / "README.md").read_text()
    line = next(x for x in text.splitlines() if ".venv/bin/bench sweep --engine sim" in x)
    return shlex.split(line.split(".venv/bin/bench ", 1)[1])


def test_the_readme_main_job_prints_the_model_interval(tmp_path: Path) -> None:
    """The README's main job as written, in this process (``run_cli``: the process is not
    under test), and one capacity search per cell: the model's interval is the capacity's ±
    the model error, whatever the seeds' interval (its repeat searches: test_capacity_repeats.py)."""
    args = _readme_main_job()
    args[args.index("--out") + 1] = str(tmp_path / "sweep")
    r = run_cli(*args, "--no-progress", "--capacity-repeats", "0", cwd=REPO)
    assert r.returncode in (0, 5), r.stderr[-3000:]
    err = sim_model_error(())
    assert (f"model error: capacities are the simulated engine's; measured engines differ by a median "
            f"±{err.fraction:.1%} (source: the shipped validation rows") in r.stdout  # fmt: skip
    assert re.search(r"; tp2-dp2 [0-9.]+ req/s -> \[[0-9.]+, [0-9.]+\]", r.stdout), r.stdout[-2000:]
    # bench recommend re-judges the stored sweep, at another target: the interval comes with it
    r = run_cli("recommend", str(tmp_path / "sweep"), "--target-rate", "45", cwd=REPO)
    assert f"measured engines differ by a median ±{err.fraction:.1%}" in r.stdout, r.stdout[-2000:] + r.stderr
    assert "against the target 45 req/s: tp2-dp2" in r.stdout


def test_a_simulated_sweep_records_the_interval_in_parquet_and_the_report_shows_it(tmp_path: Path) -> None:
    """Per load (TTFT, TPOT, E2E, throughput) and per cell (capacity): the calibrated profile's
    held-out error per metric, with its source, in points.parquet and cells.parquet
    (results/schema.MODEL_ERROR_FIELDS); the recommendation and the report read it from there."""
    from click.testing import CliRunner

    from bench_llm.analysis.recommend import recommend
    from bench_llm.analysis.report import build_report
    from bench_llm.bench.cli import cli
    from bench_llm.bench.sweep.store import read_cells
    from bench_llm.results.reader import read_parquet_file
    from bench_llm.results.schema import MODEL_ERROR_SOURCE, model_error_column

    profile = tmp_path / "host.toml"
    profile.write_text(PROFILE)
    out = tmp_path / "sweep"
    res = CliRunner().invoke(cli, [
        "sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "1", "--capacity",
        "--slo", "ttft_ms=300,tpot_ms=30", "--input-tokens", "256", "--output-tokens", "32", "--requests", "20",
        "--precision", "0.3", "--capacity-repeats", "0", "--jobs", "1", f"--engine-arg=--config={profile}", "--out", str(out)])  # fmt: skip
    assert res.exit_code in (0, 5), res.output
    points = read_parquet_file(out / "cell=tp1" / "points.parquet").to_pylist()
    want = {"ttft_ms": 0.075, "tpot_ms": 0.04, "throughput": 0.02, "e2e_ms": None, "capacity": 0.075}
    for row in points:
        assert {m: row[model_error_column(m)] for m in want} == pytest.approx(want)
        assert str(profile) in row[MODEL_ERROR_SOURCE] and "held-out residuals per metric" in row[MODEL_ERROR_SOURCE]
    cells = {r["cell_id"]: r for r in read_cells(out)}
    assert cells["tp1"][model_error_column("capacity")] == pytest.approx(0.075)
    rec = recommend(out)
    config = rec.workloads[next(iter(rec.workloads))].configuration("tp1")
    assert config is not None and config.model_error == pytest.approx(0.075) and str(profile) in str(config.model_error_source)
    cap = config.capacity_rps or 0.0
    assert config.model_interval_rps == pytest.approx((cap * 0.925, cap * 1.075))
    html = build_report(out, tmp_path / "report.html").path.read_text()
    assert "Model error" in html and "model-error-loads" in html and "±7.5%" in html
    assert f"{cap:.4g} [{cap * 0.925:.4g}, {cap * 1.075:.4g}]" in html
