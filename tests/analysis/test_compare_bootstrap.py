"""Bootstrap comparison on synthetic runs (no engine): pooling, coverage, significance, grouping."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from bench_llm.analysis.bootstrap import BootstrapOptions, compare_sides, make_side, point_estimates
from bench_llm.analysis.compare import compare_paths, format_comparison
from bench_llm.analysis.load import load_run
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.summary import summarize
from bench_llm.results.synthetic import synthetic_run
from tests.conftest import run_cli

OPTS = BootstrapOptions(resamples=400, seed=1)


def _by_metric(changes: list) -> dict:
    return {c.metric: c for c in changes}


def test_repeats_are_pooled_not_averaged(tmp_path: Path) -> None:
    fast = load_run(synthetic_run(tmp_path / "fast", 400, 4, seed=1, scale=1.0)).requests
    slow = load_run(synthetic_run(tmp_path / "slow", 100, 4, seed=2, scale=3.0)).requests
    side = make_side([fast, slow])
    pooled = np.concatenate([summ_ttft(fast), summ_ttft(slow)])
    got = point_estimates(side, ["ttft_p95_ms", "ttft_p50_ms"])
    assert got["ttft_p95_ms"] == pytest.approx(np.percentile(pooled, 95))
    assert got["ttft_p50_ms"] == pytest.approx(np.percentile(pooled, 50))
    mean_of_p95 = (np.percentile(summ_ttft(fast), 95) + np.percentile(summ_ttft(slow), 95)) / 2
    assert abs(got["ttft_p95_ms"] - mean_of_p95) > 10  # the two definitions really differ here


def summ_ttft(table: pa.Table) -> np.ndarray:
    from bench_llm.analysis.metrics import request_metrics

    return request_metrics(table)["ttft_ms"].to_numpy(dtype=float)


def test_point_estimates_match_the_run_summary(tmp_path: Path) -> None:
    table = load_run(synthetic_run(tmp_path / "r", 500, 8)).requests
    slo = SLO.parse("ttft_ms=90,tpot_ms=13")
    s = summarize(table, __import__("bench_llm.analysis.summary", fromlist=["SummaryOptions"]).SummaryOptions(slo=slo))
    got = point_estimates(make_side([table], slo), ["ttft_p95_ms", "tpot_p50_ms", "itl_p99_ms", "requests_per_s", "output_tokens_per_s", "goodput_rps", "slo_attainment"])
    assert got["ttft_p95_ms"] == pytest.approx(s.latency["ttft_ms"]["p95"])
    assert got["tpot_p50_ms"] == pytest.approx(s.latency["tpot_ms"]["p50"])
    assert got["itl_p99_ms"] == pytest.approx(s.latency["itl_ms"]["p99"])
    assert got["requests_per_s"] == pytest.approx(s.throughput.requests_per_s)
    assert got["output_tokens_per_s"] == pytest.approx(s.throughput.output_tokens_per_s)
    assert got["goodput_rps"] == pytest.approx(s.slo.goodput_rps)
    assert got["slo_attainment"] == pytest.approx(s.slo.attainment)


def test_same_distribution_is_not_significant_and_15pct_is_found(tmp_path: Path) -> None:
    a = make_side([load_run(synthetic_run(tmp_path / "a", 600, 8, seed=1)).requests])
    b = make_side([load_run(synthetic_run(tmp_path / "b", 600, 8, seed=2)).requests])
    c = make_side([load_run(synthetic_run(tmp_path / "c", 600, 8, seed=3, scale=1.15)).requests])
    names = ["ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "e2e_p50_ms"]
    same = _by_metric(compare_sides(a, b, names, OPTS))
    assert not same["ttft_p50_ms"].significant and not same["tpot_p50_ms"].significant
    slower = _by_metric(compare_sides(a, c, names, OPTS))
    for m in names:
        ch = slower[m]
        assert ch.significant and ch.direction == "worse", ch
    for m in ("ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms"):
        assert slower[m].rel_low <= 0.15 <= slower[m].rel_high, slower[m]


def test_hierarchical_resampling_is_used_with_three_repeats(tmp_path: Path) -> None:
    for side in ("base", "cur"):
        for i in range(3):
            synthetic_run(tmp_path / side / f"r{i}", 150, 4, seed=10 * i + (side == "cur"))
    cmp = compare_paths(tmp_path / "base", tmp_path / "cur", ["ttft_p50_ms"], options=OPTS)
    (g,) = cmp.groups
    assert g.resampling == "hierarchical" and len(g.baseline_runs) == 3 and g.baseline_requests == 450
    assert "hierarchical" in format_comparison(cmp)


def test_sweep_folders_are_compared_cell_by_cell(tmp_path: Path) -> None:
    def extra(cell: str, rate: float) -> dict:
        return {"cell": {"tp": int(cell[-1])}, "load": {"kind": "rate", "value": rate, "label": f"rate-{rate:g}"}}

    for side, cells in (("A", ("tp1", "tp2")), ("B", ("tp1", "tp4"))):
        for cell in cells:
            synthetic_run(tmp_path / side / f"cell={cell}" / "load=rate-2", 100, 4, seed=len(cell), extra=extra(cell, 2))
    cmp = compare_paths(tmp_path / "A", tmp_path / "B", ["ttft_p50_ms"], options=OPTS)
    assert [g.key for g in cmp.groups] == ["tp=1 / rate=2"]
    assert cmp.unmatched == ("tp=2 / rate=2", "tp=4 / rate=2")


def test_repeats_with_suffixed_labels_are_pooled(tmp_path: Path) -> None:
    for side in ("A", "B"):
        for r in range(2):
            extra = {"cell": {"cell_id": "tp1", "tp": 1}, "workload": "in256-out32",
                     "load": {"kind": "rate", "value": 2.0, "label": f"rate-2-r{r + 1}"}, "repeat": r}  # fmt: skip
            synthetic_run(tmp_path / side / "cell=tp1" / f"load=rate-2-r{r + 1}", 100, 4, seed=r + 7 * (side == "B"), extra=extra)
    cmp = compare_paths(tmp_path / "A", tmp_path / "B", ["ttft_p50_ms"], options=OPTS)
    (g,) = cmp.groups
    assert g.key == "tp1 / in256-out32 / rate=2" and len(g.baseline_runs) == 2 and g.current_requests == 200


def test_compare_cli_text_json_and_errors(tmp_path: Path) -> None:
    a, b = synthetic_run(tmp_path / "a", 200, 4, seed=1), synthetic_run(tmp_path / "b", 200, 4, seed=2, scale=1.3)
    text = run_cli("compare", str(a), str(b), "--resamples", "200")  # in this process: the verb's output is tested
    assert text.returncode == 0, text.stderr
    assert "95% percentile bootstrap" in text.stdout and "WORSE" in text.stdout
    js = run_cli("compare", str(a), str(b), "--json", "--resamples", "200", "--metrics", "ttft_p50_ms", "--level", "0.9")
    data = json.loads(js.stdout)
    (c,) = data["groups"][0]["changes"]
    assert c["metric"] == "ttft_p50_ms" and c["level"] == 0.9 and c["significant"] and c["direction"] == "worse"
    bad = run_cli("compare", str(a), str(b), "--metrics", "nope")
    assert bad.returncode == 2 and "unknown metric 'nope'" in bad.stderr and "Traceback" not in bad.stderr
