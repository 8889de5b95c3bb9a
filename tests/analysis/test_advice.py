"""Advice that follows from the matrix: a diagnosis names only levers the cell has (no TP
collectives at TP1), names the swept axis when it is the cause, and no "fastest single
request" is claimed from a gap that one request at a time cannot show (issue 32, item 8)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from bench_llm.analysis.recommend import recommend
from bench_llm.analysis.recommend_diagnosis import advice, diagnose_cell
from tests.analysis.test_recommend import SLO, _cfg, _point, _sweep


def _tuned(cell: str, flag: str, value: str, rate: float, att: float, **kw: Any) -> dict[str, Any]:
    """A point of ``cell`` run with ``--flag=value`` (its id and tuning column as a sweep writes them)."""
    return {**_point(cell, rate, att, **kw), "cell_id": f"{cell}-{flag}_{value}", "tuning": json.dumps({flag: value})}


def test_a_tp1_diagnosis_names_no_tp_collectives_and_a_tp2_one_does() -> None:
    def explain(cell: str) -> str:
        pts = [_point(cell, 1, 1.0), _point(cell, 4, 0.5, tpot50=60, tpot90=80, miss_tpot=0.5)]
        d = diagnose_cell(pd.DataFrame(pts), SLO, 90.0)
        assert d.limiting_factor == "decode"
        return d.explanation

    tp1, tp2 = explain("tp1"), explain("tp2")
    assert "collective" not in tp1 and "smaller TP" not in tp1 and "more replicas (DP)" in tp1
    assert "TP collectives" in tp2
    assert "DCP" not in advice("kv_cache", {"tp": 1}) and "DCP" in advice("kv_cache", {"tp": 2})


def test_an_ep_cells_diagnosis_says_the_busiest_experts_gpu_sets_the_step() -> None:
    pts = [_tuned("tp2-ep2", "expert-imbalance", "2.0", r, a, **kw)
           for r, a, kw in ((1, 1.0, {}), (4, 0.5, {"tpot50": 60, "tpot90": 80, "miss_tpot": 0.5}))]  # fmt: skip
    d = diagnose_cell(pd.DataFrame(pts), SLO, 90.0)
    assert "busiest expert's GPU sets every MoE step (expert imbalance 2.0" in d.explanation
    assert "expert" not in advice("decode", {"tp": 2, "ep": 1})


def _one_layout_two_values(tmp: Path, baseline_ttft: tuple[float, float]) -> Path:
    """tp1 swept over max-num-seqs=4,16: 4 fails from 4 req/s on (queueing), 16 passes up to 8."""
    pts = []
    for value, cap, base in (("4", 2.0, baseline_ttft[0]), ("16", 8.0, baseline_ttft[1])):
        pts.append(_tuned("tp1", "max-num-seqs", value, 1, 1.0, ttft50=base, kind="concurrency", role="baseline"))
        for rate in (2.0, 4.0, 8.0, 12.0):
            ok = rate <= cap
            pts.append(_tuned("tp1", "max-num-seqs", value, rate, 1.0 if ok else 0.3, sat=not ok,
                              ttft50=150 if ok else 2000, ttft90=300 if ok else 3000, miss_ttft=0 if ok else 0.7))  # fmt: skip
    sweep = _sweep(tmp, [])
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for p in pts:
        by_cell.setdefault(p["cell_id"], []).append(p)
    from bench_llm.bench.sweep.store import write_cells, write_points
    from bench_llm.results.sweep_rows import PointRow

    for cell, cell_pts in by_cell.items():
        write_points(tmp, cell, [PointRow.from_row(p) for p in cell_pts])
    write_cells(tmp, [{**_cfg("tp1"), "cell_id": c, "status": "complete"} for c in by_cell])
    return sweep


def test_the_swept_flag_is_named_when_it_is_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench_llm.analysis.recommend.sweep_settings", lambda s, p: {"slo": SLO, "attainment_pct": 90.0})
    rec = recommend(_one_layout_two_values(tmp_path, (100.0, 96.0))).to_json()
    configs = {c["cell_id"]: c for c in rec["workloads"]["w"]["configurations"]}
    four = configs["tp1-max-num-seqs_4"]
    assert four["limiting_factor"] == "tuning"
    assert four["diagnosis"].startswith("the swept max-num-seqs=4 limits this configuration: max-num-seqs=16")
    assert "add replicas" not in four["diagnosis"]
    assert "max-num-seqs=16" in configs["tp1-max-num-seqs_16"]["diagnosis"]  # its queueing names the swept cap
    for c in configs.values():
        assert "collective" not in c["diagnosis"]
    # 100 ms against 96 ms one request at a time, one layout: host noise, not "the fastest single request"
    (line,) = rec["workloads"]["w"]["same_gpus_tradeoffs"]
    assert "fastest" not in line and "unloaded latency ties" in line


def test_a_fastest_single_request_needs_a_clear_lead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench_llm.analysis.recommend.sweep_settings", lambda s, p: {"slo": SLO, "attainment_pct": 90.0})

    def line(ttft: tuple[float, float], sub: str) -> str:
        pts = []
        for cell, base in zip(("tp2", "tp1-dp2"), ttft):
            pts.append(_point(cell, 1, 1.0, ttft50=base, kind="concurrency", role="baseline"))
            pts += [_point(cell, r, 1.0) for r in (2.0, 4.0)]
        rec = recommend(_sweep(tmp_path / sub, pts)).to_json()
        (out,) = rec["workloads"]["w"]["same_gpus_tradeoffs"]
        return str(out)

    assert "fastest single request" not in line((100.0, 104.0), "close") and "within 10%" in line((100.0, 104.0), "close2")
    assert "tp2 gives the fastest single request" in line((100.0, 150.0), "clear")


def test_advice_the_matrix_already_refuted_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tp4 is decode-bound, and the advice's lever (smaller TP, more replicas) is tp2-dp2 on the
    same 4 GPUs, which the sweep measured serving less: the diagnosis says so."""
    monkeypatch.setattr("bench_llm.analysis.recommend.sweep_settings", lambda s, p: {"slo": SLO, "attainment_pct": 90.0})
    pts = []
    for cell, cap in (("tp4", 8.0), ("tp2-dp2", 6.0)):
        for rate in (2.0, 4.0, 6.0, 8.0, 10.0):
            ok = rate <= cap
            pts.append(_point(cell, rate, 1.0 if ok else 0.4, tpot50=20 if ok else 70, tpot90=30 if ok else 90,
                              miss_tpot=0 if ok else 0.6))  # fmt: skip
    rec = recommend(_sweep(tmp_path, pts)).to_json()
    configs = {c["cell_id"]: c for c in rec["workloads"]["w"]["configurations"]}
    assert configs["tp4"]["limiting_factor"] == "decode"
    assert "the matrix tried that on the same GPUs and it served less: tp2-dp2 6 req/s (this one 8)" in configs["tp4"]["diagnosis"]
    assert "the matrix tried" not in configs["tp2-dp2"]["diagnosis"]  # its lever (yet more replicas) was not tried


