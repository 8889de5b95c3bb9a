"""Splitting one schedule over worker processes: by send time, sessions whole."""

from __future__ import annotations

import pytest

from bench_llm.loadgen.split import split_concurrency, split_schedule
from bench_llm.workloads.spec import RequestSpec, Schedule


def _spec(rid: str, offset: int | None = None, session: str | None = None, turn: int = 0, phase: str = "measure") -> RequestSpec:
    return RequestSpec(rid, 1, 1, prompt="p", send_offset_ns=offset, session_id=session, turn=turn, phase=phase)  # type: ignore[arg-type]


def test_open_loop_goes_round_robin_in_time_order() -> None:
    # listed out of time order on purpose
    specs = tuple(_spec(f"r{i}", offset=o) for i, o in enumerate([30, 10, 20, 0, 50, 40]))
    warm = (_spec("w0", phase="warmup"),)
    sched = Schedule("s", 0, "open", warm + specs, rate=6.0)
    parts = split_schedule(sched, 2)
    assert [s.request_id for s in parts[0].measured] == ["r3", "r2", "r5"]  # offsets 0, 20, 40
    assert [s.request_id for s in parts[1].measured] == ["r1", "r0", "r4"]  # offsets 10, 30, 50
    assert [s.request_id for s in parts[0].warmup] == ["w0"] and not parts[1].warmup
    assert parts[0].rate == pytest.approx(3.0)


def test_sessions_stay_whole_and_concurrency_is_divided() -> None:
    specs = (
        _spec("a0", session="a", turn=0),
        _spec("b0", session="b", turn=0),
        _spec("a1", session="a", turn=1),
        _spec("c", None),
        _spec("b1", session="b", turn=1),
    )
    sched = Schedule("s", 0, "closed", specs, concurrency=5)
    parts = split_schedule(sched, 2)
    assert [p.concurrency for p in parts] == [3, 2]
    ids = [{s.request_id for s in p.measured} for p in parts]
    assert ids[0] == {"a0", "a1", "c"} and ids[1] == {"b0", "b1"}
    assert sorted(r for p in parts for r in (s.request_id for s in p.requests)) == sorted(s.request_id for s in specs)


def test_fewer_slots_than_workers_leaves_extra_workers_idle() -> None:
    sched = Schedule("s", 0, "closed", tuple(_spec(f"r{i}") for i in range(4)), concurrency=1)
    parts = split_schedule(sched, 3)
    assert len(parts[0].measured) == 4 and not parts[1].measured and not parts[2].measured
    assert split_concurrency(7, 3) == [3, 2, 2]
    with pytest.raises(ValueError):
        split_schedule(sched, 0)
