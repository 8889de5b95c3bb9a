"""Launching an engine at a parallel configuration: argv, GPUs, readiness, teardown.

``launch(spec, log_path)`` refuses axes the engine cannot run (before starting anything),
builds each process's argv (never a shell string), assigns GPUs per instance with
``CUDA_VISIBLE_DEVICES``, starts the processes in their own process groups with their output
in the run folder, waits on the engine's own readiness probe, and returns an
:class:`EngineHandle` whose ``stop()`` tears every group down (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench_llm.core.control import EngineClient
from bench_llm.core.memory import user_environment
from bench_llm.launch.engines import EngineLayout, ProcessPlan, target_version
from bench_llm.launch.process import EngineStartError, ManagedProcess, free_port, log_tail, python_module
from bench_llm.launch.profiles import plan_engine, profile, unsupported_axes
from bench_llm.launch.spec import LaunchSpec

__all__ = [
    "EngineHandle",
    "EngineStartError",
    "LaunchSpec",
    "UnsupportedConfigError",
    "launch",
    "plan_launch",
    "unsupported_axes",
]


class UnsupportedConfigError(EngineStartError):
    """The configuration asks for something the engine (or the host) cannot run; nothing was started."""


@dataclass(frozen=True)
class PlannedProcess:
    """One process of a launch as it would start: what a dry run prints."""

    role: str
    argv: tuple[str, ...]
    #: The environment bench sets for it (the engine's defaults, the user's, CUDA_VISIBLE_DEVICES);
    #: the rest is inherited.
    env: tuple[tuple[str, str], ...]
    gpus: int
    #: CUDA_VISIBLE_DEVICES it would get (None: no GPUs assigned, e.g. the simulated engine).
    devices: str | None


def _refuse_unsupported(spec: LaunchSpec) -> None:
    reasons = unsupported_axes(spec.engine, spec.parallel, target_version(spec))
    if spec.gpus_available is not None and spec.parallel.gpus > spec.gpus_available:
        reasons.append(f"needs {spec.parallel.gpus} GPUs, only {spec.gpus_available} available")
    if reasons:
        raise UnsupportedConfigError(f"{spec.engine} cannot run {spec.parallel.cell_id}: " + "; ".join(reasons))


def plan_launch(spec: LaunchSpec, base_env: Mapping[str, str] | None = None) -> list[PlannedProcess]:
    """Every process ``launch(spec)`` would start, without starting anything.

    Ports are numbered from ``spec.port`` (default 8000) in the order the plan asks for them,
    so the output is the same from run to run and can be diffed. Raises
    :class:`UnsupportedConfigError` where ``launch`` would refuse.
    """
    _refuse_unsupported(spec)
    first = spec.port or 8000
    ports = iter(range(first + 1, first + 1000))
    layout = plan_engine(replace(spec, plan_only=True), first, lambda _host: next(ports))
    env = {**(os.environ if base_env is None else base_env), **dict(spec.env)}
    devices = _assign_devices(layout.processes, env) if layout.assign_gpus else [None] * len(layout.processes)
    out = []
    for plan, dev in zip(layout.processes, devices):
        own = {**plan.env, **dict(spec.env)}
        if dev is not None:
            own["CUDA_VISIBLE_DEVICES"] = dev
        argv = _containerise(spec.container_template, plan.argv, plan.port)
        out.append(PlannedProcess(plan.role, tuple(argv), tuple(sorted(own.items())), plan.gpus, dev))
    return out


class EngineHandle:
    """A running engine (one or several processes). A context manager; ``stop()`` is idempotent."""

    def __init__(
        self,
        url: str,
        argv: list[str],
        gpus: int,
        log_path: Path,
        processes: Sequence[ManagedProcess],
        version: str | None = None,
        layout: EngineLayout | None = None,
        server: dict[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.argv = argv
        self.version = version
        self.gpus = gpus
        self.log_path = log_path
        self.processes = list(processes)
        self.layout = layout
        #: what the engine says about itself (``engine_info``)
        self.server = server or {}

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid is not None]

    def alive(self) -> bool:
        return all(p.alive() for p in self.processes)

    def describe(self) -> dict[str, Any]:
        """What goes into the run metadata."""
        return {
            "url": self.url,
            "argv": self.argv,
            "all_argv": [p.argv for p in self.processes],
            "version": self.version,
            "gpus": self.gpus,
            "log": str(self.log_path),
            "cuda_visible_devices": [p.env.get("CUDA_VISIBLE_DEVICES") for p in self.processes],
            "forces_output_length": None if self.layout is None else self.layout.forces_output_length,
            "server": {k: v for k, v in self.server.items() if k != "version"},
        }

    @property
    def info(self) -> dict[str, Any]:
        """The cell's record of its engine: the version, what the server says about itself,
        and every process's role, argv and GPUs."""
        roles = [plan.role for plan in self.layout.processes] if self.layout is not None else []
        processes = [
            {"role": roles[i] if i < len(roles) else None, "argv": p.argv,
             "cuda_visible_devices": p.env.get("CUDA_VISIBLE_DEVICES")}
            for i, p in enumerate(self.processes)
        ]  # fmt: skip
        return {**self.server, "version": self.version, "started_by_bench": True, "processes": processes}

    def stop(self, grace_s: float = 10.0) -> None:
        # front (router) first, then the instances behind it
        for proc in reversed(self.processes):
            proc.stop(grace_s)

    def __enter__(self) -> "EngineHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _visible_devices(base_env: Mapping[str, str]) -> list[str] | None:
    current = base_env.get("CUDA_VISIBLE_DEVICES")
    if current is None:
        return None
    return [d for d in current.split(",") if d.strip()]


