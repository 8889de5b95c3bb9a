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
) -> Iterator[EngineHandle]:
    parallel = parse_parallel(parallel_text, engine_args)
    spec = LaunchSpec(engine=engine, model=model, parallel=parallel, gpu=gpu, ready_timeout_s=ready_timeout_s,
                      engine_version=engine_version)
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
