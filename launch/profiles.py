"""One engine profile per engine: its adapter, launch plan, metric map and control routes.

Everything bench knows about one engine is named here, in one registry (:data:`PROFILES`);
callers go through :func:`profile` instead of testing engine names themselves. A profile
*names* its parts, each written once where it belongs: the adapter in ``adapters/`` (the
request protocol), the metric map in ``adapters/metrics_map.py``, the launch plan and the
axes it refuses in ``launch/engines.py``. The control routes (health, version, server
info, prefix-cache reset, tokenize, served context) are data here; the calls themselves go
through ``core/control.py``. Versions targeted: docs/engines.md.

``openai`` and ``generic`` have no launch plan: bench measures them where they run
(``bench run --url``, ``bench sweep --url``). An engine name with no profile (an adapter
alias such as ``llamacpp``) gets a bare profile that speaks through the adapter of that name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from bench_llm.adapters.base import Adapter, get_adapter
from bench_llm.adapters.context import (
    ContextRoute,
    openai_models_max_model_len,
    sglang_server_info_context_length,
    tgi_info_max_total_tokens,
)
from bench_llm.adapters.metrics_map import MetricNames, metric_names
from bench_llm.launch import engines
from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.engines import EngineLayout
from bench_llm.launch.process import EngineStartError
from bench_llm.launch.tuning import unsupported_args

if TYPE_CHECKING:
    from bench_llm.launch.spec import LaunchSpec

#: (spec, front port, free-port picker) -> the processes to start.
Plan = Callable[["LaunchSpec", int, Callable[[str], int]], EngineLayout]

#: SGLang refuses to flush (400) while requests are pending, e.g. ones cancelled at the drain
#: deadline still finishing; from 0.5.10 ``timeout`` waits up to that many seconds for idle
#: (older releases ignore it).
FLUSH_WAIT_S = 30


@dataclass(frozen=True)
class ControlRoutes:
    """An engine's control routes (paths on its base URL), each tried in the order given."""

    health: str = "/health"
    #: (path, JSON key) that state the engine's version
    version: tuple[tuple[str, str], ...] = ()
    #: what the server says about itself, recorded as it answers: one group per fact, the
    #: first path of a group that answers JSON is recorded (later ones are older aliases)
    info: tuple[tuple[str, ...], ...] = ()
    #: (method, path) that empty the prefix cache; none: the engine has no such route
    reset_prefix: tuple[tuple[str, str], ...] = ()
    #: POST route counting a prompt's tokens (``{"prompt": ...}``); None: none bench can use
    tokenize: str | None = None
    #: where the engine states the context length it serves
    context: tuple[ContextRoute, ...] = ()


@dataclass(frozen=True)
class EngineProfile:
    """What bench knows about one engine, named in one place."""

    name: str
    #: how messages name it ("vLLM", "the simulated engine")
    label: str
    #: the adapter that speaks its API (adapters/base.py registry name)
    adapter: str
    routes: ControlRoutes
    #: its Prometheus metric map (adapters/metrics_map.py table name); None: every known name
    metrics: str | None = None
    #: its launch plan; None: bench does not launch it (measure it where it runs, --url)
    plan: Plan | None = None
    #: parallel axes it cannot run at a configuration, for the release targeted when known
    #: (reasons; empty when it can)
    refusals: Callable[[ParallelConfig, str | None], list[str]] | None = None
    #: True when the adapter's stream shape depends on the engine's version (adapters/sglang.py)
    adapter_takes_version: bool = False

    @property
    def launchable(self) -> bool:
        return self.plan is not None

    def metric_names(self, version: str | None = None) -> MetricNames:
        """The metric families it emits at ``version`` (all it ever emits when unknown)."""
        return metric_names(self.metrics, version)

    def adapter_for(
        self, *, model: str, api: str = "completions", api_key: str | None = None,
        engine_version: str | None = None, extra_body: dict[str, Any] | None = None,
    ) -> Adapter:  # fmt: skip
        """Its adapter with these options (adapters ignore options they do not use)."""
        extra: dict[str, Any] = {}
        if self.adapter_takes_version and engine_version:
            extra["engine_version"] = engine_version
        if extra_body:
            extra["extra_body"] = extra_body
        return get_adapter(self.adapter, model=model, api=api, api_key=api_key, **extra)


