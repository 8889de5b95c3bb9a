"""Runner behaviour issue 8 changed: slot turnover, deferred recording, sessions, t0."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.analysis.load import load_run
from bench_llm.bench.execute import RunConfig, execute_run
from bench_llm.loadgen.recorder import QUEUE_AFTER, DigestQueue, RequestRecorder
from bench_llm.loadgen.runner import RunOptions
from bench_llm.sim.server import ServerConfig, create_app, serve_in_process
from bench_llm.sim.timing import FixedTiming
from bench_llm.workloads.spec import Message, RequestSpec, Schedule


def _run(tmp_path: Path, sched: Schedule, options: RunOptions = RunOptions(progress=False), clock: str = "auto") -> Path:
    async def main() -> Path:
        cfg_s = ServerConfig(timing=FixedTiming(0.005, 0.001))
        async with serve_in_process(create_app(cfg_s)) as url:
            cfg = RunConfig(out=tmp_path / "run", url=url, engine="sim", model="sim-model", schedule=sched,
                            options=options, transport="raw", clock=clock)
            res = await execute_run(cfg, OpenAIAdapter(model="sim-model", api="chat"), install_signals=False)
            return res.run_dir

    return asyncio.run(main())


@pytest.mark.parametrize("clock", ["user", "kernel"])
def test_closed_loop_slot_intends_next_send_when_the_previous_end_was_read(tmp_path: Path, clock: str) -> None:
    specs = tuple(RequestSpec(f"r{i}", 4, 4, prompt="p") for i in range(6))
    rows = load_run(_run(tmp_path, Schedule("c", 0, "closed", specs, concurrency=1), clock=clock)).requests.to_pylist()
    rows.sort(key=lambda r: r["send_ns"])
    assert all(r["ok"] for r in rows) and len(rows) == 6
    for prev, nxt in zip(rows, rows[1:]):
        # the slot was free once the client read the end (the end's stamp, or with the kernel
        # clock the kernel's receipt of it, comes first)
        assert prev["end_ns"] <= nxt["intended_send_ns"] <= prev["end_ns"] + 50_000_000
        assert nxt["send_ns"] >= nxt["intended_send_ns"]
        assert prev["end_ns"] >= prev["chunk_ns"][-1]  # end = the last read (the [DONE] may follow)


def test_a_freed_slot_counts_from_the_read_not_from_the_stamp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The intended send of a slot's next request is the moment the client read the end
    (the runner's clock), not the end's data stamp (with the kernel clock, the kernel's
    earlier receipt): here the runner's clock runs 20 ms ahead of the stamps, and the
    intended sends follow the runner's clock."""
    from bench_llm.loadgen import dispatch as runner_mod  # the clock of the dispatch side

    monkeypatch.setattr(runner_mod, "_now", lambda: time.perf_counter_ns() + 20_000_000)
    specs = tuple(RequestSpec(f"r{i}", 4, 4, prompt="p") for i in range(6))
    rows = load_run(_run(tmp_path, Schedule("c", 0, "closed", specs, concurrency=1))).requests.to_pylist()
    rows.sort(key=lambda r: r["send_ns"])
    assert all(r["ok"] for r in rows) and len(rows) == 6
    assert all(n["intended_send_ns"] - p["end_ns"] >= 20_000_000 for p, n in zip(rows, rows[1:]))


def test_sessions_still_carry_their_history(tmp_path: Path) -> None:
    turns = tuple(
        RequestSpec(f"s-{t}", 4, 3, messages=(Message("user", f"turn {t} " + "w " * 20),), session_id="s", turn=t,
                    think_time_ns=1_000_000)
        for t in range(3)
    )
    rows = load_run(_run(tmp_path, Schedule("s", 0, "closed", turns, concurrency=1))).requests.to_pylist()
    rows.sort(key=lambda r: r["turn"])
    assert [r["turn"] for r in rows] == [0, 1, 2] and all(r["ok"] for r in rows)
    prompts = [r["prompt_tokens"] for r in rows]
    assert prompts[0] < prompts[1] < prompts[2]  # earlier turns and answers were prepended
    for prev, nxt in zip(rows, rows[1:]):
        assert nxt["intended_send_ns"] == prev["end_ns"] + 1_000_000


def test_start_at_ns_sets_t0(tmp_path: Path) -> None:
    t0 = time.perf_counter_ns() + 300_000_000
    specs = tuple(RequestSpec(f"r{i}", 4, 2, prompt="p", send_offset_ns=i * 1_000_000) for i in range(3))
    run = load_run(_run(tmp_path, Schedule("o", 0, "open", specs, rate=100.0), RunOptions(progress=False, start_at_ns=t0)))
    rows = run.requests.to_pylist()
    assert sorted(r["intended_send_ns"] - t0 for r in rows) == [0, 1_000_000, 2_000_000]
    assert run.meta["notes"]["t0_ns"] == t0