def _assign_devices(plans: Sequence[ProcessPlan], base_env: Mapping[str, str]) -> list[str | None]:
    """Disjoint device lists per process, in order (mapped onto an existing CUDA_VISIBLE_DEVICES)."""
    pool = _visible_devices(base_env)
    out: list[str | None] = []
    nxt = 0
    for plan in plans:
        if plan.gpus == 0:
            out.append(None)
            continue
        idx = list(range(nxt, nxt + plan.gpus))
        nxt += plan.gpus
        if pool is not None:
            if idx[-1] >= len(pool):
                raise UnsupportedConfigError(
                    f"the configuration needs {nxt} GPUs but CUDA_VISIBLE_DEVICES lists {len(pool)}"
                )
            out.append(",".join(pool[i] for i in idx))
        else:
            out.append(",".join(str(i) for i in idx))
    return out


def _log_path_for(log_path: Path, index: int, role: str) -> Path:
    if index == 0:
        return log_path
    return log_path.with_name(f"{log_path.stem}.{role}{index}{log_path.suffix or '.log'}")


def engine_environment(
    engine_defaults: Mapping[str, str], user_env: Mapping[str, str], devices: str | None
) -> dict[str, str]:
    """One engine process's environment: the user's (not what bench set for itself), the
    engine's defaults, the user's ``--env`` over those, then its GPUs."""
    env = user_environment()
    env.update(engine_defaults)
    env.update(user_env)
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    return env


def launch(spec: LaunchSpec, log_path: Path) -> EngineHandle:
    """Start the engine described by ``spec``; return when it answers its readiness probe."""
    _refuse_unsupported(spec)
    port = spec.port or free_port(spec.host)
    layout = plan_engine(spec, port, free_port)
    base_env = dict(os.environ)
    base_env.update(dict(spec.env))
    devices = _assign_devices(layout.processes, base_env) if layout.assign_gpus else [None] * len(layout.processes)
    procs: list[ManagedProcess] = []
    deadline = time.monotonic() + spec.ready_timeout_s
    try:
        for i, (plan, dev) in enumerate(zip(layout.processes, devices)):
            env = engine_environment(plan.env, dict(spec.env), dev)
            argv = _containerise(spec.container_template, plan.argv, plan.port)
            proc = ManagedProcess(argv, _log_path_for(log_path, i, plan.role), env=env)
            procs.append(proc)
            proc.start()
        for plan, proc in zip(layout.processes, procs):
            if plan.ready_path is None:
                continue
            remaining = max(1.0, deadline - time.monotonic())
            proc.wait_ready(f"http://{_connect_host(spec.host)}:{plan.port}{plan.ready_path}", remaining)
        for plan, proc in zip(layout.processes, procs):
            for path in plan.extra_ready_paths:
                remaining = max(1.0, deadline - time.monotonic())
                proc.wait_ready(f"http://{_connect_host(spec.host)}:{plan.port}{path}", remaining)
    except BaseException:
        for proc in reversed(procs):
            proc.stop(grace_s=5.0)
        raise
    url = f"http://{_connect_host(spec.host)}:{layout.front_port}"
    server = engine_info(spec.engine, url)
    version = layout.version or server.get("version") or layout.declared_version
    return EngineHandle(
        url=url,
        argv=list(procs[layout.front_index].argv),
        gpus=spec.parallel.gpus,
        log_path=log_path,
        processes=procs,
        version=version,
        layout=layout,
        server=server,
    )


