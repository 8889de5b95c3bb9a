"""The options ``bench run`` and ``bench locust master`` share, declared once, as option groups.

Each group is one decorator: it adds its click options to a command and hands the command one
frozen dataclass (``target: EngineTarget``, ``load: LoadOptions``, ``client: ClientOptions``,
``output: OutputOptions``) instead of the loose values. ``distributed=True`` words the help
for the locust master, where a rate or a concurrency is over all workers and the API key is
read on each worker's machine; the options themselves (names, types, defaults) are the same.

This module imports click only: the commands' ``--help`` stays cheap.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bench_llm.bench.options import OutPath

if TYPE_CHECKING:
    from bench_llm.analysis.slo import SLO
    from bench_llm.workloads.spec import Schedule

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def option_group(param: str, options: Sequence[Decorator], build: Callable[[dict[str, Any]], object]) -> Decorator:
    """A decorator adding ``options`` to a click command; the command receives
    ``param=build(values)``, where ``build`` pops the option values it reads."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def with_group(**kwargs: Any) -> Any:
            kwargs[param] = build(kwargs)
            return func(**kwargs)

        wrapper: Callable[..., Any] = with_group
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return decorate


def _pop_fields(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    return {f.name: values.pop(f.name) for f in fields(cls)}


@dataclass(frozen=True)
class EngineTarget:
    """Which engine is measured and how it is spoken to."""

    url: str | None
    engine: str
    api: str
    model: str


def target_options(distributed: bool = False) -> Decorator:
    """``--url --engine --api --model``; the locust master requires ``--url`` (its workers reach it)."""
    embedded = " Without --url the embedded engine speaks it too."
    options = (
        click.option(
            "--url",
            required=distributed,
            help="Engine base URL, as the workers reach it." if distributed else
            "Engine base URL (e.g. http://127.0.0.1:8000). Default: start the embedded simulated engine.",
        ),
        click.option("--engine", default="vllm", show_default=True,
                     help="API flavour to speak: vllm/openai (OpenAI-compatible), sglang, tgi, generic."
                     + ("" if distributed else embedded)),
        click.option("--api", type=click.Choice(["completions", "chat"]), default="completions", show_default=True),
        click.option("--model", default="sim-model", show_default=True, help="Model name sent with each request."),
    )
    return option_group("target", options, lambda values: EngineTarget(**_pop_fields(EngineTarget, values)))


@dataclass(frozen=True)
class LoadOptions:
    """The workload and how it is offered (``workload``: a named workload or file, else synthetic)."""

    workload: str | None
    requests: int
    input_tokens: int
    output_tokens: int
    rate: float | None
    arrival: str | None
    concurrency: int | None
    warmup: int
    seed: int
    duration: float | None

    def schedule(
        self,
        *,
        salt: int | None = None,
        tokenizer_dir: Path | None = None,
        tokenize_url: str | None = None,
        model: str | None = None,
    ) -> Schedule:
        """The schedule these options describe; ``WorkloadError`` (a ``ValueError``) for bad ones."""
        from bench_llm.workloads.errors import WorkloadError

        arrival = self.arrival or "poisson"
        if self.workload:
            from bench_llm.workloads.catalog import build_named_schedule

            extra: dict[str, Any] = {}
            if tokenizer_dir is not None:
                extra["tokenizer"] = str(tokenizer_dir)
            if tokenize_url:
                extra["tokenize_url"] = tokenize_url
            if extra and model:
                extra["model"] = model
            extra["output_tokens"] = self.output_tokens  # only for dataset rows without an output length
            return build_named_schedule(
                self.workload, requests=self.requests, rate=self.rate, arrival=arrival,
                concurrency=self.concurrency, warmup=self.warmup, seed=self.seed, salt=salt, **extra,
            )
        from bench_llm.workloads.prompts import make_synth
        from bench_llm.workloads.synthetic import SyntheticWorkload

        if arrival not in ("poisson", "constant"):
            raise WorkloadError(
                f"--arrival {arrival!r}: without --workload use poisson or constant "
                "(other processes with e.g. --workload fixed --arrival gamma:cv=2)"
            )
        concurrency = 8 if self.rate is None and self.concurrency is None else self.concurrency
        return SyntheticWorkload(
            requests=self.requests, input_tokens=self.input_tokens, output_tokens=self.output_tokens,
            rate=self.rate, arrival=arrival, concurrency=concurrency, warmup=self.warmup, seed=self.seed, salt=salt,
        ).schedule(make_synth(str(tokenizer_dir) if tokenizer_dir else None, tokenize_url, model))


def load_options(distributed: bool = False) -> Decorator:
    """``--workload --requests --input-tokens --output-tokens --rate --arrival --concurrency
    --warmup --seed --duration``."""
    over_all = " over all workers" if distributed else ""
    options = (
        click.option("--workload", help="Named workload or TOML file (see `bench workload show`)."),
        click.option("--requests", type=int, default=100, show_default=True, help="Measured requests."),
        click.option("--input-tokens", type=int, default=256, show_default=True),
        click.option("--output-tokens", type=int, default=128, show_default=True),
        click.option("--rate", type=float, help=f"Open loop: mean requests/s{over_all}."),
        click.option(
            "--arrival",
            default=None,
            help="Open-loop arrivals (default poisson): poisson, constant; with --workload also "
            "gamma:cv=2, onoff, ramp, steps, trace (see docs/workloads.md).",
        ),
        click.option("--concurrency", type=int,
                     help=f"Closed loop: requests {'in flight over all workers' if distributed else 'kept in flight'}."),
        click.option("--warmup", type=int, default=0, show_default=True,
                     help=f"Warm-up requests ({'run by worker 0 before t0' if distributed else 'recorded, excluded'})."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--duration", type=float, help="Stop sending after this many seconds."),
    )
    return option_group("load", options, lambda values: LoadOptions(**_pop_fields(LoadOptions, values)))


@dataclass(frozen=True)
class PhaseOptions:
    """The time-based warm-up and cool-down (``loadgen.options.RunOptions.phase_at``): requests
    due in the first ``warmup_s`` after t0, or in the last ``cooldown_s`` of ``--duration``, are
    recorded with their phase and excluded from every metric."""

    warmup_s: float
    cooldown_s: float

    def check(self, duration: float | None) -> None:
        """``BenchError`` when the phases do not fit the run (RunOptions' own rule)."""
        from bench_llm.core.errors import BenchError
        from bench_llm.loadgen.options import RunOptions

        try:
            RunOptions(duration_s=duration, warmup_s=self.warmup_s, cooldown_s=self.cooldown_s)
        except ValueError as exc:
            raise BenchError(f"--warmup-s/--cooldown-s/--duration: {exc}") from None


def phase_options(distributed: bool = False) -> Decorator:
    """``--warmup-s --cooldown-s``."""
    t0 = "the shared t0 (every worker)" if distributed else "t0"
    options = (
        click.option("--warmup-s", type=float, default=0.0, show_default=True,
                     help=f"Time-based warm-up: requests due in the first S seconds after {t0} are recorded, excluded."),
        click.option("--cooldown-s", type=float, default=0.0, show_default=True,
                     help="With --duration: requests due in the last S seconds are recorded, excluded."),
    )
    return option_group("phases", options, lambda values: PhaseOptions(**_pop_fields(PhaseOptions, values)))


@dataclass(frozen=True)
class ClientOptions:
    """How the client waits and authenticates (the key itself is read where the client runs)."""

    stall_timeout: float
    api_key_env: str
    api_key_file: Path | None


def client_options(distributed: bool = False) -> Decorator:
    """``--stall-timeout --api-key-env --api-key-file``."""
    options = (
        click.option("--stall-timeout", type=float, default=120.0, show_default=True,
                     help="Max seconds without data (SSE comments and keep-alives are not data)."),
        click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True,
                     help="Read by each worker from ITS environment." if distributed else
                     "Environment variable with the API key."),
        click.option("--api-key-file", type=click.Path(path_type=Path),
                     help="Path read by each worker on its own machine." if distributed else "File holding the API key."),
    )
    return option_group("client", options, lambda values: ClientOptions(**_pop_fields(ClientOptions, values)))


@dataclass(frozen=True)
class OutputOptions:
    """Where the run goes and how its summary is judged and printed."""

    out: Path
    overwrite: bool
    save_text: bool
    slo: SLO
    percentiles: tuple[float, ...]
    as_json: bool

    def config(self, engine: str, api: str, **more: Any) -> dict[str, Any]:
        """``run.parquet`` ``config_json`` for a run with these options (``bench.run_meta.run_config``)."""
        from bench_llm.bench.run_meta import run_config

        return run_config(engine, api, self.slo, self.percentiles, **more)


def _output(values: dict[str, Any]) -> OutputOptions:
    from bench_llm.bench.options import parse_percentiles, parse_slo

    return OutputOptions(
        out=values.pop("out"),
        overwrite=values.pop("overwrite"),
        save_text=values.pop("save_text"),
        slo=parse_slo(values.pop("slo_text")),
        percentiles=parse_percentiles(values.pop("pct_text")),
        as_json=values.pop("as_json"),
    )


def output_options(distributed: bool = False) -> Decorator:
    """``--out --overwrite --save-text --slo --percentiles --json``; the SLOs and percentiles
    are parsed here (``BenchError`` for bad ones)."""
    options = (
        click.option("--out", type=OutPath(path_type=Path), required=True,
                     help="Run folder to create (on the master)." if distributed else "Run folder to create."),
        click.option("--overwrite", is_flag=True, help="Replace an existing run in --out."),
        click.option("--save-text", is_flag=True, help="Store generated text in the results (off by default)."),
        click.option("--slo", "slo_text", help="SLOs for goodput, e.g. ttft_ms=500,tpot_ms=50."),
        click.option("--percentiles", "pct_text", default="50,90,95,99", show_default=True),
        click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON."),
    )
    return option_group("output", options, _output)
