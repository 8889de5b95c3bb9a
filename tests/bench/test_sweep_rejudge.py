"""Issue 16 item 5: re-judging a sweep with tighter SLOs never invents a verdict, and
``bench sweep --resume --slo <tighter>`` probes exactly the loads the new verdicts need.

On the simulated engine in virtual time (deterministic, a few seconds a sweep): a capacity
sweep under loose SLOs probes every cell at rates that all fail a tight TTFT bound; re-judged
at that bound the answer is unknown below the lowest probed rate (PROVISIONAL, the gap and the
command that fills it named); the resume probes only below it, in the same sweep folder, and
then the recommendation is definite and the same as a fresh sweep's at the tight SLOs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench_llm.analysis.recommend import recommend
from bench_llm.analysis.recommend_io import load_points
from bench_llm.analysis.recommend_text import format_recommendation
from bench_llm.analysis.recommend_types import Recommendation
from bench_llm.bench.sweep.store import read_cells
from tests.conftest import REPO, run_cli

SWEEP = [
    "sweep", "--engine", "sim", "--model", "llama-3.1-70b", "--gpu", "h100", "--gpus", "4", "--tp", "2,4",
    "--capacity", "--confidence", "0", "--input-tokens", "128", "--output-tokens", "16", "--requests", "20",
    "--warmup", "2", "--capacity-start", "20", "--precision", "0.5", "--max-probes", "5",
    "--target-rate", "3", "--engine-arg=--max-num-seqs=8",
    # one search per cell: re-judging reads the main search's probes (the seeds' interval:
    # tests/bench/test_capacity_repeats.py)
    "--capacity-repeats", "0",
]  # fmt: skip
LOOSE = "ttft_ms=300,tpot_ms=40"
TIGHT = "ttft_ms=40,tpot_ms=40"


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    r = run_cli(*args, "--no-progress", cwd=REPO)  # in this process: no interpreter start-up per command
    assert r.returncode in (0, 4), r.stderr[-3000:]  # 4: no configuration meets the SLOs
    return r


def _rates(sweep: Path) -> dict[str, set[float]]:
    pts = load_points(sweep)
    probes = pts[pts["role"] == "probe"]
    return {str(c): set(g["load_value"]) for c, g in probes.groupby("cell_id")}


@pytest.mark.timeout(900)  # about 1 min of four bench commands on a quiet host; 5 min seen under load
def test_resume_with_tighter_slos_probes_the_gap_and_settles_the_answer(tmp_path: Path) -> None:
    out = tmp_path / "s"
    _bench(*SWEEP, "--slo", LOOSE, "--out", str(out))
    before = _rates(out)
    assert before["tp2"] and before["tp4"]

    # re-judged at the tight SLOs: every probed rate fails, nothing below was measured
    tight = {"ttft_ms": 40.0, "tpot_ms": 40.0}
    rec = recommend(out, slo=tight).to_json()
    wr = rec["workloads"]["in128-out16"]
    for c in wr["configurations"]:
        assert c["capacity_rps"] is None and c["unknown_below_rps"] == min(before[c["cell_id"]])
    assert wr["provisional"] and rec["recommendation"] is None
    command = f"bench sweep --resume --out {out} --slo {TIGHT}"
    assert "not probed below" in rec["message"] and command in rec["message"]
    assert "no capacity under the SLOs" not in format_recommendation(Recommendation.from_json(rec))

    r = _bench("sweep", "--resume", "--out", str(out), "--slo", TIGHT)
    assert "re-judged at ttft_ms=40,tpot_ms=40" in r.stderr
    after = _rates(out)
    for cell, rates in before.items():
        added = after[cell] - rates
        assert rates <= after[cell] and added, (cell, added)
        assert max(added) < min(rates), (cell, added)  # only below what was probed: the gap
    pts = load_points(out)
    assert (pts["role"] == "baseline").sum() == 2  # the one-at-a-time baselines were not re-run
    cells = {c["cell_id"]: c for c in read_cells(out)}
    for c in cells.values():
        assert c["status"] == "complete" and c["capacity_rps"] is not None
        assert json.loads(c["capacity_json"])["in128-out16"]["judged"]["slo"] == tight

    resumed = recommend(out).to_json()  # the sweep's own SLOs are now the tight ones
    assert resumed["slo"] == tight and not resumed["workloads"]["in128-out16"].get("provisional")
    assert resumed["recommendation"] is not None

    fresh = tmp_path / "fresh"
    _bench(*SWEEP, "--slo", TIGHT, "--out", str(fresh))
    answer = recommend(fresh).to_json()
    assert answer["recommendation"]["cell_id"] == resumed["recommendation"]["cell_id"]
    # the same verdict per configuration: each meets the 3 req/s target in both or in neither
    for c in answer["workloads"]["in128-out16"]["configurations"]:
        r2 = next(x for x in resumed["workloads"]["in128-out16"]["configurations"] if x["cell_id"] == c["cell_id"])
        assert ((c["capacity_rps"] or 0) >= 3) == ((r2["capacity_rps"] or 0) >= 3), (c, r2)

    # resuming again with the same SLOs measures nothing more
    again = _bench("sweep", "--resume", "--out", str(out), "--slo", TIGHT)
    assert _rates(out) == after and "starting sim" not in again.stderr


@pytest.mark.timeout(600)
def test_a_rate_list_rejudged_probes_below_its_lowest_rate_and_a_looser_slo_measures_nothing(tmp_path: Path) -> None:
    out = tmp_path / "list"
    args = ["--engine", "sim", "--model", "llama-3.1-70b", "--gpu", "h100", "--tp", "2", "--rate", "10,20",
            "--confidence", "0", "--input-tokens", "128", "--output-tokens", "16", "--requests", "20", "--warmup", "2",
            "--engine-arg=--max-num-seqs=8"]  # fmt: skip
    _bench("sweep", *args, "--slo", LOOSE, "--out", str(out))
    before = _rates_of(out)
    assert before == {10.0, 20.0}
    r = _bench("sweep", "--resume", "--out", str(out), "--slo", TIGHT)
    added = _rates_of(out) - before
    # halving below the lowest listed rate, down to an eighth of it at most (cell_search.GAP_FLOOR)
    assert added and added <= {5.0, 2.5, 1.25}, added
    assert "probing the missing loads, from 5 req/s" in r.stderr
    # back to the loose SLOs: the listed rates decide again, nothing is measured
    again = _bench("sweep", "--resume", "--out", str(out), "--slo", LOOSE)
    assert "no load missing" in again.stderr and "starting sim" not in again.stderr
    assert _rates_of(out) == before | added


def _rates_of(sweep: Path) -> set[float]:
    pts = load_points(sweep)
    return set(pts["load_value"])