_OPENAI_CONTEXT = (ContextRoute("/v1/models", openai_models_max_model_len, "/v1/models max_model_len"),)
_VLLM_ROUTES = ControlRoutes(
    version=(("/version", "version"),),
    info=(("/version",), ("/v1/models",)),
    reset_prefix=(("POST", "/reset_prefix_cache"),),  # served when VLLM_SERVER_DEV_MODE=1
    tokenize="/tokenize",
    context=_OPENAI_CONTEXT,
)
_SGLANG_ROUTES = ControlRoutes(
    # /server_info from 0.5.6 on; /get_server_info, its deprecated alias, before (http_server.py)
    version=(("/server_info", "version"), ("/get_server_info", "version")),
    info=(("/server_info", "/get_server_info"), ("/v1/models",)),
    reset_prefix=(("POST", f"/flush_cache?timeout={FLUSH_WAIT_S}"), ("GET", f"/flush_cache?timeout={FLUSH_WAIT_S}")),
    tokenize="/tokenize",
    context=(
        *_OPENAI_CONTEXT,
        ContextRoute("/get_server_info", sglang_server_info_context_length, "/get_server_info context_length"),
    ),
)
_TGI_ROUTES = ControlRoutes(
    version=(("/info", "version"),),
    info=(("/info",),),
    # POST /tokenize takes a GenerateRequest ({"inputs": ...}) and answers the token list
    # (router/src/server.rs); core/control.py asks with "inputs" once "prompt" is refused
    tokenize="/tokenize",
    context=(ContextRoute("/info", tgi_info_max_total_tokens, "/info max_total_tokens"),),
)

PROFILES: dict[str, EngineProfile] = {
    p.name: p
    for p in (
        # the simulated engine as bench launches it speaks vLLM's API (its default flavour)
        EngineProfile("sim", "the simulated engine", "vllm", _VLLM_ROUTES, None, engines.plan_sim,
                      engines.sim_refusals),
        EngineProfile("vllm", "vLLM", "vllm", _VLLM_ROUTES, "vllm", engines.plan_vllm, engines.vllm_refusals),
        EngineProfile("sglang", "SGLang", "sglang", _SGLANG_ROUTES, "sglang", engines.plan_sglang,
                      engines.sglang_refusals, adapter_takes_version=True),
        EngineProfile("tgi", "TGI", "tgi", _TGI_ROUTES, "tgi", engines.plan_tgi, engines.tgi_refusals),
        # an OpenAI-compatible server as vLLM serves it (vLLM's extensions are sent)
        EngineProfile("openai", "an OpenAI-compatible server", "vllm",
                      ControlRoutes(info=(("/v1/models",),), context=_OPENAI_CONTEXT)),
        # any other OpenAI-compatible server: standard fields only
        EngineProfile("generic", "an OpenAI-compatible server", "generic", ControlRoutes(info=(("/v1/models",),))),
    )
}  # fmt: skip


def profile(engine: str) -> EngineProfile:
    """The profile of ``engine``; a bare one (its adapter, no routes) for a name with none."""
    found = PROFILES.get(engine)
    if found is not None:
        return found
    return EngineProfile(engine, engine, engine, ControlRoutes())


def launchable_engines() -> tuple[str, ...]:
    """The engines bench can launch, in the registry's order."""
    return tuple(name for name, p in PROFILES.items() if p.launchable)


def unsupported_axes(engine: str, parallel: ParallelConfig, version: str | None = None) -> list[str]:
    """Reasons ``engine`` (at release ``version``, when known) cannot run ``parallel`` (empty when it can)."""
    prof = PROFILES.get(engine)
    if prof is None or prof.plan is None:
        return [f"unknown engine {engine!r} (known: {', '.join(launchable_engines())})"]
    out = unsupported_args(engine, parallel.extra_args)
    if prof.refusals is not None:
        out += prof.refusals(parallel, version)
    return out


def plan_engine(spec: "LaunchSpec", port: int, free_port: Callable[[str], int]) -> EngineLayout:
    """The processes that start ``spec``'s engine, with the profile's version routes."""
    prof = PROFILES.get(spec.engine)
    if prof is None or prof.plan is None:
        raise EngineStartError(f"unknown engine {spec.engine!r} (known: {', '.join(launchable_engines())})")
    layout = prof.plan(spec, port, free_port)
    return replace(layout, version_paths=prof.routes.version)


def adapter_for_engine(
    engine: str, *, model: str, api: str = "completions", api_key: str | None = None,
    engine_version: str | None = None, extra_body: dict[str, Any] | None = None,
) -> Adapter:  # fmt: skip
    """The adapter that speaks ``engine``'s API (its profile's; adapters ignore options they do
    not use). ``engine_version``: SGLang's stream shape depends on it (adapters/sglang.py)."""
    return profile(engine).adapter_for(model=model, api=api, api_key=api_key, engine_version=engine_version,
                                       extra_body=extra_body)  # fmt: skip


def context_routes(engine: str) -> tuple[ContextRoute, ...]:
    """The routes that state ``engine``'s served context length (none for unknown engines)."""
    return profile(engine).routes.context
