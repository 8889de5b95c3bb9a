"""Wiring one run: schedule -> loadgen (adapter + transport) -> results folder.

Used by ``bench run`` and by the sweep. Ctrl-C / SIGTERM stop the run cleanly: in-flight
requests are recorded as cancelled and every row is flushed.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench_llm.adapters.base import Adapter
from bench_llm.bench.errors import ExitCode, os_error_message, setting_message
from bench_llm.bench.run_meta import describe_run, run_meta, utc_now
from bench_llm.core.control import EngineClient
from bench_llm.core.errors import BenchError
from bench_llm.launch.profiles import profile
from bench_llm.loadgen.runner import Runner, RunOptions, RunStats
from bench_llm.loadgen.transport import Timeouts, Transport
from bench_llm.results.outdir import check_out, clear_run, free_room, reserve_room
from bench_llm.results.schema import RUN_FILE
from bench_llm.results.writer import MonitorWriter, RequestsWriter, compact_finished_run, write_run_meta, write_schedule
from bench_llm.workloads.context import fit_to_context
from bench_llm.workloads.spec import Schedule

if TYPE_CHECKING:  # imported where a live run needs them (a virtual-time run never loads aiohttp)
    from bench_llm.loadgen.otlp import OtlpReceiver
    from bench_llm.loadgen.scrape import MetricsScraper
    from bench_llm.loadgen.workers import WorkerPool

#: Longest wait, after the last response, for the engine's spans (engines export in batches:
#: vLLM every 5 s by default, every 0.5 s when bench launches it with a receiver).
OTLP_WAIT_S = 15.0

#: ``run.parquet`` ``clock``: which clock stamped the received chunks.
CLOCK_LABELS = {
    "user": "user: perf_counter_ns at read",
    "kernel": "kernel: SO_TIMESTAMPNS receive time on the perf_counter_ns timeline",
}


@dataclass(frozen=True)
class RunConfig:
    out: Path
    url: str
    engine: str
    model: str
    schedule: Schedule
    options: RunOptions = RunOptions()
    timeouts: Timeouts = Timeouts()
    command: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    overwrite: bool = False
    #: Load generator (issue 8): transport auto|raw|aiohttp, clock user|kernel, processes.
    transport: str = "auto"
    clock: str = "auto"
    workers: int = 1
    #: Engine /metrics scraping (issue 4): seconds between scrapes, None to not scrape.
    scrape_interval_s: float | None = 1.0
    #: A launched engine's version, argv, GPUs (``EngineHandle.describe()``), into config_json.
    engine_info: dict[str, Any] | None = None
    #: The engine's version as the user gave it (``--engine-version``); a launched engine's own
    #: answer wins. Picks the /metrics names that version emits.
    engine_version: str | None = None
    #: Read the engine's served context length and fit the requests into it before sending
    #: (workloads/context.py): cut output lengths, refuse prompts that cannot fit.
    fit_context: bool = True


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    run_id: str
    stats: RunStats
    #: Why the run stopped early when its folder could not be written (a full disk), else None.
    write_error: str | None = None


def prepare_run_dir(out: Path, overwrite: bool) -> Path:
    """``out`` made ready for a new run, for a caller that does not hold its folder's lock (a
    sweep's load, a virtual-time run; ``bench run`` claims its folder with
    ``results.outdir.claim_run_folder``): a previous run is an error without ``overwrite`` and
    is replaced with it only when the folder holds nothing else (``results.outdir.clear_run``)."""
    out = check_out(out)
    if out.exists() and not out.is_dir():
        raise BenchError(f"{out} exists and is not a folder")
    if (out / RUN_FILE).exists():
        if not overwrite:
            raise BenchError(f"{out} already holds a run; choose another --out (or pass --overwrite)")
        clear_run(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def stats_notes(stats: RunStats, notes: list[str]) -> dict[str, Any]:
    """``run.parquet`` ``notes_json``: the run's counters and notes."""
    return {
        "notes": notes,
        "sent": stats.sent,
        "completed": stats.completed,
        "failed": stats.failed,
        "cancelled": stats.cancelled,
        "max_in_flight": stats.max_in_flight,
        "t0_ns": stats.t0_ns,
        "end_ns": stats.end_ns,
        # which read path parsed the streams' payloads (bench/report_text.py says a fallback)
        "read_path_payloads": {"compiled": stats.payloads_compiled, "python": stats.payloads_python},
        # recorded, excluded from every metric: the warm-up and the cool-down apart
        "excluded": {"warmup": stats.warmup_excluded, "cooldown": stats.cooldown_excluded},
    }


