"""Session graphs (workloads/graph.py): the formats, their errors, and runs that keep the graph.

The runs' order is checked from the Parquet stamps alone: every request of a job was sent
only after each predecessor ended plus the edge's delay, and its intended send time is the
latest of those instants (truthful schedule lag)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from bench_llm.workloads.catalog import build_named_schedule
from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.graph import read_graph_jsonl
from tests.conftest import bench_argv, run_cli

GRAPH_JSONL = [
    {"job": "a", "node": "plan", "input_tokens": 40, "output_tokens": 6, "offset_s": 0.0},
    {"job": "a", "node": "s1", "after": ["plan"], "delay_s": 0.05, "context": "fresh", "input_tokens": 10,
     "output_tokens": 5},
    {"job": "a", "node": "s2", "after": ["plan"], "delay_s": 0.02, "context": "fresh", "input_tokens": 12,
     "output_tokens": 7},
    {"job": "a", "node": "fin", "after": ["plan", "s1", "s2"], "delay_s": [0.03, 0, 0], "input_tokens": 8,
     "output_tokens": 4},
    {"job": "b", "node": "t0", "input_tokens": 30, "output_tokens": 5, "offset_s": 0.1},
    {"job": "b", "node": "t1", "after": ["t0"], "delay_s": 0.04, "input_tokens": 9, "output_tokens": 5},
]

TEMPLATE = """
name = "fanout"
[prefix]
groups = 1
tokens = 16
[[graph.node]]
id = "plan"
input = { kind = "uniform", low = 20, high = 40 }
output_tokens = 6
[[graph.node]]
id = "sub"
after = ["plan"]
copies = 3
context = "fresh"
input_tokens = 10
output_tokens = 5
[[graph.node]]
id = "sub2"
after = ["sub"]
copies = 3
delay = { kind = "exponential", mean = 0.02 }
input_tokens = 7
output_tokens = 5
[[graph.node]]
id = "join"
after = ["plan", "sub2"]
context = "plan"
delay_s = 0.01
input_tokens = 5
output_tokens = 4
"""


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_template_expands_copies_pairwise_and_joins(tmp_path: Path) -> None:
    wl = tmp_path / "g.toml"
    wl.write_text(TEMPLATE)
    s = build_named_schedule(str(wl), requests=16, rate=1.0, arrival="poisson", concurrency=None, warmup=0, seed=3)
    job = [r for r in s.requests if r.session_id == s.requests[0].session_id]
    assert len(job) == 8 and len(s.requests) == 16
    plan, subs, subs2, join = job[0], job[1:4], job[4:7], job[7]
    assert all(r.after == (plan.request_id,) and r.context_from is None for r in subs)  # fan-out, fresh
    assert [r.after for r in subs2] == [(r.request_id,) for r in subs]  # copy to copy
    assert [r.context_from for r in subs2] == [r.request_id for r in subs]
    assert join.after == (plan.request_id, *(r.request_id for r in subs2)) and join.context_from == plan.request_id
    assert join.after_delay_ns == (10_000_000,) * 4
    # every fresh conversation starts with the system prompt; continuations do not
    assert [r.prefix_group for r in job] == ["p0"] * 4 + [None] * 4
    assert plan.send_offset_ns == 0 and all(r.send_offset_ns is None for r in job[1:])


@pytest.mark.parametrize(("rows", "message"), [
    ([{"job": "a", "node": "x", "output_tokens": 3}], "g.jsonl:1: field 'input_tokens': needed unless 'prompt'"),
    ([{"job": "a", "node": "x", "input_tokens": 3, "output_tokens": 3},
      {"job": "a", "node": "y", "after": ["z"], "input_tokens": 3, "output_tokens": 3}],
     "g.jsonl:2: field 'after': 'z' is not an earlier node of job 'a'"),
    ([{"job": "a", "node": "x", "input_tokens": 3, "output_tokens": 3},
      {"job": "a", "node": "y", "after": ["x"], "delay_s": -1, "input_tokens": 3, "output_tokens": 3}],
     "g.jsonl:2: field 'delay_s': must be 0..3600 s"),
    ([{"job": "a", "node": "x", "input_tokens": 3, "output_tokens": 3},
      {"job": "a", "node": "y", "input_tokens": 3, "output_tokens": 3}],
     "only the first node (the root) may have no predecessors"),
    ([{"job": "a", "node": "x", "input_tokens": 3, "output_tokens": 3, "colour": 1}], "g.jsonl:1: unknown field 'colour'"),
    ([{"job": "a", "node": "x", "input_tokens": 3, "output_tokens": 3},
      {"job": "b", "node": "x", "input_tokens": 3, "output_tokens": 3},
      {"job": "a", "node": "y", "after": ["x"], "input_tokens": 3, "output_tokens": 3}], "g.jsonl:3: field 'job'"),
])
def test_jsonl_errors_name_file_line_field(tmp_path: Path, rows: list[dict[str, object]], message: str) -> None:
    with pytest.raises(WorkloadError, match=None) as err:
        read_graph_jsonl(_write_jsonl(tmp_path / "g.jsonl", rows))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("toml", "message"), [
    ('[[graph.node]]\nid = "a"\ninput_tokens = 5\noutput_tokens = 2\n[[graph.node]]\nid = "b"\nafter = ["c"]\n'
     'input_tokens = 5\noutput_tokens = 2\n', "graph.node[1].after: 'c' is not an earlier node"),
    ('[[graph.node]]\nid = "a"\ninput_tokens = 5\noutput_tokens = 2\n[[graph.node]]\nid = "b"\nafter = ["a"]\n'
     'copies = 65\ninput_tokens = 5\noutput_tokens = 2\n', "graph.node[1].copies: must be 1..64"),
    ('[[graph.node]]\nid = "a"\ninput_tokens = 5\noutput_tokens = 2\n[[graph.node]]\nid = "b"\nafter = ["a"]\n'
     'delay = { kind = "uniform", low = 2.0 }\ninput_tokens = 5\noutput_tokens = 2\n',
     "graph.node[1].delay: kind 'uniform' needs a finite 'high'"),
    ('[[graph.node]]\nid = "a"\ninput_tokens = 5\noutput_tokens = 2\ncolour = 3\n', "unknown key 'graph.node[0].colour'"),
])
def test_toml_errors_are_one_line(tmp_path: Path, toml: str, message: str) -> None:
    wl = tmp_path / "g.toml"
    wl.write_text(toml)
    with pytest.raises(WorkloadError) as err:
        build_named_schedule(str(wl), requests=4, rate=1.0, arrival="poisson", concurrency=None, warmup=0, seed=1)
    assert message in str(err.value) and "\n" not in str(err.value)


def check_graph_order(run: Path, delays: bool = True) -> pd.DataFrame:
    """Every measured request was sent after each predecessor ended (+ its delay), and its
    intended send time is the latest such instant. Returns the joined rows."""
    sched = pq.read_table(run / "schedule.parquet").to_pandas().set_index("request_id")
    rows = pq.read_table(run / "requests").to_pandas().set_index("request_id")
    rows = rows[rows["phase"] == "measure"]
    checked = 0
    for rid, r in rows.iterrows():
        after = list(sched.at[rid, "after"])
        if not after:
            continue
        gaps = list(sched.at[rid, "after_delay_ns"])
        ready = max(int(rows.at[p, "end_ns"]) + (int(d) if delays else 0) for p, d in zip(after, gaps))
        assert int(r["intended_send_ns"]) == ready, rid
        assert int(r["send_ns"]) >= ready, rid
        checked += 1
    assert checked > 0
    return rows.join(sched[["after", "context_from"]])


def test_real_time_run_keeps_the_graph_and_builds_contexts(tmp_path: Path) -> None:
    wl = _write_jsonl(tmp_path / "g.jsonl", GRAPH_JSONL)
    out = tmp_path / "run"
    p = subprocess.run(bench_argv("run", "--workload", str(wl), "--requests", "6", "--sim-itl-ms", "1",
                                  "--sim-ttft-ms", "5", "--out", str(out), "--json", "--no-progress"),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = check_graph_order(out)
    assert rows["ok"].all() and len(rows) == 6
    # a node's prompt: its context's prompt and answer, the other predecessors' answers, its own tokens
    for rid, r in rows.iterrows():
        extra = sum(int(rows.at[q, "completion_tokens"]) for q in r["after"] if q != r["context_from"])
        ctx = r["context_from"]
        base = int(rows.at[ctx, "prompt_tokens"]) + int(rows.at[ctx, "completion_tokens"]) if isinstance(ctx, str) else 0
        assert int(r["prompt_tokens"]) == base + extra + int(r["input_tokens_target"]), rid


def test_agentic_builtin_in_virtual_time_keeps_the_graph(tmp_path: Path) -> None:
    out = tmp_path / "agentic"
    p = run_cli("run", "--launch", "--engine", "sim", "--model", "llama-3.1-8b", "--workload",
                "agentic", "--rate", "0.5", "--requests", "80", "--clock", "virtual", "--out",
                str(out), "--json", "--no-progress", "--slo", "job_ms=30000")
    assert p.returncode == 0, p.stderr
    rows = check_graph_order(out)
    assert rows["ok"].all() and len(rows) == 80
    fanned = rows[rows["after"].map(len) > 1]
    assert len(fanned) > 0  # some jobs joined their sub-agents
    summary = run_cli("summary", str(out), "--json", "--slo", "job_ms=30000")
    jobs = json.loads(summary.stdout)["jobs"]
    assert jobs["ok"] == jobs["jobs"] and jobs["met"] is not None
    assert jobs["metrics"]["parallelism"]["p90"] > 1.0  # sub-agents ran in parallel
    assert 0.3 < jobs["hit_rate"] < 1.0  # the growing contexts were reused by the prefix cache
    report = run_cli("report", str(out), "--out", str(tmp_path / "r.html"), "--slo", "job_ms=30000")
    assert report.returncode == 0, report.stderr
    assert "<h3>Jobs (ms" in (tmp_path / "r.html").read_text(encoding="utf-8")


def test_closed_loop_runs_n_jobs_at_once(tmp_path: Path) -> None:
    """--concurrency 2 with a graph workload: two jobs in flight, a slot's next job starting
    when its whole job ended (virtual time)."""
    out = tmp_path / "closed"
    p = run_cli("run", "--launch", "--engine", "sim", "--model", "llama-3.1-8b", "--workload",
                "agentic", "--concurrency", "2", "--requests", "60", "--clock", "virtual", "--out",
                str(out), "--no-progress")
    assert p.returncode == 0, p.stderr
    rows = check_graph_order(out)
    spans = rows.groupby("session_id").agg(start=("send_ns", "min"), end=("end_ns", "max")).sort_values("start")
    events = sorted([(t, 1) for t in spans["start"]] + [(t, -1) for t in spans["end"]], key=lambda e: (e[0], e[1]))
    active = peak = 0
    for _, step in events:
        active += step
        peak = max(peak, active)
    assert peak == 2 and len(spans) > 4
    # each later job starts the instant an earlier one ended (its slot freed)
    ends = set(spans["end"])
    assert all(s in ends for s in spans["start"].iloc[2:])


def test_the_documented_examples_build(tmp_path: Path) -> None:
    import re

    from tests.conftest import REPO

    text = (REPO / "docs" / "workloads.md").read_text(encoding="utf-8")
    sec = text[text.index("## Session graphs"):]
    (tmp_path / "doc.toml").write_text(re.findall(r"```toml\n(.*?)```", sec, re.S)[0])
    (tmp_path / "doc.jsonl").write_text(re.findall(r"```json\n(.*?)```", sec, re.S)[0])
    a = build_named_schedule(str(tmp_path / "doc.toml"), requests=16, rate=None, arrival="poisson",
                             concurrency=None, warmup=0, seed=1)
    assert len(a.requests) == 16 and a.rate == 0.5 and a.requests[7].after[0] == a.requests[0].request_id
    b = build_named_schedule(str(tmp_path / "doc.jsonl"), requests=5, rate=None, arrival="trace",
                             concurrency=None, warmup=0, seed=1)
    assert [r.send_offset_ns for r in b.requests] == [0, None, None, None, 2_500_000_000]


WEKA_TRACE = {"id": "t1", "models": ["m"], "block_size": 64, "requests": [
    {"t": 0.0, "type": "s", "model": "m", "in": 3000, "out": 100, "hash_ids": [1, 2], "api_time": 2.0},
    {"t": 3.0, "type": "s", "model": "m", "in": 3600, "out": 80, "api_time": 1.5},
    {"t": 5.0, "type": "subagent", "agent_id": "a1", "subagent_type": "explore", "duration_ms": 9000, "requests": [
        {"t": 0.2, "type": "n", "model": "m", "in": 900, "out": 50, "api_time": 1.0},
        {"t": 2.0, "type": "n", "model": "m", "in": 1500, "out": 60, "api_time": 1.0}]},
    {"t": 5.1, "type": "subagent", "agent_id": "a2", "subagent_type": "explore", "requests": [
        {"t": 5.3, "type": "n", "model": "m", "in": 800, "out": 40, "api_time": 1.0}]},
    {"t": 15.0, "type": "s", "model": "m", "in": 4200, "out": 120, "api_time": 2.0},
    {"t": 20.0, "type": "s", "model": "m", "in": 2000, "out": 90, "api_time": 1.0},
]}


def test_weka_trace_becomes_a_job(tmp_path: Path) -> None:
    path = tmp_path / "cc.jsonl"
    path.write_text(json.dumps(WEKA_TRACE) + "\n" + json.dumps(WEKA_TRACE) + "\n")
    s = build_named_schedule(str(path), requests=14, rate=0.5, arrival="poisson", concurrency=None, warmup=0, seed=1)
    job = s.requests[:7]
    assert len(s.requests) == 14 and len({r.session_id for r in s.requests}) == 2
    ids = [r.request_id for r in job]
    # main chain: growth is the new tokens (3600 - 3000 - 100), the recorded gap the delay (3.0 - 2.0)
    assert (job[1].input_tokens, job[1].after, job[1].after_delay_ns, job[1].context_from) == (
        500, (ids[0],), (1_000_000_000,), ids[0])
    # sub-agent a1: fresh after main request 1 (starts 5.0 + 0.2, main 1 ended 4.5), then a chained turn
    assert (job[2].after, job[2].after_delay_ns, job[2].context_from, job[2].input_tokens) == (
        (ids[1],), (700_000_000,), None, 900 - 80)  # (main 1's answer, the sub-agent's task, comes in)
    assert (job[3].after, job[3].context_from, job[3].input_tokens) == ((ids[2],), ids[2], 1500 - 900 - 50)
    # a2's request times are absolute (5.3 >= its start 5.1)
    assert job[4].after_delay_ns == (800_000_000,)
    # the next main request joins both sub-agents, each after the recorded gap from its end
    assert job[5].after == (ids[1], ids[3], ids[4]) and job[5].context_from == ids[1]
    assert job[5].input_tokens == 4200 - 3600 - 80 - 60 - 40  # growth less the sub-agents' answers
    assert job[5].after_delay_ns == (10_500_000_000, 7_000_000_000, 8_700_000_000)
    # a prompt that shrank (compaction) starts a fresh conversation of its whole length
    assert (job[6].context_from, job[6].input_tokens) == (None, 2000 - 120)  # (less main 5's answer, which comes in)
    assert job[4].input_tokens == 800 - 80
    # a grown prompt whose blocks do not start with the previous prompt's: rewritten, fresh
    rewritten = json.loads(json.dumps(WEKA_TRACE))
    rewritten["requests"][1]["hash_ids"] = [7, 2, 3]
    path.write_text(json.dumps(rewritten) + "\n")
    s2 = build_named_schedule(str(path), requests=7, rate=0.5, arrival="poisson", concurrency=None, warmup=0, seed=1)
    assert (s2.requests[1].context_from, s2.requests[1].input_tokens) == (None, 3600 - 100)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda t: t["requests"][1].update({"in": "x"}), "cc.jsonl:1: requests[1]: field 'in': expected an integer"),
    (lambda t: t["requests"][0].update({"type": "q"}), "cc.jsonl:1: requests[0]: field 'type'"),
    (lambda t: t["requests"][2]["requests"][0].pop("t"), "cc.jsonl:1: requests[2].requests[0]: field 't': required"),
    (lambda t: t["requests"].insert(0, t["requests"][2]), "cc.jsonl:1: requests[0]: a sub-agent before the first"),
])
def test_weka_errors_name_line_and_field(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    trace = json.loads(json.dumps(WEKA_TRACE))
    mutate(trace)
    path = tmp_path / "cc.jsonl"
    path.write_text(json.dumps(trace) + "\n")
    with pytest.raises(WorkloadError) as err:
        build_named_schedule(str(path), requests=7, rate=0.5, arrival="poisson", concurrency=None, warmup=0, seed=1)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_weka_replay_keeps_the_graph_in_virtual_time(tmp_path: Path) -> None:
    path = tmp_path / "cc.json"
    path.write_text(json.dumps(WEKA_TRACE))
    out = tmp_path / "weka"
    p = run_cli("run", "--launch", "--engine", "sim", "--model", "llama-3.1-8b", "--workload",
                str(path), "--concurrency", "1", "--requests", "7", "--clock", "virtual", "--out",
                str(out), "--no-progress")
    assert p.returncode == 0, p.stderr
    rows = check_graph_order(out)
    assert rows["ok"].all() and len(rows) == 7
    # the join waited for the slower sub-agent: sent 10.5 s after main request 1 ended
    assert int(rows.at["r000005", "intended_send_ns"]) >= int(rows.at["r000001", "end_ns"]) + 10_500_000_000


def test_a_failed_node_skips_its_descendants_and_fails_its_job(tmp_path: Path) -> None:
    """Real time against the simulated engine with injected HTTP 500s: every scheduled request
    has a row; a failed node's descendants are recorded unsent (``skipped_turn``), its other
    requests still run, and its job counts as failed."""
    from bench_llm.analysis.jobs import job_summary
    from bench_llm.sim.faults import FaultSpec
    from bench_llm.sim.server import ServerConfig
    from bench_llm.sim.timing import FixedTiming
    from tests.sim_helpers import run_against

    wl = tmp_path / "g.toml"
    wl.write_text(TEMPLATE)
    sched = build_named_schedule(str(wl), requests=24, rate=20.0, arrival="poisson", concurrency=None, warmup=0,
                                 seed=5)
    cfg = ServerConfig(timing=FixedTiming(0.005, 0.001), faults=FaultSpec.parse("http500=0.25"), seed=3)
    rows = {r["request_id"]: r for r in run_against(cfg, sched, tmp_path)}
    assert set(rows) == {s.request_id for s in sched.requests}
    failed = {rid for rid, r in rows.items() if r["error_type"] == "http_error"}
    skipped = {rid for rid, r in rows.items() if r["error_type"] == "skipped_turn"}
    assert failed and skipped, (failed, skipped)
    by_id = {s.request_id: s for s in sched.requests}
    for rid in skipped:  # never sent, and some predecessor failed or was skipped
        assert rows[rid]["send_ns"] is None
        assert any(p in failed | skipped for p in by_id[rid].after)
    for rid, r in rows.items():  # nothing was sent after a failed predecessor
        if r["send_ns"] is not None:
            assert not any(p in failed | skipped for p in by_id[rid].after), rid
    jobs = job_summary(tmp_path / "run")
    bad_jobs = {by_id[rid].session_id for rid in failed}
    assert jobs is not None and jobs.jobs == 3 and jobs.ok == 3 - len(bad_jobs)
