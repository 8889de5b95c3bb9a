"""``bench run``: measure one workload against an engine."""

from __future__ import annotations

import contextlib
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from adapters.base import Adapter, adapter_for_engine, adapter_names, check_requests
from bench.errors import ExitCode, Outcome
from bench.options import parse_percentiles, parse_slo
from bench.request_options import request_options
from bench.secrets import load_api_key
from core.errors import BenchError
from loadgen.runner import RunOptions
from loadgen.recorder import MAX_EVENT_BYTES
from loadgen.transport import CLOCKS, DEFAULT_TOTAL_S, Timeouts, check_base_url
from workloads.prompts import make_synth
from workloads.spec import RequestOptions, Schedule

if TYPE_CHECKING:
    from bench.virtual import VirtualEngine
from workloads.synthetic import SyntheticWorkload, WorkloadError


@click.command("run")
@click.option("--url", help="Engine base URL (e.g. http://127.0.0.1:8000). Default: start the embedded simulated engine.")
@click.option(
    "--engine",
    default="vllm",
    show_default=True,
    help="API flavour to speak: vllm/openai (OpenAI-compatible), sglang, tgi, generic. "
    "Without --url the embedded engine speaks it too.",
)
@click.option("--api", type=click.Choice(["completions", "chat"]), default="completions", show_default=True)
@click.option("--model", default="sim-model", show_default=True, help="Model name sent with each request.")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Run folder to create.")
@click.option("--overwrite", is_flag=True, help="Replace an existing run in --out.")
@click.option("--workload", "workload_ref", help="Named workload or TOML file (see `bench workload show`).")
@click.option("--requests", "n_requests", type=int, default=100, show_default=True, help="Measured requests.")
@click.option("--input-tokens", type=int, default=256, show_default=True)
@click.option("--output-tokens", type=int, default=128, show_default=True)
@click.option("--rate", type=float, help="Open loop: mean requests/s.")
@click.option(
    "--arrival",
    default=None,
    help="Open-loop arrivals (default poisson): poisson, constant; with --workload also "
    "gamma:cv=2, onoff, ramp, steps, trace (see docs/workloads.md).",
)
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(path_type=Path), help="Local HF tokenizer folder for exact prompt lengths.")
@click.option("--tokenize-url", help="Make prompt lengths exact with this engine's /tokenize; 'auto': the engine measured.")
@click.option("--prompt-salt", type=click.IntRange(0, 2**63 - 1),
              help="Mixed into the prompt text so runs share no cached prefix. [default: new per run]")
@click.option("--concurrency", type=int, help="Closed loop: requests kept in flight.")
@click.option("--warmup", type=int, default=0, show_default=True, help="Warm-up requests (recorded, excluded).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--duration", type=float, help="Stop sending after this many seconds.")
@click.option("--stall-timeout", type=float, default=120.0, show_default=True,
              help="Max seconds without data (SSE comments and keep-alives are not data).")
@click.option("--request-timeout", type=float, default=DEFAULT_TOTAL_S, show_default=True,
              help="Max seconds for one whole request (0: no limit).")
@click.option("--drain-timeout", type=float, default=30.0, show_default=True,
              help="With --duration: seconds in-flight requests may still take (then recorded as cancelled).")
@click.option("--max-event-bytes", type=int, default=MAX_EVENT_BYTES, show_default=True,
              help="Longest SSE event or line of a response; longer fails the request (line_too_long).")
@click.option("--slo", "slo_text", help="SLOs for goodput, e.g. ttft_ms=500,tpot_ms=50.")
@click.option("--percentiles", "pct_text", default="50,90,95,99", show_default=True)
@click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True, help="Environment variable with the API key.")
@click.option("--api-key-file", type=click.Path(path_type=Path), help="File holding the API key.")
@click.option("--save-text", is_flag=True, help="Store generated text in the results (off by default).")
@click.option("--sim-ttft-ms", type=float, default=50.0, show_default=True, help="Embedded engine: time to first token.")
@click.option("--sim-itl-ms", type=float, default=10.0, show_default=True, help="Embedded engine: inter-token latency.")
@click.option("--sim-lora-swap-ms", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Embedded engine: it serves the --model-mix names as LoRA adapters, one resident at a time, and "
                   "loading one takes this long.")
