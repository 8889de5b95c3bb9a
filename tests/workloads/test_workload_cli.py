"""`bench workload show|list` and `bench run --workload` end to end on the embedded engine."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pyarrow.parquet as pq

from tests.conftest import bench_argv


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(bench_argv(*args), capture_output=True, text=True, timeout=timeout)


def test_run_named_workload_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = _run(
        "run", "--workload", "chat", "--rate", "20", "--requests", "12", "--sim-itl-ms", "1", "--sim-ttft-ms", "5",
        "--out", str(out), "--json", "--no-progress",
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["requests"]["ok"] == 12
    rows = pq.read_table(out / "requests").to_pandas()
    assert (rows["prompt_tokens"] == rows["input_tokens_target"]).all()  # exact lengths on the simulated engine
    sched = pq.read_table(out / "schedule.parquet").to_pandas()
    assert len(sched) == 12 and (sched["input_tokens_source"] == "approx").all()


def test_run_rejects_nonsense_in_one_line(tmp_path: Path) -> None:
    p = _run("run", "--workload", "chat", "--rate", "-2", "--out", str(tmp_path / "x"), "--no-progress")
    assert p.returncode != 0
    err = p.stderr.strip()
    assert "positive" in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_show_prints_stats_and_writes_html(tmp_path: Path) -> None:
    html = tmp_path / "w.html"
    p = _run("workload", "show", "long-short-mix", "--requests", "2000", "--rate", "3", "--html", str(html))
    assert p.returncode == 0, p.stderr
    assert "input tokens" in p.stdout and "inter-arrival CV" in p.stdout
    text = html.read_text()
    assert "plotly" in text.lower() and "arrivals per second" in text
    j = _run("workload", "show", "code", "--json", "--no-html", "--concurrency", "2")
    s = json.loads(j.stdout)
    assert s["mode"] == "closed" and s["requests"] == 1000 and s["input_tokens"]["p50"] > 1000


def test_show_a_trace_and_list(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n10,2,0.0\n20,3,0.5\n30,4,2.0\n")
    p = _run("workload", "show", str(f), "--no-html")
    assert p.returncode == 0, p.stderr
    assert "arrival trace" in p.stdout and "3 send times" in p.stdout
    bad = tmp_path / "bad.csv"
    bad.write_text("num_prefill_tokens,num_decode_tokens\n10,x\n")
    q = _run("workload", "show", str(bad), "--no-html")
    assert q.returncode != 0 and f"{bad}:2: field 'num_decode_tokens'" in q.stderr
    ls = _run("workload", "list")
    assert "long-context" in ls.stdout and "Apache-2.0" in ls.stdout


def test_multi_turn_sessions_carry_history(tmp_path: Path) -> None:
    out = tmp_path / "mt"
    wl = tmp_path / "mt.toml"
    wl.write_text(
        '[lengths]\ninput = { kind = "uniform", low = 20, high = 60 }\noutput = { kind = "fixed", value = 8 }\n'
        "[sessions]\nturns_min = 2\nturns_max = 3\nthink_time_s = 0.05\n"
    )
    p = _run(
        "run", "--workload", str(wl), "--rate", "10", "--requests", "8", "--sim-itl-ms", "1", "--sim-ttft-ms", "5",
        "--out", str(out), "--json", "--no-progress",
    )
    assert p.returncode == 0, p.stderr
    rows = pq.read_table(out / "requests").to_pandas()
    assert rows["ok"].all() and len(rows) == 8
    later = rows[rows["turn"] > 0]
    assert len(later) > 0
    # later turns carry the real history: the engine sees more than the new message
    assert (later["prompt_tokens"] > later["input_tokens_target"]).all()
    first = rows[rows["turn"] == 0].set_index("session_id")
    for _, r in later.iterrows():
        assert r["send_ns"] >= first.loc[r["session_id"], "end_ns"]
