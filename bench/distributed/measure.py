"""The measuring process of a distributed worker: bench's own asyncio client, no gevent.

The locust worker starts ``python -m bench.distributed.measure JOB.json SPOOL`` and talks
to it over stdin/stdout, one JSON object per line:

- it prints ``{"event": "ready"}`` once the client is built (and worker 0's warm-up is done),
- it reads ``{"start_at_ns": T}`` (T on this host's monotonic clock) and runs its share
  with ``RunOptions.start_at_ns = T``, writing part files into ``SPOOL/requests`` and
  ``SPOOL/client_monitor``,
- ``{"stop": true}`` or end-of-file on stdin (the locust worker died) stops the run early;
  in-flight requests are recorded as cancelled and every row is flushed,
- it prints ``{"event": "done", "stats": {...}}`` last.

Timestamps are written on the master's timeline: ``stored = local + shift_ns`` with
``shift_ns = -offset`` (0 when master and worker share a host), so every duration inside a
request is exactly this host's own monotonic difference.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench_llm.adapters.base import Adapter
from bench_llm.bench.distributed.wire import ClientSettings, schedule_from_wire
from bench_llm.bench.secrets import load_api_key
from bench_llm.core.errors import BenchError
from bench_llm.launch.profiles import adapter_for_engine
from bench_llm.loadgen.aiohttp_transport import AiohttpTransport
from bench_llm.loadgen.runner import Runner, RunOptions, RunStats
from bench_llm.loadgen.transport import Timeouts
from bench_llm.results.record import RequestRecord
from bench_llm.results.writer import MonitorWriter, RequestsWriter
from bench_llm.workloads.spec import Schedule

_SHIFTED_SCALARS = ("intended_send_ns", "send_ns", "first_byte_ns", "first_token_ns", "first_content_ns", "end_ns")


class ShiftedRequestsWriter(RequestsWriter):
    """Requests rows with every timestamp moved onto the master's timeline."""

    def __init__(self, run_dir: Path, run_id: str, worker_id: int, shift_ns: int) -> None:
        super().__init__(run_dir, run_id, worker_id=worker_id)
        self.shift_ns = shift_ns

    def add_record(self, record: RequestRecord) -> None:
        if self.shift_ns:
            d = self.shift_ns
            changes: dict[str, Any] = {k: getattr(record, k) + d for k in _SHIFTED_SCALARS if getattr(record, k) is not None}
            if record.chunk_ns is not None:
                changes["chunk_ns"] = [t + d for t in record.chunk_ns]
            record = replace(record, **changes)
        super().add_record(record)


class ShiftedMonitorWriter(MonitorWriter):
    def __init__(self, run_dir: Path, worker_id: int, shift_ns: int) -> None:
        super().__init__(run_dir, worker_id=worker_id)
        self.shift_ns = shift_ns

    def add(self, row: dict[str, Any]) -> None:
        if self.shift_ns and row.get("ts_ns") is not None:
            row = {**row, "ts_ns": row["ts_ns"] + self.shift_ns}
        super().add(row)


def build_adapter(client: ClientSettings) -> Adapter:
    key_file = Path(client.api_key_file) if client.api_key_file else None
    api_key = load_api_key(client.api_key_env, key_file)
    return adapter_for_engine(client.adapter, model=client.model, api=client.api, api_key=api_key)


def _emit(obj: dict[str, Any]) -> None:
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        # the locust worker is gone; the part files in the spool folder remain
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _stats_dict(stats: RunStats, shift_ns: int) -> dict[str, Any]:
    return {
        "sent": stats.sent,
        "completed": stats.completed,
        "failed": stats.failed,
        "cancelled": stats.cancelled,
        "max_in_flight": stats.max_in_flight,
        "t0_ns": stats.t0_ns + shift_ns,
        "end_ns": stats.end_ns + shift_ns,
        "interrupted": stats.interrupted,
    }