@click.option("--sim-reasoning-tokens", type=click.IntRange(0), default=0, show_default=True,
              help="Embedded engine: chat answers start with this many reasoning tokens.")
@click.option("--sim-natural-stop", type=float, default=0.0, show_default=True, metavar="MEAN",
              help="Embedded engine: requests not forced to their length end at a seeded end of sequence of this "
                   "mean length (0: never).")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Load-generating processes (schedule split by send time; one run folder).")
@click.option("--transport", "transport_kind", type=click.Choice(["auto", "raw", "aiohttp"]), default="auto",
              show_default=True, help="HTTP client: bench's own lean one (raw; http only), aiohttp, or auto.")
@click.option("--clock", type=click.Choice((*CLOCKS, "virtual")), default=None,
              help="Chunk timestamps: the kernel's receive time (raw transport, Linux), user space at read, "
                   "or auto: kernel where available, else user. run.parquet records the clock used. "
                   "virtual (the default with --launch --engine sim): the simulated engine's scheduler and "
                   "cost model run in virtual time, no server or client, the same rows every time. "
                   "[default: auto; virtual with --launch --engine sim]")
@click.option("--launch", is_flag=True,
              help="Start --engine (sim|vllm|sglang|tgi) with --model through bench's launcher; stop it after the run.")
@click.option("--parallel", "parallel_text", default="",
              help="With --launch: parallel configuration, e.g. tp=2,dp=2 or tp=4,disagg=1:1.")
@click.option("--engine-arg", "engine_args", multiple=True, help="With --launch: one extra engine argument (repeatable).")
@click.option("--gpu", help="With --launch: GPU preset of the simulated engine (h100, ...); informational otherwise.")
@click.option("--engine-version", default=None, metavar="VERSION",
              help="The engine's version (e.g. 0.5.23, 3.3.6): picks version-gated launch flags and the /metrics "
                   "names it emits (docs/engines.md); default: what the launched engine reports, else every name.")
