"""A virtual-time sweep's cells in several processes (``bench sweep --jobs``, bench/sweep/parallel.py):
the files and the printed lines are those of ``--jobs 1``; a cell whose process dies is a
failed cell and --resume reruns it; Ctrl-C stops the cells' processes, bounded; a sweep in
real time refuses more than one job.

Small sweeps of the simulated engine in virtual time (a few seconds each on two shared cores).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench_llm.bench.sweep import parallel
from bench_llm.bench.sweep.orchestrate import run_sweep
from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec, WorkloadSpec
from bench_llm.bench.sweep.store import read_cells
from bench_llm.core.errors import BenchError, SettingError
from tests.conftest import REPO

#: Three cells (tp1, tp2, tp4 of 8B), each a capacity search: cells that take different times.
ARGS = [
    "sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100", "--gpus", "4", "--tp", "1,2,4",
    "--capacity", "--slo", "ttft_ms=200,tpot_ms=30", "--requests", "200", "--max-requests", "400",
    "--precision", "0.1", "--input-tokens", "64", "--output-tokens", "8", "--no-progress",
]  # fmt: skip

#: What may differ between two computations of one sweep: when and where it ran (docs/sweeps.md).
WALL_CLOCK = {
    "run.parquet": {"start_utc", "end_utc", "t0_unix_ns", "notes_json", "host_json"},
    "cells.parquet": {"started_unix_s", "ended_unix_s", "fingerprint"},
}


def _bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench_llm.bench", *args], check=False, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def _files(root: Path) -> dict[str, Path]:
    return {str(p.relative_to(root)): p for p in root.rglob("*") if p.is_file()}


def _assert_same_sweep(a: Path, b: Path) -> None:
    """Every file of ``a`` and ``b`` byte-identical, but for their wall-clock fields."""
    fa, fb = _files(a), _files(b)
    assert sorted(fa) == sorted(fb)
    for rel, pa_ in fa.items():
        if pa_.read_bytes() == fb[rel].read_bytes():
            continue
        name = pa_.name
        if name in WALL_CLOCK:
            ta, tb = pq.read_table(pa_), pq.read_table(fb[rel])
            assert ta.schema == tb.schema, rel
            differ = {c for c in ta.column_names if not ta.column(c).equals(tb.column(c))}
            assert differ <= WALL_CLOCK[name], (rel, differ - WALL_CLOCK[name])
            if "notes_json" in differ:
                na, nb = (json.loads(t.column("notes_json")[0].as_py()) for t in (ta, tb))
                na.pop("wall_s", None), nb.pop("wall_s", None)
                assert na == nb, rel
        elif name == "sweep.json":
            ja, jb = json.loads(pa_.read_text()), json.loads(fb[rel].read_text())
            for k in ("command", "created_unix_s", "updated_unix_s"):
                ja.pop(k), jb.pop(k)
            assert ja == jb
        elif name == "recommendation.json":
            ja, jb = json.loads(pa_.read_text()), json.loads(fb[rel].read_text())
            ja.pop("sweep"), jb.pop("sweep")  # the folder's path
            assert ja == jb
        else:
            raise AssertionError(f"{rel} differs")


def _lines(text: str, out: Path) -> list[str]:
    """The printed lines without what the host's speed decides (seconds taken) or the folder."""
    text = text.replace(str(out), "OUT")
    return [re.sub(r"\(\d+(\.\d+)? s\)|ready after [\d.]+ s|finished in \d+ s", "", ln) for ln in text.splitlines()]


