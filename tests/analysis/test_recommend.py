"""Recommendation and limiting-resource diagnosis on constructed sweep folders (Parquet only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from bench_llm.analysis.recommend import recommend
from bench_llm.analysis.recommend_choice import target_separation
from bench_llm.analysis.recommend_diagnosis import diagnose_cell
from bench_llm.analysis.recommend_text import format_recommendation
from bench_llm.analysis.recommend_types import Configuration, Pick, Recommendation, Separation
from bench_llm.bench.sweep.store import write_cells, write_points
from bench_llm.results.sweep_rows import PointRow

SLO = {"ttft_ms": 500.0, "tpot_ms": 50.0}


def _cfg(cell: str) -> dict[str, Any]:
    parts = dict(tp=1, pp=1, dp=1, ep=1, dcp=1, pcp=1)
    for p in cell.split("-"):
        name = p.rstrip("0123456789")
        parts[name] = int(p[len(name) :])
    gpus = parts["tp"] * parts["pp"] * parts["pcp"] * parts["dp"]
    axes = sum(1 for k in ("tp", "pp", "dp", "ep", "dcp", "pcp") if parts[k] > 1)
    return {"cell_id": cell, **parts, "disagg": None, "gpus": gpus, "axes": axes, "engine": "sim", "model": "m"}


def _point(cell: str, rate: float, att: float, *, sat: bool = False, ttft50: float = 100.0, ttft90: float = 200.0,
           tpot50: float = 20.0, tpot90: float = 30.0, miss_ttft: float = 0.0, miss_tpot: float = 0.0,
           kind: str = "rate", role: str = "probe", **server: float) -> dict[str, Any]:  # fmt: skip
    return {
        **_cfg(cell),
        "workload": "w",
        "load_label": f"rate-{rate:g}",
        "load_kind": kind,
        "load_value": rate,
        "repeat": 0,
        "role": role,
        "status": "complete",
        "saturated": sat,
        "saturation_reason": "queueing grew" if sat else None,
        "run_dir": f"cell={cell}/load=rate-{rate:g}",
        "requests": 50,
        "ok": 50,
        "failed": 0,
        "attainment": att,
        "goodput_rps": rate * att,
        "throughput_rps": rate,
        "ttft_p50_ms": ttft50,
        "ttft_p90_ms": ttft90,
        "tpot_p50_ms": tpot50,
        "tpot_p90_ms": tpot90,
        "miss_share_ttft_ms": miss_ttft,
        "miss_share_tpot_ms": miss_tpot,
        **{f"server_{k}": v for k, v in server.items()},
    }


def _sweep(tmp: Path, points: list[dict[str, Any]], extra_cells: list[dict[str, Any]] = ()) -> Path:  # type: ignore[assignment]
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        by_cell.setdefault(p["cell_id"], []).append(p)
    rows = []
    for cell, pts in by_cell.items():
        write_points(tmp, cell, [PointRow.from_row(p) for p in pts])
        rows.append({**_cfg(cell), "status": "complete"})
    write_cells(tmp, rows + list(extra_cells))
    return tmp


def _two_plus_one(tmp: Path) -> Path:
    """tp2: capacity 4; tp4: capacity 6; tp2-dp2: capacity 8 (same 4 GPUs as tp4).

    Without a target, tp2 and tp2-dp2 tie at 2 req/s per GPU and the fewer GPUs win."""
    pts = []
    for cell, cap in (("tp2", 4.0), ("tp4", 6.0), ("tp2-dp2", 8.0)):
        for rate in (2.0, 4.0, 6.0, 8.0, 10.0):
            ok = rate <= cap
            pts.append(_point(cell, rate, 0.99 if ok else 0.5, sat=not ok, ttft50=100 if ok else 900, miss_ttft=0 if ok else 0.5))
    return _sweep(tmp, pts, [{**_cfg("tp4-dp2"), "status": "skipped", "reason": "needs 8 GPUs, 4 available"}])


def test_without_an_slo_there_is_nothing_to_recommend(tmp_path: Path) -> None:
    sweep = _two_plus_one(tmp_path)  # its load folders hold no run metadata, so no stored SLO
    rec = recommend(sweep, target_rate=3.0).to_json()
    assert rec["recommendation"] is None and rec["message"].startswith("no SLO")


@pytest.mark.parametrize(
    "target,expected",
    [(3.0, "tp2"), (5.0, "tp4"), (7.0, "tp2-dp2"), (None, "tp2"), (9.0, None)],
)
def test_choice_by_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: float | None, expected: str | None) -> None:
    sweep = _two_plus_one(tmp_path)
    monkeypatch.setattr("bench_llm.analysis.recommend.sweep_settings", lambda s, p: {"slo": SLO, "attainment_pct": 90.0})
    rec = recommend(sweep, target_rate=target).to_json()
    if expected is None:
        assert rec["recommendation"] is None and "no configuration meets" in rec["message"]
        assert "tp2-dp2 at 8 req/s" in rec["message"]
        return
    assert rec["recommendation"]["cell_id"] == expected
    ev = rec["recommendation"]["evidence"]
    assert ev["passed"] and (target is None or ev["load_value"] >= target)
    text = format_recommendation(Recommendation.from_json(rec))
    assert f"RECOMMENDATION: {expected}" in text and "needs 8 GPUs" in text


def test_fewer_axes_breaks_a_tie_in_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every request met (0.95 of 50 would be undecided at 90 %: its interval reaches 86 %)
    pts = [_point(c, r, 1.0) for c in ("tp4", "tp2-dp2") for r in (2.0, 4.0)]
    sweep = _sweep(tmp_path, pts)
    monkeypatch.setattr("bench_llm.analysis.recommend.sweep_settings", lambda s, p: {"slo": SLO, "attainment_pct": 90.0})
    assert recommend(sweep, target_rate=4.0).to_json()["recommendation"]["cell_id"] == "tp4"


def _diag(points: list[dict[str, Any]]) -> str:
    return str(diagnose_cell(pd.DataFrame(points), SLO, 90.0).limiting_factor)


def test_diagnosis_reads_the_limiting_resource() -> None:
    # TTFT grows from 100 ms to 900 ms under load: queueing
    assert _diag([_point("tp2", 1, 1.0), _point("tp2", 4, 0.4, ttft50=900, ttft90=1500, miss_ttft=0.6)]) == "queueing"
    # TTFT misses but barely grew over the lightest load: prefill
    assert _diag([_point("tp2", 1, 1.0, ttft50=420), _point("tp2", 2, 0.6, ttft50=480, ttft90=700, miss_ttft=0.4)]) == "prefill"
    # TTFT above target even one request at a time: prefill, unloaded
    assert (
        _diag([_point("tp2", 1, 0.0, ttft50=700, ttft90=800, miss_ttft=1.0, kind="concurrency", role="baseline")])
        == "prefill_unloaded"
    )
    # TPOT misses dominate, fine at the lightest load: decode-bound
    assert _diag([_point("tp2", 1, 1.0), _point("tp2", 4, 0.5, tpot50=60, tpot90=80, miss_tpot=0.5)]) == "decode"
    assert _diag([_point("tp8", 1, 0.2, tpot50=70, tpot90=80, miss_tpot=0.8)]) == "decode_unloaded"
    # the server says the KV cache filled / requests were preempted
    assert (
        _diag([_point("tp2", 1, 1.0), _point("tp2", 4, 0.5, ttft50=900, miss_ttft=0.5, kv_cache_usage_max=0.99)])
        == "kv_cache"
    )
    assert _diag([_point("tp2", 1, 1.0), _point("tp2", 4, 0.5, tpot50=60, miss_tpot=0.5, preemptions=12.0)]) == "kv_cache"
    # the server's queue-time histogram overrides the client's estimate
    assert (
        _diag([_point("tp2", 1, 1.0, ttft50=400), _point("tp2", 2, 0.5, ttft50=600, miss_ttft=0.5, queue_time_mean_ms=500.0)])
        == "queueing"
    )
    # nothing failed
    d = diagnose_cell(pd.DataFrame([_point("tp2", 1, 1.0), _point("tp2", 2, 0.97)]), SLO, 90.0)
    assert d.limiting_factor == "none" and "2 req/s" in d.explanation


def test_an_untrustworthy_load_marks_the_answer_and_the_exit_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from bench_llm.bench.commands.recommend import command
    from bench_llm.bench.errors import ExitCode

    why = "client saturated (its lag p99 420.0 ms against an SLO bound of 500 ms)"
    pts = [_point("tp1", 2.0, 1.0), {**_point("tp1", 4.0, 0.2), "untrustworthy": why}]  # the "failure" is the client's
    pts += [_point("tp2", 2.0, 1.0), _point("tp2", 4.0, 1.0), _point("tp2", 8.0, 0.2)]
    sweep = _sweep(tmp_path, pts)
    monkeypatch.setattr("bench_llm.analysis.recommend.sweep_settings", lambda s, p: {"slo": SLO, "attainment_pct": 90.0})
    rec = recommend(sweep).to_json()
    tp1 = next(c for c in rec["workloads"]["w"]["configurations"] if c["cell_id"] == "tp1")
    assert tp1["upper_rps"] is None and tp1["undecided"] == [4.0]  # not a failure: undecided
    assert rec["untrustworthy"] == [f"tp1 at 4 req/s: {why}"]
    text = format_recommendation(Recommendation.from_json(rec))
    assert "UNTRUSTWORTHY" in text and why in text
    result = CliRunner().invoke(command, [str(sweep)])
    assert result.exit_code == ExitCode.UNTRUSTWORTHY and "UNTRUSTWORTHY" in result.output
    trusted = _sweep(tmp_path / "b", [_point("tp2", 2.0, 1.0), _point("tp2", 4.0, 0.2)])
    assert CliRunner().invoke(command, [str(trusted)]).exit_code == 0


def test_rejudging_says_what_it_does_not_know_instead_of_no_capacity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # as after `bench recommend --slo <tighter>`: tp1 passed one at a time, every probed rate
    # (24 and up) now fails; nothing below 24 req/s was ever measured
    base = _point("tp1", 1.0, 1.0, kind="concurrency", role="baseline")
    pts = [base, *(_point("tp1", r, 0.3, miss_ttft=0.7) for r in (24.0, 48.0))]
    pts += [_point("tp2", r, 1.0 if r <= 24 else 0.3) for r in (12.0, 24.0, 48.0)]
    sweep = _sweep(tmp_path, pts)
    monkeypatch.setattr("bench_llm.analysis.recommend.sweep_settings", lambda s, p: {"slo": SLO, "attainment_pct": 90.0})
    rec = recommend(sweep, target_rate=10.0).to_json()
    wr = rec["workloads"]["w"]
    tp1 = next(c for c in wr["configurations"] if c["cell_id"] == "tp1")
    assert tp1["capacity_rps"] is None and tp1["unknown_below_rps"] == 24.0
    assert "not probed below 24 req/s" in tp1["note"]
    assert rec["recommendation"]["cell_id"] == "tp2" and wr["provisional"]
    assert "not known for tp1 (1 GPU, not probed below 24 req/s)" in rec["message"]
    text = format_recommendation(Recommendation.from_json(rec))
    assert "no capacity under the SLOs" not in text and "unknown: not probed below 24 req/s" in text
    assert "<24?" in text
    # the message names the command that probes the gap (bench sweep --resume, tests/bench/test_sweep_rejudge.py)
    command = f"bench sweep --resume --out {sweep} --slo ttft_ms=500,tpot_ms=50"
    assert command in rec["message"] and wr["resume_command"] == command
    assert "PROVISIONAL" in text and command in text
    # without a target the pick is the most load per GPU: tp1 (1 GPU), unknown below 24 req/s,
    # might beat tp2's 12 req/s per GPU, so that answer is provisional too
    free = recommend(sweep).to_json()
    assert free["recommendation"]["cell_id"] == "tp2" and free["workloads"]["w"]["provisional"]
    assert "not known for tp1 (1 GPU, not probed below 24 req/s)" in free["message"]
    # a configuration that fails even one request at a time is a verdict, not a gap
    fail_base = _point("tp1", 1.0, 0.0, kind="concurrency", role="baseline", miss_ttft=1.0)
    pts2 = [fail_base, *(_point("tp1", r, 0.3) for r in (24.0, 48.0))]
    rec2 = recommend(_sweep(tmp_path / "b", pts2), target_rate=10.0).to_json()
    c2 = rec2["workloads"]["w"]["configurations"][0]
    assert c2.get("unknown_below_rps") is None and "one request at a time" in c2["note"]


def test_the_winner_is_separated_or_too_close_to_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench_llm.analysis.recommend.sweep_settings", lambda s, p: {"slo": SLO, "attainment_pct": 90.0})
    # tp1 passes 4 (4/GPU); tp2 passes 6 and fails 7 (3.5/GPU at most): separated
    far = [_point("tp1", r, 1.0 if r <= 4 else 0.2) for r in (2.0, 4.0, 5.0)]
    far += [_point("tp2", r, 1.0 if r <= 6 else 0.2) for r in (2.0, 6.0, 7.0)]
    rec = recommend(_sweep(tmp_path / "far", far)).to_json()
    sep = rec["workloads"]["w"]["separation"]
    assert rec["recommendation"]["cell_id"] == "tp1" and sep["separated"] and sep["runner_up"] == "tp2"
    # tp2 passes 7.6 (3.8/GPU, > 5 % below tp1's 4) but fails only at 10 (5/GPU): within noise
    close = [_point("tp1", r, 1.0 if r <= 4 else 0.2) for r in (2.0, 4.0, 5.0)]
    close += [_point("tp2", r, 1.0 if r <= 7.6 else 0.2) for r in (2.0, 7.6, 10.0)]
    rec = recommend(_sweep(tmp_path / "close", close)).to_json()
    assert rec["recommendation"]["cell_id"] == "tp1"  # fewer GPUs decide
    assert not rec["workloads"]["w"]["separation"]["separated"]
    assert "TOO CLOSE TO CALL" in format_recommendation(Recommendation.from_json(rec))


def _bracket(cell: str, gpus: int, lo: float | None, hi: float | None, axes: int = 1) -> dict[str, Any]:
    return {"cell_id": cell, "gpus": gpus, "axes": axes, "capacity_rps": lo, "upper_rps": hi}


def _tsep(configs: list[dict[str, Any]], rec: dict[str, Any] | None, target: float) -> dict[str, Any] | None:
    """``target_separation`` on configurations and a pick written as the file has them."""
    sep: Separation | None = target_separation(
        [Configuration.from_json(c) for c in configs], Pick.from_json(rec) if rec else None, target
    )
    return sep.to_json() if sep else None


def test_a_target_answer_is_too_close_to_call_when_a_smaller_bracket_holds_the_target() -> None:
    """Issue 18: with --target-rate, a smaller configuration that passed below the target and
    never failed at or below it may meet the target in a repeat: the answer says so."""
    big = _bracket("tp2-dp2", 4, 46.1, 46.8, axes=2)
    rec = {"cell_id": "tp2-dp2", "gpus": 4}
    decided = [_bracket("tp2", 2, 21.1, 21.3), _bracket("tp4", 4, 30.3, 30.6), big]
    sep = _tsep(decided, rec, 38.0)
    assert sep is not None and sep["separated"] and sep["runner_up"] == "tp4"
    straddles = [_bracket("tp2", 2, 21.1, 21.3), _bracket("tp4", 4, 35.0, 39.0), big]  # 38 lies inside tp4's bracket
    sep = _tsep(straddles, rec, 38.0)
    assert sep is not None and not sep["separated"] and sep["runner_up"] == "tp4"
    assert "too close to call at 38 req/s" in sep["text"]
    never_failed = [_bracket("tp4", 4, 30.0, None), big]  # passed 30, nothing failed: 38 is open
    assert not _tsep(never_failed, rec, 38.0)["separated"]  # type: ignore[index]
    # nothing met the target: a bracket holding it makes "none" too close to call as well
    sep = _tsep([_bracket("tp2", 2, 21.1, 21.3), _bracket("tp4", 4, 35.0, 39.0)], None, 38.0)
    assert sep is not None and not sep["separated"] and sep["text"].startswith("no configuration and tp4")
    # a larger configuration is never the runner-up of a target answer; no smaller one: no line
    assert _tsep([_bracket("tp2", 2, 40.0, 44.0), _bracket("tp4", 4, 35.0, 39.0)], {"cell_id": "tp2", "gpus": 2}, 38.0) is None



def test_an_undecided_baseline_stays_in_the_evidence_not_in_the_headlines_undecided_list(tmp_path: Path,
                                                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # 6 one-at-a-time requests, all met: too few for a 90 % pass at 95 % confidence (undecided)
    base = {**_point("tp1", 1.0, 1.0, kind="concurrency", role="baseline"), "requests": 6, "ok": 6,
            "load_label": "baseline-conc-1"}  # fmt: skip
    undecided = {**_point("tp1", 8.0, 0.9), "requests": 40, "ok": 40}  # a probe the sample cannot decide
    sweep = _sweep(tmp_path, [base, _point("tp1", 2.0, 1.0), _point("tp1", 4.0, 1.0), undecided])
    monkeypatch.setattr("bench_llm.analysis.recommend.sweep_settings", lambda s, p: {"slo": SLO, "attainment_pct": 90.0})
    wr = recommend(sweep).to_json()["workloads"]["w"]
    loads = wr["configurations"][0]["loads"]
    assert [p["verdict"] for p in loads if p["baseline"]] == ["undecided"]  # kept in the configuration's loads
    assert wr["undecided"] and all("one request at a time" not in u for u in wr["undecided"])
    assert any("8 req/s" in u for u in wr["undecided"])  # a probe the sample cannot decide still is listed