@click.option("--ready-timeout", type=float, default=600.0, show_default=True, help="With --launch: seconds to wait for readiness.")
@click.option("--scrape-interval", type=float, default=1.0, show_default=True, help="Seconds between /metrics scrapes.")
@click.option("--no-scrape", is_flag=True, help="Do not scrape the engine's /metrics.")
@request_options
def command(
    url: str | None,
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
    arrival: str | None,
    tokenizer_dir: Path | None,
    tokenize_url: str | None,
    prompt_salt: int | None,
    concurrency: int | None,
    warmup: int,
    seed: int,
    duration: float | None,
    stall_timeout: float,
    request_timeout: float,
    drain_timeout: float,
    max_event_bytes: int,
    slo_text: str | None,
    pct_text: str,
    api_key_env: str,
    api_key_file: Path | None,
    save_text: bool,
    sim_ttft_ms: float,
    sim_itl_ms: float,
    sim_natural_stop: float,
    sim_reasoning_tokens: int,
    sim_lora_swap_ms: float,
    progress: bool | None,
    as_json: bool,
    workers: int,
    transport_kind: str,
    clock: str | None,
    launch: bool,
    parallel_text: str,
    engine_args: tuple[str, ...],
    gpu: str | None,
    ready_timeout: float,
    engine_version: str | None,
    scrape_interval: float,
    no_scrape: bool,
    request: RequestOptions,
) -> None:
    """Measure one workload and print its metric table.

    Exit code: 0 measured, 2 bad input, 3 fewer than 10 % of the requests succeeded (the
    most frequent errors are named), 130 interrupted (README, "Exit codes").

    \b
    Examples:
      bench run --concurrency 16 --requests 200 --out runs/sim           # embedded engine
      bench run --url http://127.0.0.1:8000 --model M --rate 4 --out runs/r4
    """
    from bench.embedded import embedded_engine, sim_flavor
    from bench.execute import RunConfig, execute_run, prepare_run_dir
    from bench.outcome import run_outcome
    from bench.report_text import print_summary
    from core.eventloop import run_async

    slo = parse_slo(slo_text)
    percentiles = parse_percentiles(pct_text)
    if duration is not None and duration <= 0:
        raise BenchError("--duration must be positive")
    if stall_timeout <= 0:
        raise BenchError("--stall-timeout must be positive")
    if request_timeout < 0 or drain_timeout < 0:
        raise BenchError("--request-timeout and --drain-timeout must be >= 0")
    if max_event_bytes < 1024:
        raise BenchError("--max-event-bytes must be at least 1024")
    if not url and (sim_ttft_ms < 0 or sim_itl_ms < 0 or sim_natural_stop < 0):
        raise BenchError("--sim-ttft-ms, --sim-itl-ms and --sim-natural-stop must be >= 0")
    salt = secrets.randbits(32) if prompt_salt is None else prompt_salt
    timed = [k for k, _ in slo.limits if k != "e2e_ms"]

    def build(tokenize: str | None) -> Schedule:
        try:
            built = _build_schedule(
                workload_ref, n_requests, input_tokens, output_tokens, rate, arrival, concurrency, warmup, seed,
                tokenizer_dir, tokenize, model, salt,
            )
            built = built.with_request(request.over(built.request))
        except (WorkloadError, ValueError) as exc:
            raise BenchError(str(exc)) from None
        if built.request.stream is False and timed:
            raise BenchError(f"--slo {timed[0]}: non-streaming requests have no per-token times; judge them on e2e_ms")
        return built

    def make_adapter(sched: Schedule, version: str | None) -> Adapter:
        try:
            made = adapter_for_engine(engine, model=model, api=api, api_key=api_key, engine_version=version,
                                      extra_body=sched.request.extra_body)
        except (ValueError, TypeError) as exc:
            raise BenchError(f"--engine {engine}: {exc} (known: {', '.join(adapter_names())})") from None
        try:
            check_requests(made, sched.requests)
        except ValueError as exc:
            raise BenchError(f"--engine {engine}: {exc}") from None
        return made

    # 'auto' asks the engine measured, so its schedule is built once that engine answers
    schedule = None if tokenize_url == "auto" else build(tokenize_url)
    if launch and url:
        raise BenchError("--launch starts the engine itself: drop --url")
    if url:
        try:
            check_base_url(url)
        except ValueError as exc:
            raise BenchError(str(exc)) from None
    if scrape_interval <= 0:
        raise BenchError("--scrape-interval must be positive")
    api_key = load_api_key(api_key_env, api_key_file)
    try:
        adapter_for_engine(engine, model=model, api=api, api_key=api_key)  # an unknown engine fails here, early
    except (ValueError, TypeError) as exc:
        raise BenchError(f"--engine {engine}: {exc} (known: {', '.join(adapter_names())})") from None
    if schedule is not None:
        make_adapter(schedule, engine_version)  # requests an engine cannot take fail before anything starts
    clock = clock or ("virtual" if launch and engine == "sim" else "auto")
    virtual = _virtual_engine(clock, launch, engine, model, parallel_text, engine_args, gpu, workers, save_text)
    run_dir = prepare_run_dir(out, overwrite)
    command_line = ("bench", *sys.argv[1:])
    engine_info = None
    launched_version: str | None = None
    with contextlib.ExitStack() as stack:
        if url:
            target = url
            engine_label = engine
        elif virtual is not None:
            target, engine_label = "virtual:", "sim"
        elif launch:
            from bench.launch_engine import launch_engine

            handle = stack.enter_context(
                launch_engine(engine, model, parallel_text, engine_args, gpu, ready_timeout, run_dir / "engine.log",
                              engine_version)
            )
            target, engine_label, engine_info = handle.url, engine, handle.describe()
            launched_version = handle.version  # SGLang's stream shape depends on it
        else:
            target = stack.enter_context(
                embedded_engine(
                    run_dir / "engine.log",
                    ["--model", model, "--ttft-ms", str(sim_ttft_ms), "--itl-ms", str(sim_itl_ms),
                     "--flavor", sim_flavor(engine), "--natural-stop", str(sim_natural_stop),
                     "--reasoning-tokens", str(sim_reasoning_tokens), "--lora-swap-ms", str(sim_lora_swap_ms),
                     "--lora-adapters", ",".join((schedule.request if schedule else request).models)],
                )
            )
            engine_label = "sim"
        if schedule is None:
            schedule = build(target)
        adapter = make_adapter(schedule, launched_version or engine_version)
        cfg = RunConfig(
            out=run_dir,
            url=target,
            engine=engine_label,
            model=model,
            schedule=schedule,
            options=RunOptions(duration_s=duration, save_text=save_text, progress=progress,
                               drain_timeout_s=drain_timeout, max_event_bytes=max_event_bytes),
            timeouts=Timeouts(stall=stall_timeout, total=request_timeout or None),
            command=command_line,
            transport=transport_kind,
            clock=clock,
            workers=workers,
            scrape_interval_s=None if no_scrape else scrape_interval,
            engine_info=engine_info,
            engine_version=engine_version,
            config={
                "engine": engine_label,
                "engine_version": engine_version,
                "api": api,
                "slo": slo.as_dict(),
                "percentiles": list(percentiles),
                "sim": None if (url or launch) else {"ttft_ms": sim_ttft_ms, "itl_ms": sim_itl_ms, "flavor": sim_flavor(engine),
                                                     "natural_stop_mean": sim_natural_stop,
                                                     "reasoning_tokens": sim_reasoning_tokens},
                "request": schedule.request.describe(),
            },
        )
        if virtual is not None:
            from bench.virtual import execute_virtual

            result = execute_virtual(cfg, virtual)
        else:
            result = run_async(lambda: execute_run(cfg, adapter))
    summary = print_summary(result.run_dir, slo, percentiles, as_json)
    if result.stats.interrupted:
        raise Outcome(ExitCode.INTERRUPTED)
    outcome = run_outcome(summary)
    if outcome is not None:
        raise outcome