def test_two_jobs_give_the_files_and_lines_of_one(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    r1 = _bench(*ARGS, "--jobs", "1", "--out", str(one))
    r2 = _bench(*ARGS, "--jobs", "2", "--out", str(two))
    assert r1.returncode == 0, r1.stderr[-3000:]
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert {c["status"] for c in read_cells(two)} == {"complete"} and len(read_cells(two)) == 3
    _assert_same_sweep(one, two)
    # the cells' lines in the plan's order, whichever finished first
    assert _lines(r2.stderr, two) == _lines(r1.stderr, one)
    assert _lines(r2.stdout, two) == _lines(r1.stdout, one)
    starts = [ln.split()[1] for ln in r2.stderr.splitlines() if ln.endswith("starting sim...")]
    assert starts == ["tp1", "tp2", "tp4"]


def _spec(tp: tuple[int, ...] = (1, 2)) -> SweepSpec:
    return SweepSpec(
        model="llama-3.1-8b",
        gpu="h100",
        gpus=4,
        matrix=MatrixSpec(tp=tp),
        loads=LoadSpec(rates=(4.0, 8.0), requests=60, warmup=0),
        workloads=(WorkloadSpec(input_tokens=64, output_tokens=8),),
        slo={"ttft_ms": 300.0},
    )


_METHOD_PROBE = """
import multiprocessing, sys
import pyarrow as pa, pyarrow.parquet as pq
from bench_llm.bench.sweep import parallel
from tests.bench.test_sweep_parallel import _spec
seen = [parallel.start_method()]
parallel.fork_point(_spec(), 1)
seen.append(parallel.start_method())
parallel.fork_point(_spec(), 2)
seen.append(parallel.start_method())
pq.write_table(pa.table({"a": list(range(1000))}), sys.argv[1])
seen.append(parallel.start_method())
child = multiprocessing.get_context("fork").Process(target=print, args=("",))
child.start(), child.join()  # numpy's BLAS stops its thread at a fork: fewer threads is fine
seen.append(parallel.start_method())
pq.read_table(sys.argv[1])
seen.append(parallel.start_method())
print(" ".join(seen))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forking the sweep's process is Linux-only")
def test_a_new_sweeps_cells_are_forks_of_it_until_it_starts_a_thread(tmp_path: Path) -> None:
    """The cells' processes are forks of the sweep's own process only from ``fork_point`` on
    (its imports done, more than one job), and only while it has started no thread since: a
    Parquet write starts none, nor does a fork, a read starts Arrow's pools, and from then on the cells come
    from the fork server. (The CLI test above runs the forked path; the tests below, calling
    run_sweep in pytest's process, the fork server's.)"""
    r = subprocess.run([sys.executable, "-c", _METHOD_PROBE, str(tmp_path / "t.parquet")], cwd=REPO,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["forkserver", "forkserver", "fork", "fork", "fork", "forkserver"]


def dies_in_tp2(conn, ctx, task) -> None:  # type: ignore[no-untyped-def]
    """A cell process that dies, killed, in cell tp2 (after printing a line); tp1 runs as usual."""
    if task.cell_id == "tp2":
        conn.send(("line", f"{task.index} tp2: about to die"))
        os.kill(os.getpid(), signal.SIGKILL)
    parallel.run_cell(conn, ctx, task)


def test_a_dead_cell_process_is_a_failed_cell_and_resume_reruns_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "s"
    lines: list[str] = []
    monkeypatch.setattr(parallel, "WORKER", dies_in_tp2)
    res = run_sweep(_spec(), out, echo=lines.append, jobs=2)
    cells = {c["cell_id"]: c for c in read_cells(out)}
    assert cells["tp1"]["status"] == "complete" and cells["tp1"]["capacity_rps"] is not None
    assert cells["tp2"]["status"] == "failed"
    assert "process died (killed by SIGKILL)" in cells["tp2"]["reason"]
    assert "about to die" in cells["tp2"]["log_tail"]
    assert res.failed == ("tp2",) and not res.interrupted
    assert any("tp2: FAILED: the cell's process died" in ln for ln in lines)

    monkeypatch.setattr(parallel, "WORKER", parallel.run_cell)
    again = run_sweep(_spec(), out, resume=True, retry_failed=True, echo=lines.append, jobs=2)
    assert again.ran == ("tp2",) and again.reused == ("tp1",)
    assert {c["cell_id"]: c["status"] for c in read_cells(out)} == {"tp1": "complete", "tp2": "complete"}
    # the resumed sweep's cells are the cells of a sweep run in one process from the start
    ref = tmp_path / "ref"
    run_sweep(_spec(), ref, echo=lambda _: None, jobs=1)
    for cell in ("cell=tp1", "cell=tp2"):
        assert (out / cell / "points.parquet").read_bytes() == (ref / cell / "points.parquet").read_bytes()


def raises_in_tp2(conn, ctx, task) -> None:  # type: ignore[no-untyped-def]
    """A cell process whose cell raises an input error in tp2, as a cell's code may."""
    from bench_llm.bench.sweep.cell import CellRunner

    def run(self, cfg, cell_id, index, prior=None):  # type: ignore[no-untyped-def]
        raise BenchError(f"{cell_id} cannot be modelled")

    if task.cell_id == "tp2":
        CellRunner.run = run  # this process only
    parallel.run_cell(conn, ctx, task)


def test_an_error_raised_in_a_cell_process_stops_the_sweep_as_in_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel, "WORKER", raises_in_tp2)
    with pytest.raises(BenchError, match="tp2 cannot be modelled"):
        run_sweep(_spec(), tmp_path / "s", echo=lambda _: None, jobs=2)
    cells = {c["cell_id"]: c for c in read_cells(tmp_path / "s")}
    assert cells["tp2"]["status"] == "running" and cells["tp2"]["reason"] is None  # as one process leaves it
    assert cells["tp1"]["status"] in ("running", "complete")  # stopped, or finished before


