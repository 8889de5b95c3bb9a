"""``bench locust master|worker``: distributed load generation on locust's master/worker runner.

This module must stay cheap and must not import locust (``bench --help`` lists it); the
locust-facing modules are imported inside the commands, before anything that pulls in
ssl or asyncio, because locust monkey-patches the standard library with gevent.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bench_llm.bench import run_options as opts
from bench_llm.bench.errors import ExitCode, Outcome, setting_message
from bench_llm.core.errors import BenchError

if TYPE_CHECKING:
    from bench_llm.bench.distributed.wire import ClientSettings
    from bench_llm.workloads.spec import Schedule


@click.group("locust")
def command() -> None:
    """Distributed load generation: one master, N workers (see docs/distributed.md).

    \b
    Master (owns the workload and the results folder):
      bench locust master --workers 2 --bind-host 0.0.0.0 --url http://ENGINE:8000 \\
          --model M --rate 40 --requests 4000 --out runs/dist
    Each worker machine:
      bench locust worker --master-host MASTER_IP
    """


def _require_locust() -> None:
    """One line, not a traceback, where locust is not installed (an optional extra)."""
    try:
        import locust  # noqa: F401  (first, as the locust modules need: it patches the standard library)
    except ImportError:
        raise BenchError("bench locust needs locust: pip install 'bench[distributed]' (or pip install locust)") from None


@command.command("master")
@click.option("--workers", "n_workers", type=int, required=True, help="Workers to wait for; the schedule is split over them.")
@click.option("--bind-host", default="127.0.0.1", show_default=True, help="Interface for workers (0.0.0.0 for other machines).")
@click.option("--port", type=int, default=5557, show_default=True, help="locust master port.")
@opts.target_options(distributed=True)
@opts.load_options(distributed=True)
@opts.client_options(distributed=True)
@opts.phase_options(distributed=True)
@click.option("--wait-workers", type=float, default=120.0, show_default=True, help="Seconds to wait for the workers.")
@click.option("--start-lead", type=float, default=1.0, show_default=True, help="Seconds between the start order and t0.")
@click.option("--worker-timeout", type=float, default=10.0, show_default=True, help="Silence after which a worker is lost.")
@opts.output_options(distributed=True)
def master(
    n_workers: int,
    bind_host: str,
    port: int,
    target: opts.EngineTarget,
    load: opts.LoadOptions,
    client: opts.ClientOptions,
    phases: opts.PhaseOptions,
    wait_workers: float,
    start_lead: float,
    worker_timeout: float,
    output: opts.OutputOptions,
) -> None:
    """Build the schedule, hand each worker its share, collect one run folder."""
    if n_workers < 1:
        raise BenchError("--workers must be at least 1")
    if start_lead <= 0 or worker_timeout <= 0 or wait_workers <= 0:
        raise BenchError("--start-lead, --worker-timeout and --wait-workers must be positive")
    phases.check(load.duration)
    _require_locust()
    import secrets
    import signal

    import gevent

    from bench_llm.bench.distributed.locust_master import MasterNode, MasterSettings  # locust (gevent) first
    from bench_llm.bench.outcome import run_outcome
    from bench_llm.bench.report_text import print_summary
    from bench_llm.results.outdir import claim_run_folder, took_over_note

    schedule, description, settings = _master_plan(n_workers, target, load, client, output, secrets.randbits(32), phases)
    lock = claim_run_folder(output.out, output.overwrite, ("bench", *sys.argv[1:]))  # one writer per folder
    run_dir = lock.folder
    note = took_over_note(lock)
    if note:
        click.echo(f"note: {note}", err=True)
    node = MasterNode(
        MasterSettings(workers=n_workers, bind_host=bind_host, port=port, wait_workers_s=wait_workers,
                       start_lead_s=start_lead, worker_timeout_s=worker_timeout),
        echo=lambda s: click.echo(s, err=True),
    )

    def on_signal() -> None:
        if node.stop_requested.is_set():
            click.echo("forced exit", err=True)
            sys.exit(ExitCode.INTERRUPTED)
        click.echo("stopping the workers (Ctrl-C again to abandon)...", err=True)
        node.stop_requested.set()

    gevent.signal_handler(signal.SIGINT, on_signal)
    gevent.signal_handler(signal.SIGTERM, on_signal)
    try:
        assembly = node.run(schedule, settings, run_dir, description)
    finally:
        node.close()
        lock.release()
    summary = print_summary(run_dir, output.slo, output.percentiles, output.as_json)
    if assembly.meta.get("status") == "interrupted":
        raise Outcome(ExitCode.INTERRUPTED)
    outcome = run_outcome(summary)
    if outcome is not None:
        raise outcome


def _master_plan(
    n_workers: int,
    target: opts.EngineTarget,
    load: opts.LoadOptions,
    client: opts.ClientOptions,
    output: opts.OutputOptions,
    salt: int,
    phases: opts.PhaseOptions | None = None,
) -> tuple[Schedule, dict[str, Any], ClientSettings]:
    """The schedule (a new prompt salt, as ``bench run``: no prefix shared with earlier runs),
    the run's description (``bench.run_meta.describe_run``) and what each worker's client gets."""
    from bench_llm.bench.distributed.wire import ClientSettings
    from bench_llm.bench.run_meta import describe_run
    from bench_llm.launch.profiles import adapter_for_engine
    from bench_llm.loadgen.aiohttp_transport import AiohttpTransport
    from bench_llm.loadgen.transport import Timeouts, check_base_url

    url = str(target.url)  # required by the option
    try:
        check_base_url(url)
    except ValueError as exc:
        raise BenchError(setting_message(exc)) from None
    try:
        schedule = load.schedule(salt=salt)
    except ValueError as exc:
        raise BenchError(setting_message(exc)) from None
    try:
        adapter = adapter_for_engine(target.engine, model=target.model, api=target.api)
    except (ValueError, TypeError) as exc:
        raise BenchError(f"--engine {target.engine}: {exc}") from None
    timeouts = Timeouts(stall=client.stall_timeout)
    settings = ClientSettings(
        url=url,
        adapter=target.engine,
        api=target.api,
        model=target.model,
        api_key_env=client.api_key_env,
        api_key_file=None if client.api_key_file is None else str(client.api_key_file),
        connect_timeout_s=timeouts.connect,
        stall_timeout_s=client.stall_timeout,
        duration_s=load.duration,
        save_text=output.save_text,
        warmup_s=phases.warmup_s if phases else 0.0,
        cooldown_s=phases.cooldown_s if phases else 0.0,
    )
    description = describe_run(
        command=("bench", *sys.argv[1:]),
        config=output.config(target.engine, target.api, workers=n_workers),
        engine=target.engine,
        model=target.model,
        adapter={**adapter.describe(), **AiohttpTransport(url, timeouts).describe(), "url": url},
        schedule=schedule,
        extra={},
        phases={"warmup_s": settings.warmup_s, "cooldown_s": settings.cooldown_s},
    )
    return schedule, description, settings


@command.command("worker")
@click.option("--master-host", default="127.0.0.1", show_default=True)
@click.option("--master-port", type=int, default=5557, show_default=True)
@click.option("--spool-dir", type=click.Path(path_type=Path), help="Where part files wait before streaming (default: a temp folder).")
@click.option("--keep-spool", is_flag=True, help="Keep the local part files after the run.")
def worker(master_host: str, master_port: int, spool_dir: Path | None, keep_spool: bool) -> None:
    """Connect to a master, measure this worker's share, stream the rows back."""
    _require_locust()
    from bench_llm.bench.distributed.locust_worker import WorkerNode  # locust (gevent) first

    if spool_dir is not None:
        spool_dir.mkdir(parents=True, exist_ok=True)
    try:
        node = WorkerNode(master_host, master_port, spool_dir, echo=lambda s: click.echo(s, err=True))
    except ConnectionError:
        raise BenchError(f"cannot reach the locust master at {master_host}:{master_port}") from None
    try:
        code = node.serve()
    finally:
        node.close(keep_spool)
    if code:
        sys.exit(code)