async def execute_run(
    cfg: RunConfig,
    adapter: Adapter,
    transport: Transport | None = None,
    install_signals: bool = True,
    otlp: OtlpReceiver | None = None,
) -> RunResult:
    """One run into ``cfg.out``. With ``otlp`` (a started receiver the engine exports its
    spans to), the spans of the run's requests are awaited after the last response and written
    beside the requests (``server_spans.parquet``)."""
    run_dir = prepare_run_dir(cfg.out, cfg.overwrite)
    run_id = uuid.uuid4().hex[:16]
    own_transport = transport is None
    if transport is None:
        from bench_llm.loadgen.transports import make_transport

        try:
            transport = make_transport(cfg.transport, cfg.url, cfg.timeouts, cfg.clock)
        except ValueError as exc:
            raise BenchError(setting_message(exc)) from None
    schedule, context_note = cfg.schedule, None
    if cfg.fit_context:
        schedule, context_note = await asyncio.to_thread(_fit_to_served_context, cfg, adapter)
    writer = RequestsWriter(run_dir, run_id, worker_id=cfg.options.worker_id)
    monitor = MonitorWriter(run_dir, worker_id=cfg.options.worker_id)
    description = describe_run(
        command=cfg.command,
        config={**cfg.config, "engine_launch": cfg.engine_info} if cfg.engine_info else cfg.config,
        engine=cfg.engine,
        model=cfg.model,
        adapter={**adapter.describe(), **transport.describe(), "url": cfg.url},
        schedule=schedule,  # as fitted to the served context
        extra=cfg.extra,
        phases={"warmup_s": cfg.options.warmup_s, "cooldown_s": cfg.options.cooldown_s},
    )
    clock = CLOCK_LABELS.get(str(transport.describe().get("clock", "user")), "user")
    meta = {**run_meta(run_id, description, clock=clock), "t0_monotonic_ns": time.perf_counter_ns()}
    write_run_meta(run_dir, meta)
    write_schedule(run_dir, schedule.requests)
    reserve_room(run_dir)  # so that a full disk still lets the run say it was interrupted
    runner = _make_runner(cfg, run_dir, run_id, meta, schedule, adapter, transport, writer, monitor)
    loop = asyncio.get_running_loop()
    installed = _install_signals(loop, runner) if install_signals else []
    scraper = _scraper(cfg, run_dir)
    if scraper is not None:
        await asyncio.to_thread(scraper.start)
    if otlp is not None:
        otlp.reset()  # a receiver reused across runs: this run's spans only
    write_error: OSError | None = None
    try:
        stats = await runner.run()
    except OSError as exc:  # the folder could not be written (a full disk): the run stopped there
        write_error = exc
        stats = runner.stats if isinstance(runner, Runner) else RunStats()  # (workers: their rows are on disk)
        stats.interrupted = True
        free_room(run_dir)
    finally:
        if scraper is not None:
            await asyncio.to_thread(scraper.stop)
        for sig in installed:
            loop.remove_signal_handler(sig)
        if own_transport:
            await transport.close()
    notes = []
    if write_error is not None:
        notes.append(f"run interrupted: cannot write {os_error_message(write_error)}; the rows written before are kept")
    elif stats.interrupted:
        notes.append("run interrupted: in-flight requests recorded as cancelled")
    if otlp is not None:
        await asyncio.to_thread(otlp.wait_for, stats.completed, 0.0 if stats.interrupted else OTLP_WAIT_S)
        if otlp.write(run_dir) is None:
            notes.append(f"OTLP receiver at {otlp.endpoint}: no request span arrived (is the engine exporting to it?)")
    free_room(run_dir)
    _write_final_meta(cfg, run_dir, meta, stats, notes, context_note, transport, scraper, otlp)
    if write_error is not None:
        return RunResult(run_dir, run_id, stats, notes[0])
    # Every writer is closed: merge the run's part files (one per second or per 256
    # requests while recording, the crash-loss bound) into few large ones, so readers do
    # not pay a file's fixed cost thousands of times. Atomic; an interrupt keeps the parts.
    compact_finished_run(run_dir)
    return RunResult(run_dir, run_id, stats)


