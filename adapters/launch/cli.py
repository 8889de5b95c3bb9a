"""``bench run --launch``: parse the CLI's parallel text and launch, with one-line user errors."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from adapters.launch.config import Disagg, ParallelConfig
from adapters.launch.launcher import EngineHandle, LaunchSpec, launch
from adapters.launch.process import EngineStartError
from bench.errors import BenchError

_INT_AXES = ("tp", "pp", "dp", "ep", "dcp", "pcp")


def parse_parallel(text: str, extra_args: Sequence[str] = ()) -> ParallelConfig:
    """``"tp=2,dp=2,disagg=1:1"`` → ParallelConfig (empty text: one GPU, no parallelism)."""
    values: dict[str, object] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep:
            raise BenchError(f"--parallel {text!r}: expected key=value pairs like tp=2,dp=2")
        try:
            if key in _INT_AXES:
                values[key] = int(value)
            elif key == "disagg":
                values[key] = Disagg.parse(value.strip())
            else:
                raise BenchError(f"--parallel: unknown axis {key!r} (known: {', '.join(_INT_AXES)}, disagg)")
        except ValueError as exc:
            raise BenchError(f"--parallel {part!r}: {exc}") from None
    try:
        return ParallelConfig(**values, extra_args=tuple(extra_args))  # type: ignore[arg-type]
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
