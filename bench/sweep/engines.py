"""Starting and checking the engine of one cell.

The sweep talks to engines through a small ``Launcher`` protocol so its orchestration can be
tested with fakes; the default wraps ``adapters.launch.launcher`` (launch, readiness, log,
process-group teardown).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from adapters.launch.config import ParallelConfig
from adapters.launch.process import EngineStartError, log_tail

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
            from bench.errors import BenchError

            raise BenchError(f"engine launching is not available in this install ({exc})") from None
        return launcher

    def unsupported(self, engine: str, parallel: ParallelConfig) -> list[str]:
        return list(self._module().unsupported_axes(engine, parallel))

    def _launch_spec(self, cell: CellEngine) -> Any:
        return self._module().LaunchSpec(
            engine=cell.engine,
            model=cell.model,
            parallel=cell.parallel,
            gpu=cell.gpu,
            gpus_available=cell.gpus_available,
            extra_args=tuple(cell.extra_args),
            env=tuple(cell.env),
            ready_timeout_s=cell.ready_timeout_s,
        )

    def start(self, cell: CellEngine, log_path: Path) -> Handle:
        return self._module().launch(self._launch_spec(cell), log_path)  # type: ignore[no-any-return]

    def plan(self, cell: CellEngine) -> list[Any]:
        """The processes ``start`` would run (``PlannedProcess``), starting nothing (a dry run)."""
        return list(self._module().plan_launch(self._launch_spec(cell)))


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))

#: Engine -> (method, path) that empties its prefix cache. TGI has none.
_RESET_PREFIX: dict[str, Sequence[tuple[str, str]]] = {
    "vllm": (("POST", "/reset_prefix_cache"),),
    "sim": (("POST", "/reset_prefix_cache"),),
    "sglang": (("POST", "/flush_cache"), ("GET", "/flush_cache")),
}


def reset_prefix_cache(engine: str, url: str) -> str:
    """Empty the engine's prefix cache where it allows; returns what happened (for the record)."""
    routes = _RESET_PREFIX.get(engine)
    if not routes:
        return f"not supported by {engine}"
    last = ""
    for method, path in routes:
        req = urllib.request.Request(url.rstrip("/") + path, method=method, data=b"" if method == "POST" else None)
        try:
            with _OPENER.open(req, timeout=10) as resp:
                if 200 <= resp.status < 300:
                    return "reset"
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
    return f"not reset ({last})"


def alive(url: str, engine: str) -> bool:
    """Does the engine still answer its health probe?"""
    path = "/health"
    try:
        with _OPENER.open(url.rstrip("/") + path, timeout=5) as resp:
            return bool(200 <= resp.status < 300)
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (urllib.error.URLError, OSError):
        return False


def tail(path: Path, lines: int = 20) -> str:
    return log_tail(path, lines)
