"""Job metrics by hand (analysis/jobs.py): a fan-out/join job and a failed chain."""

from __future__ import annotations

import math

import pandas as pd

from bench_llm.analysis.jobs import job_met, job_table, summarize_jobs
from bench_llm.analysis.slo import SLO

MS = 1_000_000


def _req(rid: str, job: str, intended: int, send: int, first: int, end: int, ok: bool = True,
         cached: int | None = None) -> dict[str, object]:
    return {"request_id": rid, "phase": "measure", "session_id": job, "ok": ok, "error_type": None if ok else "x",
            "intended_send_ns": intended * MS, "send_ns": send * MS, "first_token_ns": first * MS,
            "end_ns": end * MS, "prompt_tokens": 100, "input_tokens_target": 100, "output_tokens": 10,
            "cached_tokens": cached}


def test_fan_out_join_and_a_failed_chain() -> None:
    # job a: root 0-100 ms; s1 100+20 -> 420 (300 ms); s2 100+10 -> 210 (100 ms); fin after all at 420+30 -> 500
    requests = pd.DataFrame([
        _req("r0", "a", 0, 0, 40, 100, cached=0), _req("r1", "a", 120, 120, 150, 420, cached=50),
        _req("r2", "a", 110, 110, 130, 210, cached=50), _req("r3", "a", 450, 450, 470, 500, cached=100),
        _req("r4", "b", 1000, 1000, 1010, 1100), _req("r5", "b", 1200, 1200, 1210, 1300, ok=False),
    ])
    schedule = pd.DataFrame({
        "request_id": ["r0", "r1", "r2", "r3", "r4", "r5", "r6"], "phase": ["measure"] * 7,
        "session_id": ["a"] * 4 + ["b"] * 3, "turn": [0, 1, 2, 3, 0, 1, 2],
        "after": [[], ["r0"], ["r0"], ["r0", "r1", "r2"], [], [], []],
    })
    jobs = job_table(requests, schedule).set_index("job")
    a, b = jobs.loc["a"], jobs.loc["b"]
    assert a["ok"] and a["requests"] == 4
    assert math.isclose(a["job_ms"], 500) and math.isclose(a["job_ttft_ms"], 40)
    assert math.isclose(a["request_time_ms"], 100 + 300 + 100 + 50)
    assert math.isclose(a["critical_path_ms"], 100 + 300 + 50)  # r0 -> r1 -> r3
    assert math.isclose(a["hit_rate"], 200 / 400)
    assert not b["ok"] and b["requests"] == 3 and math.isnan(b["job_ms"])  # r5 failed, r6 never sent
    met = job_met(jobs.reset_index(), SLO.parse("job_ms=600,job_ttft_ms=50"))
    assert met.tolist() == [True, False]
    assert job_met(jobs.reset_index(), SLO.parse("job_ms=400")).tolist() == [False, False]
    s = summarize_jobs(jobs.reset_index(), SLO.parse("job_ms=600"))
    assert (s.jobs, s.ok, s.met) == (2, 1, 1) and math.isclose(s.attainment, 0.5)
    assert math.isclose(s.metrics["parallelism"]["mean"], 550 / 450)


def test_gate_judges_job_completion(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two virtual-time runs of the agentic workload, H100 then A100 (slower): a gate on the job
    completion p50 passes the same run and fails the slower one."""
    import subprocess

    from tests.conftest import bench_argv

    def run(gpu: str) -> str:
        out = str(tmp_path / gpu)
        p = subprocess.run(bench_argv("run", "--launch", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", gpu,
                                      "--workload", "agentic", "--rate", "2", "--requests", "120", "--clock",
                                      "virtual", "--out", out, "--no-progress"),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        return out

    fast, slow = run("h100"), run("a100")
    config = tmp_path / "gates.toml"
    config.write_text("[gate]\nresamples = 300\n[metrics.job_p50_ms]\nmax_increase_pct = 5\n")

    def gate(base: str, cur: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(bench_argv("gate", "--baseline", base, "--current", cur, "--config", str(config)),
                              capture_output=True, text=True, timeout=120)

    same = gate(fast, fast)
    assert same.returncode == 0 and "job_p50_ms" in same.stdout, same.stdout + same.stderr
    worse = gate(fast, slow)
    assert worse.returncode == 1 and "job_p50_ms" in worse.stdout, worse.stdout + worse.stderr


def test_a_recommendation_judged_per_job_says_its_units_are_jobs() -> None:
    """Issue 39: a sweep whose SLOs bound jobs judges each load per job, and its rates are jobs per
    second (a session-graph workload's --rate): the text says so instead of leaving "req/s" and
    "% of requests" to mislead."""
    from bench_llm.analysis.recommend_text import format_recommendation
    from bench_llm.analysis.recommend_types import Recommendation

    jobs = format_recommendation(Recommendation.from_json(
        {"slo": {"job_ms": 40000.0}, "attainment_pct": 90.0, "target_rate": 2.0, "message": "none measured"}))
    assert "90% of jobs; target load 2 jobs/s" in jobs and "is jobs per second" in jobs
    requests = format_recommendation(Recommendation.from_json(
        {"slo": {"ttft_ms": 500.0}, "attainment_pct": 90.0, "target_rate": 2.0, "message": "none measured"}))
    assert "90% of requests; target load 2 req/s" in requests and "jobs" not in requests