def test_digest_queue_parses_in_batches_after_the_reads() -> None:
    scheduled: list[object] = []
    queue = DigestQueue(scheduled.append)
    recs = [RequestRecorder(RequestSpec(f"r{i}", 1, 2, prompt="p"), OpenAIAdapter().parser(), 0, 0, queue=queue) for i in range(3)]
    chunk = b'data: {"choices":[{"text":"a"}],"usage":{"completion_tokens":%d}}\n\n'
    for k in range(QUEUE_AFTER):
        for i, r in enumerate(recs):
            if k == 0:
                r.headers(1, 200)
            r.data(10 * k + i, chunk % (k + 1))
        if k < QUEUE_AFTER - 1:
            assert scheduled == []  # below the batch size: nothing queued, nothing parsed
    assert len(scheduled) == 1  # one drain for the whole iteration
    assert all(r._events == [] for r in recs)  # nothing parsed on the read path
    queue.drain()  # BATCH streams per loop iteration; the rest in later ones
    assert sum(bool(r._ts) for r in recs) == DigestQueue.BATCH and len(scheduled) == 2
    while len(scheduled) > 1:
        scheduled.pop()
        queue.drain()
    assert [r._ts for r in recs] == [[10 * k + i for k in range(QUEUE_AFTER)] for i in range(3)]
    recs[0].data(1000, b'data: {"choices":[{"text":"b","finish_reason":"length"}],"usage":{"completion_tokens":%d}}\n\ndata: [DONE]\n\n' % (QUEUE_AFTER + 1))
    rec = recs[0].finish(2000)  # finish digests whatever is left
    assert rec.ok and rec.chunk_ns[-2:] == [10 * (QUEUE_AFTER - 1), 1000] and rec.chunk_tokens == [1] * (QUEUE_AFTER + 1)


def test_a_freed_slot_sends_from_the_completing_read(tmp_path: Path, monkeypatch: object) -> None:
    """A closed-loop slot's next request goes out from inside the read that completed the
    previous one (``RawHttpTransport.start``), and every request is recorded exactly once."""
    from bench_llm.loadgen import rawhttp

    started = []
    orig = rawhttp.RawHttpTransport.start

    def spy(self: rawhttp.RawHttpTransport, *args: object, **kw: object) -> object:
        ex = orig(self, *args, **kw)  # type: ignore[arg-type]
        started.append(ex is not None)
        return ex

    monkeypatch.setattr(rawhttp.RawHttpTransport, "start", spy)  # type: ignore[attr-defined]
    specs = tuple(RequestSpec(f"r{i}", 4, 4, prompt="p") for i in range(24))
    run = load_run(_run(tmp_path, Schedule("c", 0, "closed", specs, concurrency=4)))
    rows = run.requests.to_pylist()
    assert sorted(r["request_id"] for r in rows) == sorted(s.request_id for s in specs)
    assert all(r["ok"] for r in rows)
    assert sum(started) >= 10  # 20 sends follow a completion; most find the freed connection idle
    notes = json.loads(run.meta["notes_json"]) if isinstance(run.meta["notes_json"], str) else run.meta["notes_json"]
    assert notes["sent"] == notes["completed"] == 24


def test_a_stopped_closed_loop_records_what_freed_slots_sent(tmp_path: Path) -> None:
    """Stopping at the duration's end (drain timeout 0) cancels the slots: requests their
    completing reads had already sent are recorded (as cancelled), never lost."""
    specs = tuple(RequestSpec(f"r{i}", 4, 40, prompt="p") for i in range(400))
    options = RunOptions(progress=False, duration_s=0.3, drain_timeout_s=0.0)
    run = load_run(_run(tmp_path, Schedule("c", 0, "closed", specs, concurrency=8), options))
    rows = run.requests.to_pylist()
    notes = json.loads(run.meta["notes_json"]) if isinstance(run.meta["notes_json"], str) else run.meta["notes_json"]
    assert len(rows) == notes["sent"] == notes["completed"] + notes["failed"] + notes["cancelled"]
    assert len({r["request_id"] for r in rows}) == len(rows)


def _storm(tmp_path: Path, n: int) -> list[dict[str, object]]:
    """``n`` requests, closed loop of 16, against a port nobody listens on: every one fails
    at once (connection refused). Returns the recorded rows."""
    from bench_llm.launch.process import free_port

    specs = tuple(RequestSpec(f"r{i}", 4, 4, prompt="p") for i in range(n))

    async def main() -> Path:
        cfg = RunConfig(out=tmp_path / "run", url=f"http://127.0.0.1:{free_port()}", engine="sim", model="sim-model",
                        schedule=Schedule("c", 0, "closed", specs, concurrency=16),
                        options=RunOptions(progress=False), transport="raw")
        res = await execute_run(cfg, OpenAIAdapter(model="sim-model", api="chat"), install_signals=False)
        return res.run_dir

    rows: list[dict[str, object]] = load_run(asyncio.run(main())).requests.to_pylist()
    return rows


