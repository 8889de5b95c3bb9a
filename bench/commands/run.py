"""``bench run``: measure one workload against an engine."""

from __future__ import annotations

import contextlib
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bench_llm.adapters.base import Adapter, adapter_names, check_requests
from bench_llm.bench.errors import ExitCode, Outcome, setting_message
from bench_llm.bench.exact_prompts import OFF, exact_by_default, sample_prompts
from bench_llm.bench.request_options import request_options
from bench_llm.bench.run_options import (
    ClientOptions,
    EngineTarget,
    LoadOptions,
    OutputOptions,
    PhaseOptions,
    client_options,
    load_options,
    option_group,
    output_options,
    phase_options,
    target_options,
)
from bench_llm.bench.secrets import load_api_key
from bench_llm.core.errors import BenchError
from bench_llm.launch.profiles import adapter_for_engine
from bench_llm.loadgen.recorder import MAX_EVENT_BYTES
from bench_llm.loadgen.runner import RunOptions
from bench_llm.loadgen.transport import CLOCKS, DEFAULT_TOTAL_S, Timeouts, check_base_url
from bench_llm.workloads.prompts import without_credentials, word_prompts_exact
from bench_llm.workloads.spec import RequestOptions, Schedule

if TYPE_CHECKING:
    from bench_llm.bench.execute import RunConfig, RunResult
    from bench_llm.bench.virtual import VirtualEngine
    from bench_llm.launch.config import ParallelConfig
    from bench_llm.loadgen.otlp import OtlpReceiver


@dataclass(frozen=True)
class EmbeddedOptions:
    """The embedded simulated engine's timing (``bench run`` without ``--url`` or ``--launch``)."""

    sim_ttft_ms: float
    sim_itl_ms: float
    sim_reasoning_tokens: int
    sim_natural_stop: float
    sim_lora_swap_ms: float

    def argv(self, model: str, flavor: str, lora_adapters: Sequence[str] = ()) -> list[str]:
        return ["--model", model, "--ttft-ms", str(self.sim_ttft_ms), "--itl-ms", str(self.sim_itl_ms),
                "--flavor", flavor, "--natural-stop", str(self.sim_natural_stop),
                "--reasoning-tokens", str(self.sim_reasoning_tokens), "--lora-swap-ms", str(self.sim_lora_swap_ms),
                "--lora-adapters", ",".join(lora_adapters)]

    def describe(self, flavor: str) -> dict[str, Any]:
        return {"ttft_ms": self.sim_ttft_ms, "itl_ms": self.sim_itl_ms, "flavor": flavor,
                "natural_stop_mean": self.sim_natural_stop, "reasoning_tokens": self.sim_reasoning_tokens}


_embedded_options = option_group("embedded", (
    click.option("--sim-ttft-ms", type=float, default=50.0, show_default=True, help="Embedded engine: time to first token."),
    click.option("--sim-itl-ms", type=float, default=10.0, show_default=True, help="Embedded engine: inter-token latency."),
    click.option("--sim-reasoning-tokens", type=click.IntRange(0), default=0, show_default=True,
                 help="Embedded engine: chat answers start with this many reasoning tokens."),
    click.option("--sim-lora-swap-ms", type=click.FloatRange(0), default=0.0, show_default=True,
                 help="Embedded engine: it serves the --model-mix names as LoRA adapters, one resident at a time, and "
                      "loading one takes this long."),
    click.option("--sim-natural-stop", type=float, default=0.0, show_default=True, metavar="MEAN",
                 help="Embedded engine: requests not forced to their length end at a seeded end of sequence of this "
                      "mean length (0: never)."),
), lambda values: EmbeddedOptions(**{k: values.pop(k) for k in (
    "sim_ttft_ms", "sim_itl_ms", "sim_reasoning_tokens", "sim_natural_stop", "sim_lora_swap_ms")}))


