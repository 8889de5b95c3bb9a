"""A cell's repeat capacity searches side by side in worker processes
(bench/sweep/repeat_workers.py): the same capacities and files as one after the other, and a
pool that ends cleanly on Ctrl-C, on a search that raises and on a worker that dies."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from bench_llm.bench.sweep import repeat_workers
from bench_llm.bench.sweep.orchestrate import run_sweep
from bench_llm.bench.sweep.repeat_workers import Found, RepeatWorkers, worker_count
from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec
from bench_llm.bench.sweep.store import read_cells

TAG = "in128-out16"


def _spec(repeats: int = 2) -> SweepSpec:
    """The README job's TP2 cell with coarser probes (a 10 % bracket, 400 requests a probe):
    the same search, a third of its CPU."""
    return SweepSpec(
        engine="sim", model="llama-3.1-70b", gpu="h100", gpus=2, clock="virtual",
        matrix=MatrixSpec(tp=(2,), input_tokens=(128,), output_tokens=(16,)),
        engine_args=("--max-num-seqs=8",), slo={"ttft_ms": 300.0, "tpot_ms": 40.0},
        loads=LoadSpec(capacity=True, requests=400, max_requests=1600, capacity_precision=0.1,
                       capacity_max_probes=8, capacity_repeats=repeats),
    )  # fmt: skip


def _capacity(out: Path) -> dict:
    return dict(json.loads(read_cells(out)[0]["capacity_json"])[TAG])


def test_repeat_searches_in_workers_give_the_serial_capacities_and_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    used: list[int] = []
    real_run = RepeatWorkers.run

    def spy(self: RepeatWorkers, subs: list, tag: str) -> list[Found]:
        used.append(self.count)
        return real_run(self, subs, tag)

    monkeypatch.setattr(RepeatWorkers, "run", spy)
    serial = run_sweep(_spec(), tmp_path / "serial", echo=lambda _: None, jobs=1)
    assert used == []  # --jobs 1: one process, the repeats one after the other
    side = run_sweep(_spec(), tmp_path / "side", echo=lambda _: None, jobs=2)
    assert used == [2]  # one cell: the sweep's own process ran its two repeats in two workers
    assert serial.ran == side.ran == ("tp2",)
    a, b = _capacity(tmp_path / "serial"), _capacity(tmp_path / "side")
    assert a["repeats"]["capacities"] and None not in a["repeats"]["capacities"]
    assert a == b  # capacities, the seeds' interval and every other field, bit for bit
    for k in (1, 2):  # each repeat's points, byte for byte
        name = f"cell=tp2/repeat-{k}-points.parquet"
        assert (tmp_path / "serial" / name).read_bytes() == (tmp_path / "side" / name).read_bytes()


def test_how_many_workers() -> None:
    spec = _spec(repeats=2)
    assert worker_count(spec, 1) == 0  # --jobs 1: in-process
    assert worker_count(spec, 8) == 2  # never more than the repeats
    assert worker_count(_spec(repeats=1), 8) == 0  # one repeat: nothing to run beside it
    assert worker_count(_spec(repeats=0), 8) == 0
    from dataclasses import replace

    assert worker_count(replace(spec, clock="auto"), 8) == 0  # real time: repeats would measure each other


class _Sleeps:
    def capacity_search(self) -> bool:
        time.sleep(600)
        return True


class _Raises:
    def capacity_search(self) -> bool:
        raise ValueError("loads.requests: a search that cannot run")


class _Dies:
    def capacity_search(self) -> bool:
        os._exit(3)


class _Finds:
    def __init__(self, cap: float) -> None:
        self.cap = cap
        self.out = self

    @property
    def status(self) -> str:
        return "complete"

    reason = log_tail = None

    @property
    def capacity(self) -> dict:
        from types import SimpleNamespace

        return {TAG: SimpleNamespace(capacity_rps=self.cap)}

    def capacity_search(self) -> bool:
        return True


def test_answers_come_back_in_order_with_more_searches_than_workers() -> None:
    pool = RepeatWorkers(2, "fork")
    try:
        found = pool.run([_Finds(float(c)) for c in (3, 1, 2)], TAG)
    finally:
        pool.close()
    assert [f.capacity_rps for f in found] == [3.0, 1.0, 2.0] and all(f.ok for f in found)


def test_a_search_that_raises_raises_in_the_cell_and_the_workers_end() -> None:
    pool = RepeatWorkers(2, "fork")
    procs = list(pool.procs)
    with pytest.raises(ValueError, match="a search that cannot run"):
        pool.run([_Finds(1.0), _Raises()], TAG)
    assert not any(p.is_alive() for p in procs)


def test_a_worker_that_dies_fails_its_search() -> None:
    pool = RepeatWorkers(2, "fork")
    try:
        found = pool.run([_Finds(1.0), _Dies()], TAG)
    finally:
        pool.close()
    assert found[0].ok and not found[1].ok and found[1].status == "failed"
    assert "exit code 3" in (found[1].reason or "")


def test_ctrl_c_kills_the_workers_and_reaches_the_cell() -> None:
    """The workers ignore SIGINT (the terminal sends it to them too); the cell's process, which
    waits for them, is interrupted and ends them."""
    pool = RepeatWorkers(2, "fork")
    procs = list(pool.procs)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.run([_Sleeps(), _Sleeps()], TAG)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert not any(p.is_alive() for p in procs)
    assert repeat_workers.current() is None
