"""``bench run --launch``: launch an engine at the ``--parallel`` configuration, with one-line user errors."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from launch.config import ParallelConfig
from launch.launcher import EngineHandle, LaunchSpec, launch
from launch.process import EngineStartError
from core.errors import BenchError


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
    """With ``otlp_endpoint`` (bench's OTLP receiver), vLLM is told to export its request spans
    there (``--otlp-traces-endpoint``, OTLP/HTTP protobuf, batches every 0.5 s); other engines
    are launched as they are."""
    env: tuple[tuple[str, str], ...] = ()
    if otlp_endpoint is not None and engine == "vllm":
        engine_args = (*engine_args, "--otlp-traces-endpoint", otlp_endpoint)
        env = VLLM_OTLP_ENV
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