def test_a_sweep_in_real_time_runs_one_cell_at_a_time(tmp_path: Path) -> None:
    with pytest.raises(SettingError, match=r"jobs 2: a sweep in real time runs one cell at a time"):
        run_sweep(replace(_spec(), clock="auto"), tmp_path / "rt", jobs=2)
    assert not (tmp_path / "rt").exists()  # refused before anything was written
    r = _bench("sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--tp", "1,2", "--rate", "2", "--clock", "auto",
               "--jobs", "2", "--out", str(tmp_path / "cli"))  # fmt: skip
    assert r.returncode == 2 and r.stderr.startswith("error: --jobs 2: a sweep in real time"), r.stderr
    assert parallel.worker_count(None, 3, virtual=False) == 1
    assert parallel.worker_count(None, 1, virtual=True) == 1  # never more processes than cells
    assert parallel.worker_count(8, 3, virtual=True) == 3


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_ctrl_c_stops_every_cell_process_and_resume_finishes(tmp_path: Path) -> None:
    out = tmp_path / "int"
    # more requests per load than above: the cells are still running when Ctrl-C comes
    args = [*ARGS, "--requests", "2000", "--max-requests", "4000", "--jobs", "2", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "bench_llm.bench", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not list(out.glob("cell=*/load=*/run.parquet")):
            assert proc.poll() is None and time.monotonic() < deadline, "no load finished"
            time.sleep(0.05)
        t = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
        _, err = proc.communicate(timeout=60)
        stopped_in = time.monotonic() - t
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 130, err[-3000:]
    assert "bench sweep --resume --out" in err
    assert stopped_in < parallel.STOP_TIMEOUT_S + 20
    deadline = time.monotonic() + 20
    while not _group_gone(proc.pid):  # the cells' processes and the fork server are gone too
        assert time.monotonic() < deadline, "a process of the sweep outlived it"
        time.sleep(0.05)
    statuses = {c["cell_id"]: c["status"] for c in read_cells(out)}
    assert "running" in statuses.values() and set(statuses.values()) <= {"running", "complete"}

    again = _bench("sweep", "--resume", "--out", str(out), "--no-progress", "--jobs", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert {c["cell_id"]: c["status"] for c in read_cells(out)} == {"tp1": "complete", "tp2": "complete", "tp4": "complete"}