@dataclass(frozen=True)
class LaunchOptions:
    """``--launch``: bench starts the engine at a parallel configuration and stops it after the run."""

    launch: bool
    parallel_text: str
    engine_args: tuple[str, ...]
    gpu: str | None
    engine_version: str | None
    ready_timeout: float


_launch_options = option_group("launch", (
    click.option("--launch", is_flag=True,
                 help="Start --engine (sim|vllm|sglang|tgi) with --model through bench's launcher; stop it after the run."),
    click.option("--parallel", "parallel_text", default="",
                 help="With --launch: parallel configuration, e.g. tp=2,dp=2 or tp=4,disagg=1:1."),
    click.option("--engine-arg", "engine_args", multiple=True, help="With --launch: one extra engine argument (repeatable)."),
    click.option("--gpu", help="With --launch: GPU preset of the simulated engine (h100, ...); informational otherwise."),
    click.option("--engine-version", default=None, metavar="VERSION",
                 help="The engine's version (e.g. 0.5.23, 3.3.6): picks version-gated launch flags and the /metrics "
                      "names it emits (docs/engines.md); default: what the launched engine reports, else every name."),
    click.option("--ready-timeout", type=float, default=600.0, show_default=True,
                 help="With --launch: seconds to wait for readiness."),
), lambda values: LaunchOptions(**{k: values.pop(k) for k in (
    "launch", "parallel_text", "engine_args", "gpu", "engine_version", "ready_timeout")}))


@dataclass(frozen=True)
class ClientLimits:
    """The client's per-request limits (``bench run`` only; the locust workers use their defaults)."""

    request_timeout: float
    drain_timeout: float
    max_event_bytes: int


_limit_options = option_group("limits", (
    click.option("--request-timeout", type=float, default=DEFAULT_TOTAL_S, show_default=True,
                 help="Max seconds for one whole request (0: no limit)."),
    click.option("--drain-timeout", type=float, default=30.0, show_default=True,
                 help="With --duration: seconds in-flight requests may still take (then recorded as cancelled)."),
    click.option("--max-event-bytes", type=int, default=MAX_EVENT_BYTES, show_default=True,
                 help="Longest SSE event or line of a response; longer fails the request (line_too_long)."),
), lambda values: ClientLimits(**{k: values.pop(k) for k in (
    "request_timeout", "drain_timeout", "max_event_bytes")}))


@click.command("run")
@target_options()
@load_options()
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(path_type=Path), help="Local HF tokenizer folder for exact prompt lengths.")
@click.option("--tokenize-url", help="Make prompt lengths exact with this engine's /tokenize; 'auto': the engine measured; "
                                    "'off': word approximations. Default: a launched or --url engine with a /tokenize "
                                    "route (vLLM, SGLang) is asked, and prompts are made exact where its count differs.")
@click.option("--prompt-salt", type=click.IntRange(0, 2**63 - 1),
              help="Mixed into the prompt text so runs share no cached prefix. [default: new per run]")
@client_options()
@_limit_options
@phase_options()
@output_options()
@_embedded_options
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal).")
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
@_launch_options
@click.option("--scrape-interval", type=float, default=1.0, show_default=True, help="Seconds between /metrics scrapes.")
@click.option("--no-scrape", is_flag=True, help="Do not scrape the engine's /metrics.")
@click.option("--otlp-receiver", is_flag=True,
              help="Receive the engine's per-request OpenTelemetry spans (OTLP/HTTP protobuf, POST /v1/traces on "
                   "127.0.0.1) and keep them in the run (server_spans.parquet) for the TTFT split; --launch "
                   "--engine vllm is pointed at it, other engines must be told the printed endpoint.")