def _virtual_engine(
    clock: str,
    launch: bool,
    engine: str,
    model: str,
    parallel_text: str,
    engine_args: tuple[str, ...],
    gpu: str | None,
    workers: int,
    save_text: bool,
) -> VirtualEngine | None:
    """With ``--clock virtual``: the simulated engine's configuration to model (None otherwise)."""
    if clock != "virtual":
        return None
    if not (launch and engine == "sim"):
        raise BenchError("--clock virtual models the simulated engine: add --launch --engine sim --model PRESET")
    if workers != 1 or save_text:
        raise BenchError("--workers and --save-text concern a live run: measure in real time (--clock auto)")
    from bench.launch_engine import parse_parallel
    from adapters.launch.process import EngineStartError
    from bench.virtual import virtual_engine

    try:
        return virtual_engine(model, gpu, parse_parallel(parallel_text, engine_args))
    except EngineStartError as exc:
        raise BenchError(f"--launch sim: {exc}") from None


def _build_schedule(
    workload_ref: str | None,
    n_requests: int,
    input_tokens: int,
    output_tokens: int,
    rate: float | None,
    arrival: str | None,
    concurrency: int | None,
    warmup: int,
    seed: int,
    tokenizer_dir: Path | None = None,
    tokenize_url: str | None = None,
    model: str | None = None,
    salt: int | None = None,
) -> Schedule:
    if workload_ref:
        from workloads.catalog import build_named_schedule

        extra: dict[str, Any] = {}
        if tokenizer_dir is not None:
            extra["tokenizer"] = str(tokenizer_dir)
        if tokenize_url:
            extra["tokenize_url"] = tokenize_url
        if extra and model:
            extra["model"] = model
        extra["output_tokens"] = output_tokens  # only for dataset rows without an output length
        return build_named_schedule(
            workload_ref,
            requests=n_requests,
            rate=rate,
            arrival=arrival or "poisson",
            concurrency=concurrency,
            warmup=warmup,
            seed=seed,
            salt=salt,
            **extra,
        )
    arrival = arrival or "poisson"
    if arrival not in ("poisson", "constant"):
        raise WorkloadError(
            f"--arrival {arrival!r}: without --workload use poisson or constant "
            "(other processes with e.g. --workload fixed --arrival gamma:cv=2)"
        )
    if rate is None and concurrency is None:
        concurrency = 8
    return SyntheticWorkload(
        requests=n_requests,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        rate=rate,
        arrival=arrival,
        concurrency=concurrency,
        warmup=warmup,
        seed=seed,
        salt=salt,
    ).schedule(make_synth(str(tokenizer_dir) if tokenizer_dir else None, tokenize_url, model))
