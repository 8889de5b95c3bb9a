"""``bench run --launch``: launch an engine at the ``--parallel`` configuration, with one-line user errors."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench_llm.core.errors import BenchError
from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.launcher import EngineHandle, LaunchSpec, launch
from bench_llm.launch.process import EngineStartError


def parse_parallel(text: str, extra_args: Sequence[str] = ()) -> ParallelConfig:
    """``--parallel`` text → ParallelConfig; the flag is named here, in the CLI, only."""
    try:
        return ParallelConfig.parse(text, extra_args)
    except ValueError as exc:
        raise BenchError(f"--parallel {text!r}: {exc}") from None


#: vLLM's span exporter: OTLP over HTTP with protobuf bodies (what bench's receiver decodes),
#: exported every 0.5 s instead of 5 s so a run's last spans arrive soon after it ends.
VLLM_OTLP_ENV: tuple[tuple[str, str], ...] = (
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
    ("OTEL_BSP_SCHEDULE_DELAY", "500"),
)


def otlp_launch(engine: str, endpoint: str) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The arguments and environment that point ``engine`` at bench's OTLP receiver (docs/engines.md,
    "Request spans"); nothing for an engine without span export."""
    from bench_llm.launch import engines

    if engine == "vllm":
        return ("--otlp-traces-endpoint", endpoint), VLLM_OTLP_ENV
    if engine == "sglang":
        return engines.sglang_otlp_args(endpoint), engines.SGLANG_OTLP_ENV
    if engine == "tgi":
        return engines.tgi_otlp_args(endpoint), ()
    if engine == "sim":
        return engines.sim_otlp_args(endpoint), ()
    return (), ()


def otlp_note(engine: str, launched: bool) -> str:
    """What the user is told about an engine and bench's OTLP receiver."""
    if engine == "tgi":
        return ("TGI exports its spans over OTLP/gRPC only, which this OTLP/HTTP receiver cannot take, and names "
                "no request on them: its TTFT split falls back to the histograms")
    if launched and engine in ("vllm", "sglang", "sim"):
        return f"the {'simulated engine' if engine == 'sim' else 'launched ' + engine} exports its request spans to it"
    return "point the engine's OTLP/HTTP protobuf trace exporter at it"


@contextlib.contextmanager
def launch_engine(
    engine: str,
    model: str,
    parallel_text: str,
    engine_args: Sequence[str],
    gpu: str | None,
    ready_timeout_s: float,
    log_path: Path,
    engine_version: str | None = None,
    otlp_endpoint: str | None = None,
) -> Iterator[EngineHandle]:
    """With ``otlp_endpoint`` (bench's OTLP receiver), the engine is told to export its request
    spans there (``otlp_launch``: vLLM and SGLang over OTLP/HTTP protobuf, batches every 0.5 s;
    TGI's flags, though its gRPC export cannot reach bench's receiver; the simulated engine)."""
    env: tuple[tuple[str, str], ...] = ()
    if otlp_endpoint is not None:
        args, env = otlp_launch(engine, otlp_endpoint)
        engine_args = (*engine_args, *args)
    parallel = parse_parallel(parallel_text, engine_args)
    spec = LaunchSpec(engine=engine, model=model, parallel=parallel, gpu=gpu, ready_timeout_s=ready_timeout_s,
                      engine_version=engine_version, env=env)
    sys.stderr.write(f"starting {engine} ({parallel.cell_id}); engine log: {log_path}\n")
    try:
        handle = launch(spec, log_path)
    except EngineStartError as exc:
        raise BenchError(f"--launch {engine}: {exc}") from None
    sys.stderr.write(f"{engine} {handle.version or ''} ready at {handle.url}\n")
    try:
        yield handle
    finally:
        handle.stop()