def _stdin_commands(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[dict[str, Any]]) -> None:
    """Forward stdin lines to ``queue``; end-of-file means the parent is gone."""
    for line in sys.stdin:
        line = line.strip()
        if line:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, json.loads(line))
            except (ValueError, RuntimeError):
                continue
    try:
        loop.call_soon_threadsafe(queue.put_nowait, {"stop": True, "reason": "parent closed the pipe"})
    except RuntimeError:
        pass


def _prime_arrow() -> None:
    """Pay pyarrow's first-table cost now (it imports pandas, ~0.5 s of CPU holding the
    GIL), not in the first flush mid-run where it would stall the event loop."""
    import pyarrow as pa

    from bench_llm.results.schema import MONITOR_SCHEMA, REQUESTS_SCHEMA

    for schema in (REQUESTS_SCHEMA, MONITOR_SCHEMA):
        pa.Table.from_pydict({n: [] for n in schema.names}, schema=schema)


def worker_options(client: ClientSettings, worker_id: int) -> RunOptions:
    """What a worker's runner is told: the master's settings, its phases included (each worker
    applies ``RunOptions.phase_at`` from the shared t0, so every share has the same windows)."""
    return RunOptions(
        worker_id=worker_id,
        duration_s=client.duration_s,
        drain_timeout_s=client.drain_timeout_s,
        warmup_concurrency=client.warmup_concurrency,
        save_text=client.save_text,
        progress=False,
        warmup_s=client.warmup_s,
        cooldown_s=client.cooldown_s,
    )


async def run_job(job: dict[str, Any], spool: Path) -> dict[str, Any]:
    _prime_arrow()
    client = ClientSettings.from_wire(job["client"])
    schedule = schedule_from_wire(job["schedule"])
    worker_id = int(job["worker_id"])
    shift_ns = int(job.get("shift_ns", 0))
    adapter = build_adapter(client)
    transport = AiohttpTransport(client.url, Timeouts(connect=client.connect_timeout_s, stall=client.stall_timeout_s))
    writer = ShiftedRequestsWriter(spool, job["run_id"], worker_id, shift_ns)
    monitor = ShiftedMonitorWriter(spool, worker_id, shift_ns)
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    threading.Thread(target=_stdin_commands, args=(loop, commands), daemon=True).start()
    base = worker_options(client, worker_id)
    try:
        if schedule.warmup:
            # Warm-up before "ready", so the shared t0 is not eaten by it.
            warm = Schedule(
                name=schedule.name,
                seed=schedule.seed,
                mode="closed",
                requests=schedule.warmup,
                concurrency=max(1, min(len(schedule.warmup), client.warmup_concurrency)),
            )
            await Runner(warm, adapter, transport, writer, monitor, replace(base, start_lead_s=0.0)).run()
        measured = replace(schedule, requests=schedule.measured)
        _emit({"event": "ready"})
        command = await commands.get()
        if "start_at_ns" not in command:
            return {"sent": 0, "completed": 0, "failed": 0, "cancelled": 0, "interrupted": True, "aborted": True}
        runner = Runner(measured, adapter, transport, writer, monitor, replace(base, start_at_ns=int(command["start_at_ns"])))
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.stop.set)

        async def watch() -> None:
            while True:
                cmd = await commands.get()
                if cmd.get("stop"):
                    runner.stop.set()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            stats = await runner.run()
        finally:
            watcher.cancel()
        return _stats_dict(stats, shift_ns)
    finally:
        await transport.close()
        writer.flush()
        monitor.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write("usage: python -m bench.distributed.measure JOB.json SPOOL_DIR\n")
        return 2
    job = json.loads(Path(argv[0]).read_text())
    spool = Path(argv[1])
    from bench_llm.core.eventloop import run_async

    try:
        stats = run_async(lambda: run_job(job, spool))
    except BenchError as exc:
        _emit({"event": "error", "message": str(exc)})
        return 1
    _emit({"event": "done", "stats": stats, "pid": os.getpid()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
