"""``--workers N``: one schedule, N processes, one run folder, rows merged."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench_llm.analysis.load import load_run
from tests.conftest import REPO, bench_argv


def test_two_workers_write_one_dataset_with_worker_ids(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = bench_argv(
        "run", "--concurrency", "4", "--requests", "16", "--warmup", "2", "--output-tokens", "6",
        "--input-tokens", "8", "--sim-ttft-ms", "5", "--sim-itl-ms", "2", "--workers", "2",
        "--clock", "kernel", "--out", str(out), "--no-progress", "--json",
    )
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["requests"]["measured"] == 16 and summary["requests"]["ok"] == 16
    run = load_run(out)
    rows = run.requests.to_pylist()
    assert len(rows) == 18  # 16 measured + 2 warm-up
    by_worker = {w: [r for r in rows if r["worker_id"] == w and r["phase"] == "measure"] for w in (0, 1)}
    assert len(by_worker[0]) == 8 and len(by_worker[1]) == 8
    assert all(r["phase"] == "measure" for r in rows if r["worker_id"] == 1)  # warm-up stays on worker 0
    parts = sorted(p.name for p in (out / "requests").glob("*.parquet"))
    assert any(p.startswith("part-000-") for p in parts) and any(p.startswith("part-001-") for p in parts)
    assert run.meta["status"] == "complete" and run.meta["adapter"]["workers"] == 2
    assert run.meta["clock"].split(":")[0] in ("kernel", "user")
    assert run.monitor is not None and set(run.monitor["worker_id"].to_pylist()) == {0, 1}
    # both workers started their measured share at the same t0
    first = [min(r["send_ns"] for r in by_worker[w]) for w in (0, 1)]
    assert abs(first[0] - first[1]) < 100e6