def test_a_skewed_expert_load_is_named_as_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench_llm.analysis.recommend.sweep_settings", lambda s, p: {"slo": SLO, "attainment_pct": 90.0})
    pts = []
    for value, cap in (("1.0", 6.0), ("2.0", 2.0)):
        for rate in (2.0, 4.0, 6.0):
            ok = rate <= cap
            pts.append(_tuned("tp2-ep2", "expert-imbalance", value, rate, 1.0 if ok else 0.3, tpot50=20 if ok else 80,
                              tpot90=30 if ok else 90, miss_tpot=0 if ok else 0.7))  # fmt: skip
    from bench_llm.bench.sweep.store import write_cells, write_points
    from bench_llm.results.sweep_rows import PointRow

    by_cell: dict[str, list[dict[str, Any]]] = {}
    for p in pts:
        by_cell.setdefault(p["cell_id"], []).append(p)
    for cell, cell_pts in by_cell.items():
        write_points(tmp_path, cell, [PointRow.from_row(p) for p in cell_pts])
    write_cells(tmp_path, [{**_cfg("tp2-ep2"), "cell_id": c, "status": "complete"} for c in by_cell])
    configs = {c["cell_id"]: c for c in recommend(tmp_path).to_json()["workloads"]["w"]["configurations"]}
    skewed = configs["tp2-ep2-expert-imbalance_2.0"]["diagnosis"]
    assert skewed.startswith("expert imbalance 2.0 limits this layout: the busiest expert's GPU carries 2.0x")
    assert "at 1.0 it serves 6 req/s" in skewed
