"""``bench locust master|worker``: distributed load generation on locust's master/worker runner.

This module must stay cheap and must not import locust (``bench --help`` lists it); the
locust-facing modules are imported inside the commands, before anything that pulls in
ssl or asyncio, because locust monkey-patches the standard library with gevent.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from core.errors import BenchError
from bench.errors import ExitCode, Outcome


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
@click.option("--url", required=True, help="Engine base URL, as the workers reach it.")
@click.option("--engine", default="vllm", show_default=True, help="API flavour: vllm/openai, sglang, tgi, generic.")
@click.option("--api", type=click.Choice(["completions", "chat"]), default="completions", show_default=True)
@click.option("--model", default="sim-model", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Run folder to create (on the master).")
@click.option("--overwrite", is_flag=True)
@click.option("--workload", "workload_ref", help="Named workload or TOML file.")
@click.option("--requests", "n_requests", type=int, default=100, show_default=True)
@click.option("--input-tokens", type=int, default=256, show_default=True)
@click.option("--output-tokens", type=int, default=128, show_default=True)
@click.option("--rate", type=float, help="Open loop: mean requests/s over all workers.")
@click.option("--arrival", default="poisson", show_default=True)
@click.option("--concurrency", type=int, help="Closed loop: requests in flight over all workers.")
@click.option("--warmup", type=int, default=0, show_default=True, help="Warm-up requests (run by worker 0 before t0).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--duration", type=float, help="Stop sending after this many seconds.")
@click.option("--stall-timeout", type=float, default=120.0, show_default=True)
@click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True, help="Read by each worker from ITS environment.")
@click.option("--api-key-file", help="Path read by each worker on its own machine.")
@click.option("--save-text", is_flag=True)
@click.option("--wait-workers", type=float, default=120.0, show_default=True, help="Seconds to wait for the workers.")
@click.option("--start-lead", type=float, default=1.0, show_default=True, help="Seconds between the start order and t0.")
@click.option("--worker-timeout", type=float, default=10.0, show_default=True, help="Silence after which a worker is lost.")
@click.option("--slo", "slo_text")
@click.option("--percentiles", "pct_text", default="50,90,95,99", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def master(
    n_workers: int,
    bind_host: str,
    port: int,
    url: str,
    engine: str,
    api: str,
    model: str,
    out: Path,
    overwrite: bool,
    workload_ref: str | None,
    n_requests: int,
    input_tokens: int,
    output_tokens: int,
    rate: float | None,
    arrival: str,
    concurrency: int | None,
    warmup: int,
    seed: int,
    duration: float | None,
    stall_timeout: float,
    api_key_env: str,
    api_key_file: str | None,
    save_text: bool,
    wait_workers: float,
    start_lead: float,
    worker_timeout: float,
    slo_text: str | None,
    pct_text: str,
    as_json: bool,
) -> None:
    """Build the schedule, hand each worker its share, collect one run folder."""
    if n_workers < 1:
        raise BenchError("--workers must be at least 1")
    if start_lead <= 0 or worker_timeout <= 0 or wait_workers <= 0:
        raise BenchError("--start-lead, --worker-timeout and --wait-workers must be positive")
    _require_locust()
    from bench.distributed.locust_master import MasterNode, MasterSettings  # locust (gevent) first

    import gevent
    import secrets
    import signal

    from launch.profiles import adapter_for_engine
    from bench.commands.run import _build_schedule
    from bench.options import parse_percentiles, parse_slo
    from bench.distributed.wire import ClientSettings
    from bench.execute import prepare_run_dir, workload_meta
    from bench.outcome import run_outcome
    from bench.report_text import print_summary
    from loadgen.aiohttp_transport import AiohttpTransport
    from loadgen.transport import Timeouts, check_base_url
    from workloads.synthetic import WorkloadError

    slo = parse_slo(slo_text)
    percentiles = parse_percentiles(pct_text)
    try:
        check_base_url(url)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    try:
        schedule = _build_schedule(  # a new prompt salt, as bench run: no prefix shared with earlier runs
            workload_ref, n_requests, input_tokens, output_tokens, rate, arrival, concurrency, warmup, seed,
            salt=secrets.randbits(32),
        )
    except (WorkloadError, ValueError) as exc:
        raise BenchError(str(exc)) from None
    try:
        adapter = adapter_for_engine(engine, model=model, api=api)
    except (ValueError, TypeError) as exc:
        raise BenchError(f"--engine {engine}: {exc}") from None
    timeouts = Timeouts(stall=stall_timeout)
    client = ClientSettings(
        url=url,
        adapter=engine,
        api=api,
        model=model,
        api_key_env=api_key_env,
        api_key_file=api_key_file,
        connect_timeout_s=timeouts.connect,
        stall_timeout_s=stall_timeout,
        duration_s=duration,
        save_text=save_text,
    )
    run_dir = prepare_run_dir(out, overwrite)
    base_meta = {
        "command": " ".join(("bench", *sys.argv[1:])),
        "config_json": {"engine": engine, "api": api, "slo": slo.as_dict(), "percentiles": list(percentiles), "workers": n_workers},
        "engine": engine,
        "model": model,
        "adapter_json": {**adapter.describe(), **AiohttpTransport(url, timeouts).describe(), "url": url},
        "workload_json": workload_meta(schedule),
        "extra_json": {},
    }
    settings = MasterSettings(
        workers=n_workers,
        bind_host=bind_host,
        port=port,
        wait_workers_s=wait_workers,
        start_lead_s=start_lead,
        worker_timeout_s=worker_timeout,
    )
    node = MasterNode(settings, echo=lambda s: click.echo(s, err=True))

    def on_signal() -> None:
        if node.stop_requested.is_set():
            click.echo("forced exit", err=True)
            sys.exit(ExitCode.INTERRUPTED)
        click.echo("stopping the workers (Ctrl-C again to abandon)...", err=True)
        node.stop_requested.set()

    gevent.signal_handler(signal.SIGINT, on_signal)
    gevent.signal_handler(signal.SIGTERM, on_signal)
    try:
        assembly = node.run(schedule, client, run_dir, base_meta)
    finally:
        node.close()
    summary = print_summary(run_dir, slo, percentiles, as_json)
    if assembly.meta.get("status") == "interrupted":
        raise Outcome(ExitCode.INTERRUPTED)
    outcome = run_outcome(summary)
    if outcome is not None:
        raise outcome


@command.command("worker")
@click.option("--master-host", default="127.0.0.1", show_default=True)
@click.option("--master-port", type=int, default=5557, show_default=True)
@click.option("--spool-dir", type=click.Path(path_type=Path), help="Where part files wait before streaming (default: a temp folder).")
@click.option("--keep-spool", is_flag=True, help="Keep the local part files after the run.")
def worker(master_host: str, master_port: int, spool_dir: Path | None, keep_spool: bool) -> None:
    """Connect to a master, measure this worker's share, stream the rows back."""
    _require_locust()
    from bench.distributed.locust_worker import WorkerNode  # locust (gevent) first

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