@click.option("--otlp-port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="With --otlp-receiver: its port (0: any free one).")
@request_options
def command(
    target: EngineTarget,
    load: LoadOptions,
    tokenizer_dir: Path | None,
    tokenize_url: str | None,
    prompt_salt: int | None,
    client: ClientOptions,
    limits: ClientLimits,
    phases: PhaseOptions,
    output: OutputOptions,
    embedded: EmbeddedOptions,
    progress: bool | None,
    workers: int,
    transport_kind: str,
    clock: str | None,
    launch: LaunchOptions,
    scrape_interval: float,
    no_scrape: bool,
    otlp_receiver: bool,
    otlp_port: int,
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
    # The order of the checks is the order of the errors a user sees (cheap ones first, nothing
    # started before the input is known good); the steps are the functions below.
    from bench_llm.bench.embedded import sim_flavor
    from bench_llm.bench.execute import execute_run
    from bench_llm.core.eventloop import run_async
    from bench_llm.results.outdir import claim_run_folder, took_over_note

    url, engine, model = target.url, target.engine, target.model
    _check_limits(load, client, limits, embedded if not url else None)
    phases.check(load.duration)
    salt = secrets.randbits(32) if prompt_salt is None else prompt_salt
    plan = _SchedulePlan(load, request, output, tokenizer_dir, model, salt)
    # 'auto' asks the engine measured, so its schedule is built once that engine answers
    check = exact_by_default(tokenize_url, tokenizer_dir, engine, bool(url or launch.launch))
    tokenize_url = None if tokenize_url in OFF else tokenize_url
    schedule = None if (tokenize_url == "auto" or check) else plan.build(tokenize_url)
    _check_target(target, launch, scrape_interval)
    api_key = load_api_key(client.api_key_env, client.api_key_file)
    _check_engine(target, api_key, schedule, launch.engine_version)
    clock = clock or ("virtual" if launch.launch and engine == "sim" else "auto")
    virtual = _virtual_engine(clock, launch, engine, model, workers, output.save_text)
    # one writer per folder; a previous run replaced only when the folder holds nothing else
    lock = claim_run_folder(output.out, output.overwrite, ("bench", *sys.argv[1:]))
    run_dir = lock.folder
    with contextlib.ExitStack() as stack:
        stack.callback(lock.release)  # the last thing the stack does
        note = took_over_note(lock)
        if note:
            sys.stderr.write(f"note: {note}\n")
        embedded_sim = not url and not launch.launch  # the embedded engine: told the endpoint too
        receiver = (_otlp_receiver(stack, otlp_port, "sim" if embedded_sim else engine, launch.launch or embedded_sim)
                    if otlp_receiver else None)  # fmt: skip
        if receiver is not None and virtual is not None:
            raise BenchError("--otlp-receiver: a run in virtual time has no engine to send spans; use --clock auto")
        where, engine_label, engine_info, launched_version = _start_target(
            stack, target, launch, embedded, virtual is not None, run_dir,
            receiver.endpoint if receiver is not None else None,
            tuple((schedule.request if schedule else request).models),  # the embedded engine serves them as adapters
        )
        if schedule is None:
            schedule = plan.exact_where_engine_can_say(where) if check else plan.build(where)
        adapter = _make_adapter(target, api_key, schedule, launched_version or launch.engine_version)
        cfg = _run_config(
            target, load, client, limits, phases, output, launch, run_dir, where, engine_label, schedule, progress,
            transport_kind, clock, workers, None if no_scrape else scrape_interval, engine_info,
            None if (url or launch.launch) else embedded.describe(sim_flavor(engine)),
        )
        if virtual is not None:
            from bench_llm.bench.virtual import execute_virtual

            result = execute_virtual(cfg, virtual)
        else:
            result = run_async(lambda: execute_run(cfg, adapter, otlp=receiver))
    _report(result, output)


def _check_target(target: EngineTarget, launch: LaunchOptions, scrape_interval: float) -> None:
    """The target's settings, checked before anything starts: --launch with --url, the URL's
    form, the scrape interval."""
    url = target.url
    if launch.launch and url:
        raise BenchError("--launch starts the engine itself: drop --url")
    if url:
        try:
            check_base_url(url)
        except ValueError as exc:
            raise BenchError(setting_message(exc)) from None
    if scrape_interval <= 0:
        raise BenchError("--scrape-interval must be positive")
    if launch.launch:
        from bench_llm.bench.launch_engine import parse_parallel

        _check_layout(target.engine, target.model, parse_parallel(launch.parallel_text, launch.engine_args))


def _check_layout(engine: str, model: str, parallel: ParallelConfig) -> None:
    """A layout the model's shape cannot take (known for the simulated engine's presets) is
    refused by name before the engine starts (core/layout.py; the engine's own refusals come
    from its launch plan)."""
    from bench_llm.bench.sweep.matrix import model_shape
    from bench_llm.core.layout import Layout, shape_problems

    shape = model_shape(engine, model)
    if shape is None:
        return
    problems = shape_problems(Layout(parallel.tp, parallel.pp, parallel.dp, parallel.ep, parallel.dcp, parallel.pcp),
                              shape)  # fmt: skip
    if problems:
        raise BenchError(f"--parallel {parallel.cell_id}: " + "; ".join(problems))


def _check_engine(target: EngineTarget, api_key: str | None, schedule: Schedule | None,
                  engine_version: str | None) -> None:
    """An unknown engine fails here, early; with the schedule already built, so do requests
    the engine cannot take (before anything starts)."""
    engine = target.engine
    try:
        adapter_for_engine(engine, model=target.model, api=target.api, api_key=api_key)
    except (ValueError, TypeError) as exc:
        raise BenchError(f"--engine {engine}: {exc} (known: {', '.join(adapter_names())})") from None
    if schedule is not None:
        _make_adapter(target, api_key, schedule, engine_version)


def _report(result: RunResult, output: OutputOptions) -> None:
    """Print the run's summary; the exit outcome when it was interrupted or mostly failed."""
    from bench_llm.bench.outcome import run_outcome
    from bench_llm.bench.report_text import print_summary

    if result.write_error is not None:  # a full disk: what was written is kept, marked interrupted
        try:
            print_summary(result.run_dir, output.slo, output.percentiles, output.as_json)
        except Exception:  # noqa: BLE001 - the run's own error line below says what happened
            pass
        raise Outcome(ExitCode.INTERRUPTED, f"error: {result.write_error}")
    summary = print_summary(result.run_dir, output.slo, output.percentiles, output.as_json)
    if result.stats.interrupted:
        raise Outcome(ExitCode.INTERRUPTED)
    outcome = run_outcome(summary)
    if outcome is not None:
        raise outcome


def _otlp_receiver(stack: contextlib.ExitStack, port: int, engine: str, launch: bool) -> OtlpReceiver:
    """A started OTLP receiver, stopped when the run's stack closes."""
    from bench_llm.bench.launch_engine import otlp_note
    from bench_llm.loadgen.otlp import OtlpReceiver

    try:
        receiver = stack.enter_context(OtlpReceiver("127.0.0.1", port))
    except OSError as exc:
        raise BenchError(f"--otlp-port {port}: {exc}") from None
    how = otlp_note(engine, launch)
    sys.stderr.write(f"OTLP receiver at {receiver.endpoint} ({how})\n")
    return receiver


def _start_target(
    stack: contextlib.ExitStack,
    target: EngineTarget,
    launch: LaunchOptions,
    embedded: EmbeddedOptions,
    virtual: bool,
    run_dir: Path,
    otlp_endpoint: str | None = None,
    lora_adapters: Sequence[str] = (),
) -> tuple[str, str, dict[str, Any] | None, str | None]:
    """The engine measured: (where it answers, its engine label, what the launcher says about
    it, its reported version): the ``--url`` given, virtual time, an engine ``--launch``ed,
    else the embedded engine (the last two stop when ``stack`` closes)."""
    engine, model = target.engine, target.model
    if target.url:
        return target.url, engine, None, _reported_version(engine, target.url, launch.engine_version)
    if virtual:
        return "virtual:", "sim", None, None
    if launch.launch:
        from bench_llm.bench.launch_engine import launch_engine

        handle = stack.enter_context(
            launch_engine(engine, model, launch.parallel_text, launch.engine_args, launch.gpu,
                          launch.ready_timeout, run_dir / "engine.log", launch.engine_version,
                          otlp_endpoint=otlp_endpoint)
        )
        return handle.url, engine, handle.describe(), handle.version  # SGLang's stream shape depends on the version
    from bench_llm.bench.embedded import embedded_engine, sim_flavor

    argv = embedded.argv(model, sim_flavor(engine), lora_adapters)
    if otlp_endpoint is not None:  # the embedded engine exports its request spans too (sim/otlp.py)
        from bench_llm.launch.engines import sim_otlp_args

        argv = [*argv, *sim_otlp_args(otlp_endpoint)]
    where = stack.enter_context(embedded_engine(run_dir / "engine.log", argv))
    return where, "sim", None, None


def _reported_version(engine: str, url: str, given: str | None) -> str | None:
    """The release the engine at ``url`` reports, for an engine whose stream and timings depend
    on it (SGLang: adapters/sglang.py, analysis/ttft_rules.py), unless ``--engine-version`` said;
    None when it does not answer."""
    from bench_llm.core.control import EngineClient
    from bench_llm.launch.profiles import profile

    prof = profile(engine)
    if given or not prof.adapter_takes_version or not prof.routes.version:
        return None
    return EngineClient(url, timeout_s=5).version(prof.routes.version)


def _check_limits(load: LoadOptions, client: ClientOptions, limits: ClientLimits, embedded: EmbeddedOptions | None) -> None:
    """The run's own numeric limits (the workload's are checked where it is built)."""
    if load.duration is not None and load.duration <= 0:
        raise BenchError("--duration must be positive")
    if client.stall_timeout <= 0:
        raise BenchError("--stall-timeout must be positive")
    if limits.request_timeout < 0 or limits.drain_timeout < 0:
        raise BenchError("--request-timeout and --drain-timeout must be >= 0")
    if limits.max_event_bytes < 1024:
        raise BenchError("--max-event-bytes must be at least 1024")
    if embedded is not None and (embedded.sim_ttft_ms < 0 or embedded.sim_itl_ms < 0 or embedded.sim_natural_stop < 0):
        raise BenchError("--sim-ttft-ms, --sim-itl-ms and --sim-natural-stop must be >= 0")


@dataclass(frozen=True)
class _SchedulePlan:
    """What the schedule is built from; built once the tokenizer to use is known."""

    load: LoadOptions
    request: RequestOptions
    output: OutputOptions
    tokenizer_dir: Path | None
    model: str
    salt: int

    def build(self, tokenize: str | None) -> Schedule:
        try:
            built = self.load.schedule(salt=self.salt, tokenizer_dir=self.tokenizer_dir, tokenize_url=tokenize,
                                       model=self.model)
            built = built.with_request(self.request.over(built.request))
        except ValueError as exc:
            raise BenchError(setting_message(exc)) from None
        timed = [k for k, _ in self.output.slo.limits if k not in ("e2e_ms", "job_ms")]
        if built.request.stream is False and timed:
            raise BenchError(f"--slo {timed[0]}: non-streaming requests have no per-token times; judge them on e2e_ms")
        return built

    def exact_where_engine_can_say(self, where: str) -> Schedule:
        """Word prompts, checked against the engine's /tokenize: kept where it counts them at
        their requested lengths, made exact through it where not (with a note); kept where the
        engine cannot say, whose summary then says how far off they were (``--tokenize-url off``
        skips the check)."""
        words = self.build(None)
        exact, why = word_prompts_exact(where, self.model, sample_prompts(words))
        if exact is not False:  # exact already, or the engine cannot say: the summary compares the lengths sent
            return words
        try:
            built = self.build(where)
        except BenchError as exc:
            failed = str(exc).replace(where.rstrip("/"), without_credentials(where).rstrip("/"))
            sys.stderr.write(f"note: prompt lengths are word approximations: {why}, and exact ones failed ({failed})\n")
            return words
        sys.stderr.write(f"note: prompts made exact with {without_credentials(where)}/tokenize ({why}; "
                         "--tokenize-url off keeps them)\n")
        return built


def _make_adapter(target: EngineTarget, api_key: str | None, sched: Schedule, version: str | None) -> Adapter:
    """The engine's adapter for this schedule; ``BenchError`` naming ``--engine`` for requests it cannot take."""
    engine = target.engine
    try:
        made = adapter_for_engine(engine, model=target.model, api=target.api, api_key=api_key, engine_version=version,
                                  extra_body=sched.request.extra_body)
    except (ValueError, TypeError) as exc:
        raise BenchError(f"--engine {engine}: {exc} (known: {', '.join(adapter_names())})") from None
    try:
        check_requests(made, sched.requests)
    except ValueError as exc:
        raise BenchError(f"--engine {engine}: {setting_message(exc)}") from None
    return made


def _run_config(
    target: EngineTarget,
    load: LoadOptions,
    client: ClientOptions,
    limits: ClientLimits,
    phases: PhaseOptions,
    output: OutputOptions,
    launch: LaunchOptions,
    run_dir: Path,
    where: str,
    engine_label: str,
    schedule: Schedule,
    progress: bool | None,
    transport_kind: str,
    clock: str,
    workers: int,
    scrape_interval_s: float | None,
    engine_info: dict[str, Any] | None,
    sim: dict[str, Any] | None,
) -> RunConfig:
    """The ``RunConfig`` of this run (``config_json`` through ``OutputOptions.config``)."""
    from bench_llm.bench.execute import RunConfig

    return RunConfig(
        out=run_dir,
        url=where,
        engine=engine_label,
        model=target.model,
        schedule=schedule,
        options=RunOptions(duration_s=load.duration, save_text=output.save_text, progress=progress,
                           drain_timeout_s=limits.drain_timeout, max_event_bytes=limits.max_event_bytes,
                           warmup_s=phases.warmup_s, cooldown_s=phases.cooldown_s),
        timeouts=Timeouts(stall=client.stall_timeout, total=limits.request_timeout or None),
        command=("bench", *sys.argv[1:]),
        transport=transport_kind,
        clock=clock,
        workers=workers,
        scrape_interval_s=scrape_interval_s,
        engine_info=engine_info,
        engine_version=launch.engine_version,
        config=output.config(engine_label, target.api, engine_version=launch.engine_version, sim=sim,
                             request=schedule.request.describe()),
    )


def _virtual_engine(
    clock: str, launch: LaunchOptions, engine: str, model: str, workers: int, save_text: bool
) -> VirtualEngine | None:
    """With ``--clock virtual``: the simulated engine's configuration to model (None otherwise)."""
    if clock != "virtual":
        return None
    if not (launch.launch and engine == "sim"):
        raise BenchError("--clock virtual models the simulated engine: add --launch --engine sim --model PRESET")
    if workers != 1 or save_text:
        raise BenchError("--workers and --save-text concern a live run: measure in real time (--clock auto)")
    from bench_llm.bench.launch_engine import parse_parallel
    from bench_llm.bench.virtual import virtual_engine
    from bench_llm.launch.process import EngineStartError

    try:
        return virtual_engine(model, launch.gpu, parse_parallel(launch.parallel_text, launch.engine_args))
    except EngineStartError as exc:
        raise BenchError(f"--launch sim: {exc}") from None
