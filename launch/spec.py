"""What to launch: an engine, a model and a parallel configuration (``launch.launcher`` starts it;
``launch.engines`` and ``launch.profiles`` plan its processes from it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench_llm.launch.config import ParallelConfig


@dataclass(frozen=True)
class LaunchSpec:
    engine: str  # "sim" | "vllm" | "sglang" | "tgi"
    model: str  # sim: preset name (e.g. "llama-3.1-70b"); others: path or id
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    host: str = "127.0.0.1"
    port: int | None = None  # None: pick a free port
    gpu: str | None = None  # sim: GPU preset ("h100", ...); real engines: informational
    gpus_available: int | None = None
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    container_template: tuple[str, ...] | None = None
    ready_timeout_s: float = 600.0
    #: sim only: which engine API the simulated engine speaks (vllm | sglang | tgi).
    flavor: str = "vllm"
    #: The engine's version when the user knows it: picks version-gated flags (docs/engines.md);
    #: None: asked of the engine's program where it can answer before start (TGI's --version).
    engine_version: str | None = None
    #: Only plan (a dry run): nothing is started, a missing engine install is not an error.
    plan_only: bool = False
