"""Starting and checking the engine of one cell.

The sweep talks to engines through a small ``Launcher`` protocol so its orchestration can be
tested with fakes; the default wraps ``adapters.launch.launcher`` (launch, readiness, log,
process-group teardown).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from adapters.launch.config import ParallelConfig
from adapters.launch.process import EngineStartError, log_tail
from core.control import EngineClient

__all__ = ["EngineStartError", "Handle", "Launcher", "DefaultLauncher", "CellEngine", "reset_prefix_cache", "alive"]


@dataclass(frozen=True)
class CellEngine:
    """What a launcher needs to start one cell's engine."""

    engine: str
    model: str
    gpu: str | None
    parallel: ParallelConfig
    gpus_available: int | None
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    ready_timeout_s: float = 600.0
    engine_version: str | None = None


class Handle(Protocol):
    url: str
    log_path: Path

    def stop(self) -> None: ...


class Launcher(Protocol):
    def unsupported(self, engine: str, parallel: ParallelConfig) -> list[str]: ...

    def start(self, cell: CellEngine, log_path: Path) -> Handle: ...


class DefaultLauncher:
    """The project's launchers (adapters/launch/launcher.py)."""

    def _module(self):  # type: ignore[no-untyped-def]
        try:
            from adapters.launch import launcher
        except ImportError as exc:
            from core.errors import BenchError

            raise BenchError(f"engine launching is not available in this install ({exc})") from None
        return launcher

    def unsupported(self, engine: str, parallel: ParallelConfig) -> list[str]:
        return list(self._module().unsupported_axes(engine, parallel))

    def start(self, cell: CellEngine, log_path: Path) -> Handle:
        mod = self._module()
        spec = mod.LaunchSpec(
            engine=cell.engine,
            model=cell.model,
            parallel=cell.parallel,
            gpu=cell.gpu,
            gpus_available=cell.gpus_available,
            extra_args=tuple(cell.extra_args),
            env=tuple(cell.env),
            ready_timeout_s=cell.ready_timeout_s,
            engine_version=cell.engine_version,
        )
        return mod.launch(spec, log_path)  # type: ignore[no-any-return]


#: Engine -> (method, path) that empties its prefix cache. TGI has none. SGLang refuses (400)
#: while requests are pending, e.g. ones cancelled at the drain deadline still finishing; from
#: 0.5.12 ``timeout`` waits up to that many seconds for idle (older releases ignore it).
_FLUSH_WAIT_S = 30
_RESET_PREFIX: dict[str, Sequence[tuple[str, str]]] = {
    "vllm": (("POST", "/reset_prefix_cache"),),
    "sim": (("POST", "/reset_prefix_cache"),),
    "sglang": (("POST", f"/flush_cache?timeout={_FLUSH_WAIT_S}"), ("GET", f"/flush_cache?timeout={_FLUSH_WAIT_S}")),
}


def reset_prefix_cache(engine: str, url: str) -> str:
    """Empty the engine's prefix cache where it allows; returns what happened (for the record)."""
    routes = _RESET_PREFIX.get(engine)
    if not routes:
        return f"not supported by {engine}"
    client = EngineClient(url, timeout_s=_FLUSH_WAIT_S + 10)
    last = ""
    for method, path in routes:
        reply = client.post(path) if method == "POST" else client.get(path)
        if reply.ok:
            return "reset"
        last = reply.problem()
    return f"not reset ({last})"


def alive(url: str, engine: str) -> bool:
    """Does the engine still answer its health probe?"""
    reply = EngineClient(url).health(timeout_s=5)
    # an error page below 500 (auth, not found) still comes from a live server
    return reply.status is not None and reply.status < 500


def tail(path: Path, lines: int = 20) -> str:
    return log_tail(path, lines)