def test_a_failure_storm_keeps_the_recording_backlog_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A closed loop against a port nobody listens on fails every request at once, faster
    than the per-iteration budget records them: the backlog of ended requests waiting to
    be recorded (and the memory it holds) stays bounded, and every request is recorded."""
    from bench_llm.loadgen.recording import Recording

    monkeypatch.setattr(Recording, "FINISH_BACKLOG_MAX", 64)
    waiting: list[int] = []
    real = Recording.finish

    def spy(self: Recording, recorder: RequestRecorder, end: int, error: object) -> object:
        waiting.append(len(self.backlog))
        return real(self, recorder, end, error)  # type: ignore[arg-type]

    monkeypatch.setattr(Recording, "finish", spy)
    rows = _storm(tmp_path, 3000)
    assert len(rows) == 3000 and {r["error_type"] for r in rows} == {"connect"}
    assert len(waiting) == 3000 and max(waiting) <= 64


class _HangsAfterFreeing:
    """A transport whose response completes (``on_complete`` runs, so the slot's next
    request goes out through ``start`` from inside that read) but whose slot task never
    wakes: the run's stop then cancels the slot holding a request nobody awaits yet."""

    def __init__(self) -> None:
        self.started: list[object] = []
        self.aborted: list[object] = []

    async def send(self, call: object, sink: RequestRecorder, on_complete: object = None) -> None:
        sink.sent(time.perf_counter_ns())
        if callable(on_complete):
            on_complete()
        await asyncio.sleep(3600)

    def start(self, call: object, sink: RequestRecorder, on_complete: object = None) -> object:
        sink.sent(time.perf_counter_ns())
        ex = object()
        self.started.append(ex)
        return ex

    async def complete(self, ex: object, call: object, sink: RequestRecorder) -> None:
        await asyncio.sleep(3600)

    def abort(self, ex: object) -> None:
        self.aborted.append(ex)

    async def close(self) -> None:
        pass

    def describe(self) -> dict[str, object]:
        return {"transport": "hangs-after-freeing"}


def test_a_request_sent_for_a_stopped_slot_is_aborted_and_recorded(tmp_path: Path) -> None:
    """The race the freed-slot send opens, forced: the completing read sent the slot's next
    request, then the run stopped before the slot's task took it over. That request's
    exchange is aborted and it is recorded as cancelled (never lost, never awaited)."""
    fake = _HangsAfterFreeing()
    specs = tuple(RequestSpec(f"r{i}", 4, 4, prompt="p") for i in range(10))

    async def main() -> Path:
        cfg = RunConfig(out=tmp_path / "run", url="http://127.0.0.1:9", engine="sim", model="sim-model",
                        schedule=Schedule("c", 0, "closed", specs, concurrency=2),
                        options=RunOptions(progress=False, duration_s=0.2, drain_timeout_s=0.0), transport="raw")
        res = await execute_run(cfg, OpenAIAdapter(model="sim-model", api="chat"), transport=fake,  # type: ignore[arg-type]
                                install_signals=False)
        return res.run_dir

    run = load_run(asyncio.run(main()))
    rows = run.requests.to_pylist()
    notes = json.loads(run.meta["notes_json"]) if isinstance(run.meta["notes_json"], str) else run.meta["notes_json"]
    assert len(fake.started) == 2 and fake.aborted == fake.started  # one per slot, each aborted
    assert len(rows) == 4 == notes["sent"] == notes["cancelled"]
    assert {r["error_type"] for r in rows} == {"cancelled"}
    assert len({r["request_id"] for r in rows}) == 4


def test_a_failure_storm_leaves_no_garbage_to_pile_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cyclic GC is paused for a run, and each failed request leaves reference cycles
    (exceptions, tracebacks, frames, asyncio tasks): they are collected as failures add up,
    so a server that fails every request cannot grow the client's memory without bound."""
    import gc

    from bench_llm.loadgen.recording import Recording

    monkeypatch.setattr(Recording, "FAILURES_PER_COLLECT", 256)
    alive: list[int] = []
    real = Recording.finish
    calls = [0]

    def spy(self: Recording, recorder: RequestRecorder, end: int, error: object) -> object:
        calls[0] += 1
        if calls[0] % 500 == 0:
            alive.append(len(gc.get_objects()))
        return real(self, recorder, end, error)  # type: ignore[arg-type]

    monkeypatch.setattr(Recording, "finish", spy)
    rows = _storm(tmp_path, 4000)
    assert len(rows) == 4000 and not any(r["ok"] for r in rows)
    assert len(alive) == 8
    growth = alive[-1] - alive[0]  # 3,500 failures apart; ~30 objects each if none were freed
    assert growth < 30_000, alive
