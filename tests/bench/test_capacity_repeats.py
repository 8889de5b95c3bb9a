"""The capacity interval includes the run-to-run (workload seed) variation (issue 32): repeat
searches with fresh seeds, a prediction interval from them, the same interval recomputed by
``bench recommend`` from Parquet; and a load bench's client could not offer is client-limited,
never a pass (the capacity a lower bound with the lever that measures further)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench_llm.analysis.capacity_client import client_limit, client_limit_text, client_limited
from bench_llm.analysis.capacity_repeats import prediction_interval, t_quantile
from bench_llm.analysis.recommend import recommend
from bench_llm.analysis.summary_types import ClientHealth, ClientWindow
from bench_llm.bench.sweep.store import read_cells
from bench_llm.results.sweep_rows import ClientLimit, PointRow
from tests.conftest import REPO, bench_argv

TP2 = ["sweep", "--engine", "sim", "--model", "llama-3.1-70b", "--gpu", "h100", "--gpus", "2", "--tp", "2",
       "--capacity", "--slo", "ttft_ms=300,tpot_ms=40", "--input-tokens", "128", "--output-tokens", "16",
       "--engine-arg=--max-num-seqs=8", "--no-progress"]  # fmt: skip


def _sweep(out: Path, seed: int) -> dict:
    r = subprocess.run(bench_argv(*TP2, "--seed", str(seed), "--out", str(out)), cwd=REPO, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(json.loads(read_cells(out)[0]["capacity_json"])["in128-out16"])


def test_the_interval_holds_the_capacities_other_workload_seeds_find(tmp_path: Path) -> None:
    """Seeds 0 and 1 of the README job's TP2 cell: before, each printed interval was one
    search's margin-decided loads and did not hold the other seed's capacity (19.8 req/s at
    seed 0 against [20.23, ...) at seed 1)."""
    a = _sweep(tmp_path / "s0", 0)
    b = _sweep(tmp_path / "s1", 1)
    for cap in (a, b):
        rep = cap["repeats"]
        found = [cap["capacity_rps"], *rep["capacities"]]
        assert len(found) == 3 and len(set(found)) > 1  # the seeds' searches do move the answer
        # wide enough for the spread between the seeds, around it
        assert cap["interval_low_rps"] <= min(found) and max(found) < cap["interval_high_rps"]
    # each seed's interval holds the other seed's capacity
    assert a["interval_low_rps"] <= b["capacity_rps"] < a["interval_high_rps"]
    assert b["interval_low_rps"] <= a["capacity_rps"] < b["interval_high_rps"]
    # bench recommend recomputes the same interval from the stored repeat searches
    conf = recommend(tmp_path / "s0").workloads["in128-out16"].configurations[0].capacity
    assert (conf.interval_low_rps, conf.interval_high_rps) == (a["interval_low_rps"], a["interval_high_rps"])
    assert conf.interval_seeds == 3


def test_the_prediction_interval_widens_with_the_spread_and_few_seeds() -> None:
    assert t_quantile(0.95, 2) == pytest.approx(2.920, abs=2e-3)
    assert t_quantile(0.975, 10) == pytest.approx(2.228, abs=2e-3)
    same = prediction_interval([20.0, 20.0, 20.0], precision=0.02)
    spread = prediction_interval([19.0, 20.0, 21.0], precision=0.02)
    assert same is not None and spread is not None
    assert same.low < 20.0 < same.high  # equal answers on one grid: still the search's resolution wide
    assert spread.high - spread.low > 2 * (same.high - same.low)
    more = prediction_interval([19.0, 20.0, 21.0] * 3, precision=0.02)
    assert more is not None and more.high - more.low < spread.high - spread.low
    assert prediction_interval([20.0], precision=0.02) is None


def _health(saturated_windows: int, windows: int) -> ClientHealth:
    ws = [ClientWindow(float(i), float(i + 1), 10, 10, 1.0, 1.0, 0.5, i < saturated_windows, []) for i in range(windows)]
    return ClientHealth(1.0, windows=ws, saturated_windows=saturated_windows,
                        warnings=["client saturated"] if saturated_windows else [],
                        saturated=bool(saturated_windows))  # fmt: skip


def test_a_run_whose_client_was_saturated_in_most_windows_is_client_limited() -> None:
    assert client_limited(_health(9, 10)) == "client-limited: bench's client was saturated in 9 of 10 windows"
    assert client_limited(_health(1, 10)) is None
    assert client_limited(_health(0, 10)) is None
    assert client_limited(_health(1, 2)) is None  # a run of two windows: the lag rules alone judge it


def test_a_capacity_below_a_client_limited_load_is_a_lower_bound_with_the_lever() -> None:
    def row(rate: float, limited: str | None, workers: int = 1, role: str = "probe") -> PointRow:
        return PointRow.from_row({"load_kind": "rate", "role": role, "load_value": rate, "load_label": f"rate-{rate:g}",
                                  "client_limited": limited, "client_workers": workers})  # fmt: skip

    why = "client-limited: bench's client was saturated in 9 of 10 windows"
    rows = [row(60.0, None), row(120.0, why), row(120.0, why, 2)]
    limit = client_limit(rows, 60.0, None)
    assert limit == ClientLimit(120.0, 2, why)
    text = client_limit_text(limit, 60.0)
    assert text.startswith("capacity ≥ 60 req/s, client-limited: bench's client could not offer 120 req/s")
    assert "--workers 4" in text
    # a baseline's run is not a load of the search
    assert client_limit([row(60.0, None), row(120.0, why, role="baseline")], 60.0, None) is None
    # a load that failed decidedly below the client-limited one: the capacity is no lower bound
    assert client_limit(rows, 60.0, 90.0) is None
    # one truthful run of the load: not client-limited
    assert client_limit([*rows, row(120.0, None)], 60.0, None) is None


def test_a_load_whose_confirmation_was_client_limited_does_not_pass_on_its_probe() -> None:
    """Real vLLM on a busy host: the probe at 9.078 req/s passed on 100 requests, its 600-request
    confirmation was client-limited in 10 of 10 windows, and the load passed on the probe alone."""
    from bench_llm.analysis.capacity import judge_load

    probe = {"role": "probe", "requests": 100, "met": 100, "attainment": 1.0, "saturated": False}
    why = "client-limited: bench's client was saturated in 10 of 10 windows"
    confirm = {"role": "confirm", "requests": 600, "met": 600, "attainment": 1.0, "saturated": False,
               "untrustworthy": why}  # fmt: skip
    assert judge_load([probe], 90.0).passed
    j = judge_load([probe, confirm], 90.0)
    assert j.undecided and j.untrustworthy and why in j.untrustworthy
    # a confirmation measured again truthfully (twice the client processes) decides with the probe
    again = {**confirm, "untrustworthy": None}
    assert judge_load([probe, confirm, again], 90.0).passed


def test_too_close_to_call_uses_the_repeats_interval_against_a_target() -> None:
    """A smaller configuration whose probe bracket failed below the target but whose interval
    over the workload seeds reaches it may meet the target on another seed: too close to call."""
    from bench_llm.analysis.recommend_choice import target_separation
    from bench_llm.analysis.recommend_types import Configuration, Pick

    def cfg(cell: str, gpus: int, lo: float, hi: float, high: float | None, seeds: int | None, axes: int = 1) -> Configuration:
        return Configuration.from_json({"cell_id": cell, "gpus": gpus, "axes": axes, "kind": "rate", "capacity_rps": lo, "upper_rps": hi,
                                        "interval_low_rps": lo * 0.95, "interval_high_rps": high,
                                        "interval_seeds": seeds})  # fmt: skip

    big = cfg("tp2-dp2", 4, 46.1, 46.8, None, None, axes=2)
    pick = Pick.from_json({"cell_id": "tp2-dp2", "gpus": 4})
    reaches = [cfg("tp4", 4, 36.5, 37.2, 38.9, 3), big]  # failed at 37.2, but seeds reach 38.9
    sep = target_separation(reaches, pick, 38.0)
    assert sep is not None and not sep.separated and "another seed's capacity may reach 38.9" in sep.text
    below = [cfg("tp4", 4, 30.3, 30.6, 31.5, 3), big]
    sep = target_separation(below, pick, 38.0)
    assert sep is not None and sep.separated and "another seed's capacity lies below 31.5" in sep.text