def engine_info(engine: str, url: str) -> dict[str, Any]:
    """What the engine at ``url`` says about itself through its profile's routes: its version
    (None when no route says), and each server-info route's JSON (the first of a route's
    aliases that answers), e.g. vLLM's ``/version`` and ``/v1/models``, TGI's ``/info``."""
    client = EngineClient(url, timeout_s=10)
    routes = profile(engine).routes
    out: dict[str, Any] = {"version": client.version(routes.version)}
    for paths in routes.info:
        for path in paths:
            obj = client.get_json(path)
            if obj is not None:
                out[path] = obj
                break
    return out


@dataclass(frozen=True)
class ClientRoundTrip:
    """Where a load generator ran and its measured round trip to the engine (the record
    ``engine_info.client`` carries, docs/sweeps.md "Where the client runs")."""

    #: ``launching-host`` (Slurm) or ``kubernetes-job`` (a load Job's pod)
    where: str
    host: str
    engine_url: str
    #: health probes that answered, each timed on the client's monotonic clock (ms)
    times_ms: tuple[float, ...]
    #: the node the client ran on, where the manager says (a Kubernetes pod's ``NODE_NAME``)
    node: str | None = None
    #: whether the client's host is one of the engine's nodes (None: not known there)
    on_engine_node: bool | None = None

    def as_json(self) -> dict[str, Any]:
        """The JSON ``engine_info.client`` records (keys of what is not known left out)."""
        t = self.times_ms
        out: dict[str, Any] = {"where": self.where, "host": self.host, "engine_url": self.engine_url}
        if self.node is not None:
            out["node"] = self.node
        if self.on_engine_node is not None:
            out["on_engine_node"] = self.on_engine_node
        out["round_trip_ms"] = {"min": min(t), "median": statistics.median(t), "max": max(t)} if t else None
        out["samples"] = len(t)
        return out


def client_round_trip(url: str, engine: str, where: str, *, engine_hosts: Sequence[str] | None = None,
                      node: str | None = None, samples: int = 5) -> ClientRoundTrip:  # fmt: skip
    """This host's round trip to the engine at ``url``: ``samples`` probes of the engine
    profile's health route, each timed on this host's monotonic clock (a probe with no answer
    is not counted). ``engine_hosts``: the host names of the engine's nodes, to say whether
    this host is one of them (None: not known)."""
    client = EngineClient(url, timeout_s=5)
    health = profile(engine).routes.health
    times = []
    for _ in range(samples):
        t = time.perf_counter_ns()
        if client.get(health, timeout_s=5).status is not None:
            times.append((time.perf_counter_ns() - t) / 1e6)
    me = socket.gethostname()
    on_node = None
    if engine_hosts is not None:
        on_node = any(h and h.split(".")[0] == me.split(".")[0] for h in engine_hosts)
    return ClientRoundTrip(where, me, url, tuple(times), node, on_node)


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _containerise(template: tuple[str, ...] | None, argv: list[str], port: int) -> list[str]:
    """Substitute ``{argv}`` (the engine's own argv, spliced in) and ``{port}`` into a user template.

    Example: ``("docker", "run", "--rm", "--gpus", "all", "-p", "{port}:{port}", "IMAGE", "{argv}")``.
    For images whose entry point is the launcher itself, use ``{args}`` (the argv without
    its program name).
    """
    if not template:
        return argv
    out: list[str] = []
    for part in template:
        if part == "{argv}":
            out.extend(argv)
        elif part == "{args}":
            out.extend(argv[1:])
        else:
            out.append(part.replace("{port}", str(port)))
    return out


def sim_command() -> list[str]:
    """How the simulated engine is started (this interpreter, ``-m bench``)."""
    return python_module("bench_llm.bench", "sim", "serve")


def describe_failure(proc: ManagedProcess) -> str:
    return log_tail(proc.log_path)