def _make_runner(
    cfg: RunConfig,
    run_dir: Path,
    run_id: str,
    meta: dict[str, Any],
    schedule: Schedule,
    adapter: Adapter,
    transport: Transport,
    writer: RequestsWriter,
    monitor: MonitorWriter,
) -> Runner | WorkerPool:
    """The in-process runner, or with ``cfg.workers > 1`` a pool of worker processes (then
    ``meta`` gains the worker count and CPUs and is written again)."""
    if cfg.workers > 1:
        from bench_llm.loadgen.workers import WorkerPool

        pool = WorkerPool(run_dir, run_id, schedule, adapter, cfg.url, cfg.timeouts, cfg.workers,
                          cfg.transport, cfg.clock, cfg.options)
        meta["adapter_json"]["workers"] = cfg.workers
        meta["adapter_json"]["worker_cpus"] = pool.cpus
        write_run_meta(run_dir, meta)
        return pool
    return Runner(schedule, adapter, transport, writer, monitor, cfg.options)


def _write_final_meta(
    cfg: RunConfig,
    run_dir: Path,
    meta: dict[str, Any],
    stats: RunStats,
    notes: list[str],
    context_note: str | None,
    transport: Transport,
    scraper: MetricsScraper | None,
    otlp: OtlpReceiver | None,
) -> None:
    """Rewrite the run's meta at its end: status, end time, the notes and warnings."""
    meta.update(
        status="interrupted" if stats.interrupted else "complete",
        adapter_json={**meta["adapter_json"], **(transport.describe() if cfg.workers <= 1 else {})},
        end_utc=utc_now(),
        notes_json={
            **stats_notes(stats, notes),
            # printed by every summary of the run (bench/report_text.py)
            "warnings": [context_note] if context_note else [],
            **({"server_metrics": scraper.describe()} if scraper is not None else {}),
            **({"otlp": otlp.describe()} if otlp is not None else {}),
        },
    )
    write_run_meta(run_dir, meta)


def _install_signals(loop: asyncio.AbstractEventLoop, runner: Runner | WorkerPool) -> list[signal.Signals]:
    """Ctrl-C / SIGTERM stop ``runner`` cleanly (``_on_signal``); the signals installed."""
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, _on_signal, runner, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):
            pass
    return installed


def _scraper(cfg: RunConfig, run_dir: Path) -> MetricsScraper | None:
    """The engine's /metrics scraper of this run (not started); None when not scraping."""
    if not cfg.scrape_interval_s:
        return None
    from bench_llm.loadgen.scrape import MetricsScraper

    # the launched engine's version picks the families it emits (docs/engines.md)
    names = profile(cfg.engine).metric_names((cfg.engine_info or {}).get("version") or cfg.engine_version)
    return MetricsScraper(cfg.url, run_dir, cfg.scrape_interval_s, names=names)


def _fit_to_served_context(cfg: RunConfig, adapter: Adapter) -> tuple[Schedule, str | None]:
    """The schedule fitted into the engine's served context, and the line that says what
    was changed (also printed); the schedule as it is when the engine does not say."""
    found = served_context(cfg.url, cfg.engine, str(adapter.describe().get("model") or cfg.model))
    if found is None:
        return cfg.schedule, None
    tokens, where = found
    fit = fit_to_context(cfg.schedule, tokens, chat=adapter.describe().get("api") == "chat")
    note = fit.message(where)
    if note:
        sys.stderr.write(f"note: {note}\n")
    return fit.schedule, note


def served_context(url: str, engine: str, model: str, timeout_s: float = 5.0) -> tuple[int, str] | None:
    """(context length, where it was read) from the first of the engine's routes that says."""
    client = EngineClient(url, timeout_s=timeout_s)
    for route in profile(engine).routes.context:
        obj = client.get_json(route.path)
        tokens = None if obj is None else route.parse(obj, model)
        if tokens is not None:
            return tokens, route.label
    return None


def _on_signal(runner: Runner | WorkerPool, sig: int) -> None:
    if runner.stop.is_set():
        # second Ctrl-C: the rows flushed so far are safe on disk
        sys.stderr.write("\nforced exit\n")
        raise SystemExit(ExitCode.INTERRUPTED)
    sys.stderr.write(f"\n{signal.Signals(sig).name}: stopping, recording in-flight requests as cancelled...\n")
    runner.stop.set()
