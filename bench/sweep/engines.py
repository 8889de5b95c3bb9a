"""Starting and checking the engine of one cell.

The sweep talks to engines through a small ``Launcher`` protocol so its orchestration can be
tested with fakes; the default wraps ``launch.launcher`` (launch, readiness, log,
process-group teardown), ``VirtualLauncher`` models the simulated engine in virtual time, and
``DeploymentLauncher`` measures running deployments bench did not start (``--url``). Control
calls (health, prefix-cache reset) take their routes from the engine's profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bench_llm.core.control import EngineClient, Reply
from bench_llm.core.redact import redact
from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.launcher import engine_info
from bench_llm.launch.process import EngineStartError, log_tail
from bench_llm.launch.profiles import FLUSH_WAIT_S, profile

if TYPE_CHECKING:
    from bench_llm.bench.virtual import VirtualEngine

__all__ = [
    "EngineStartError", "Handle", "Launcher", "DefaultLauncher", "VirtualLauncher", "VirtualHandle", "CellEngine",
    "reset_prefix_cache", "alive", "DeploymentLauncher", "DeploymentHandle", "engine_info",
]


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
    """The project's launchers (launch/launcher.py)."""

    def _module(self):  # type: ignore[no-untyped-def]
        try:
            from bench_llm.launch import launcher
        except ImportError as exc:
            from bench_llm.core.errors import BenchError

            raise BenchError(f"engine launching is not available in this install ({exc})") from None
        return launcher

    def __init__(self, version: str | None = None) -> None:
        #: the engine release the sweep targets (``--engine-version``), for version-gated refusals
        self.version = version

    def unsupported(self, engine: str, parallel: ParallelConfig) -> list[str]:
        """Reasons ``engine`` (at the targeted release, when known) cannot run ``parallel``."""
        return list(self._module().unsupported_axes(engine, parallel, self.version))

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
            engine_version=cell.engine_version,
        )

    def start(self, cell: CellEngine, log_path: Path) -> Handle:
        return self._module().launch(self._launch_spec(cell), log_path)  # type: ignore[no-any-return]

    def plan(self, cell: CellEngine) -> list[Any]:
        """The processes ``start`` would run (``PlannedProcess``), starting nothing (a dry run)."""
        return list(self._module().plan_launch(self._launch_spec(cell)))


class VirtualHandle:
    """A cell's simulated engine in virtual time: nothing runs between loads; each load is
    modelled on a fresh engine (``bench.virtual``)."""

    url = "virtual:"

    def __init__(self, engine: VirtualEngine, log_path: Path) -> None:
        self.engine = engine
        self.log_path = log_path
        self.version = engine.version
        self.argv = ["bench", "sim", "serve", *engine.argv]

    def stop(self) -> None:
        pass


class VirtualLauncher:
    """The simulated engine at each cell's configuration, in virtual time."""

    def unsupported(self, engine: str, parallel: ParallelConfig) -> list[str]:
        if engine != "sim":
            return [f"{engine} does not run in virtual time"]
        from bench_llm.launch.engines import sim_refusals

        return sim_refusals(parallel)  # the simulated engine's own rule (its EP group: core/layout.py)

    def start(self, cell: CellEngine, log_path: Path) -> VirtualHandle:
        import json

        from bench_llm.bench.virtual import virtual_engine
        from bench_llm.sim.options import describe

        engine = virtual_engine(cell.model, cell.gpu, cell.parallel, cell.extra_args)
        log_path.write_text(f"bench sim (virtual time): {json.dumps(describe(engine.timing), sort_keys=True)}\n")
        return VirtualHandle(engine, log_path)


class DeploymentHandle:
    """A running deployment bench did not start: measured where it is, never stopped."""

    def __init__(self, url: str, log_path: Path, version: str | None, info: dict[str, Any]) -> None:
        self.url = url
        self.log_path = log_path
        self.version = version
        self.argv: list[str] | None = None  # not bench's to know
        self.info = info

    def stop(self) -> None:
        pass


class DeploymentLauncher:
    """The sweep's running deployments (``bench sweep --url``): ``start`` checks the cell's one
    answers, and reads its version and what it says about itself through its engine profile."""

    def __init__(self, urls: Mapping[str, str]) -> None:
        self.urls = dict(urls)

    def unsupported(self, engine: str, parallel: ParallelConfig) -> list[str]:
        return [] if parallel.deployment in self.urls else [f"no URL for deployment {parallel.deployment!r}"]

    def start(self, cell: CellEngine, log_path: Path) -> DeploymentHandle:
        import json

        url = self.urls[str(cell.parallel.deployment)].rstrip("/")
        health = _health(url, cell.engine)
        if not _answers(health):
            raise EngineStartError(f"deployment {cell.parallel.deployment} at {url} does not answer: {health.problem()}")
        info = {"url": url, "started_by_bench": False, **engine_info(cell.engine, url)}
        log_path.write_text(redact(  # a URL's credentials (core.redact)
            f"deployment {cell.parallel.deployment} at {url}, not started by bench; what it says about itself:\n"
            f"{json.dumps(info, sort_keys=True, default=str)}\n"
        ))
        return DeploymentHandle(url, log_path, info.get("version") or cell.engine_version, info)


def reset_prefix_cache(engine: str, url: str) -> str:
    """Empty the engine's prefix cache where it allows (its profile's routes); returns what
    happened (for the record)."""
    routes = profile(engine).routes.reset_prefix
    if not routes:
        return f"not supported by {engine}"
    client = EngineClient(url, timeout_s=FLUSH_WAIT_S + 10)
    last = ""
    for method, path in routes:
        reply = client.post(path) if method == "POST" else client.get(path)
        if reply.ok:
            return "reset"
        last = reply.problem()
    return f"not reset ({last})"


def alive(url: str, engine: str) -> bool:
    """Does the engine still answer its health probe?"""
    return _answers(_health(url, engine))


def _health(url: str, engine: str) -> Reply:
    return EngineClient(url).get(profile(engine).routes.health, timeout_s=5)


def _answers(reply: Reply) -> bool:
    # an error page below 500 (auth, not found) still comes from a live server
    return reply.status is not None and reply.status < 500


def tail(path: Path, lines: int = 20) -> str:
    return log_tail(path, lines)
