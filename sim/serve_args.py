"""The simulated engine's arguments (``bench sim serve ARGS``), declared once: the option
table (``SERVE_OPTIONS``), a plain parser of an argv (``parse_serve_args``, for the library: a
sweep in virtual time reads the argv its launcher would start) and the ``ServerConfig`` they
make (``build_config``). ``bench sim serve`` builds its click options from the same table and
calls the same ``build_config`` (bench/commands/sim.py), so the command line and the library
cannot disagree, and the library never calls into a CLI command.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from bench_llm.core.errors import BenchError

GPUS = ("a100", "h100", "h200", "l40s")
PRESETS = ("llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "deepseek-v3")
PROFILES = ("vllm", "vllm-v0", "sglang", "sglang-2024", "trtllm", "tgi", "legacy-2023")


class ServeArgsError(BenchError):
    """An argv the simulated engine does not take (an unknown option, a bad value)."""


@dataclass(frozen=True)
class Option:
    """One option of ``bench sim serve``. ``kind``: ``str`` | ``int`` | ``float`` | ``path`` |
    ``flag`` (present or not) | ``switch`` (``--x/--no-x``, None when neither is given);
    ``minimum``: the least value an ``int``/``float`` takes (None: any)."""

    flag: str
    kind: str = "str"
    default: Any = None
    help: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    show_default: bool = False
    metavar: str | None = None
    #: the parameter's name where it is not the flag's (``--config`` -> ``config_path``)
    dest: str | None = None

    @property
    def name(self) -> str:
        return self.dest or self.flag.lstrip("-").replace("-", "_")


SERVE_OPTIONS: tuple[Option, ...] = (
    Option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless told otherwise)."),
    Option("--port", "int", 8000, show_default=True),
    Option("--model", help="Served model name (default: sim-model, or the preset name with --timing model)."),
    Option("--timing", choices=("fixed", "model"), default="fixed", show_default=True,
           help="fixed: same TTFT/ITL for every request; model: batching, KV capacity and the cost model."),
    Option("--flavor", choices=("vllm", "sglang", "tgi"), default="vllm", show_default=True,
           help="Which engine's API, stream format and metric names to imitate."),
    Option("--ttft-ms", "float", 50.0, show_default=True, help="Fixed timing: time to first token."),
    Option("--itl-ms", "float", 10.0, show_default=True, help="Fixed timing: inter-token latency (step)."),
    Option("--tokens-per-chunk", "int", 1, show_default=True, help="Fixed timing: tokens per stream chunk."),
    Option("--fixed-grid", "flag", False,
           help="Fixed timing: step every stream on one global ITL grid (first token at the first step "
                "boundary at or after arrival+TTFT) instead of per-request deadlines."),
    Option("--model-preset", choices=PRESETS, default="llama-3.1-8b", show_default=True),
    Option("--gpu", choices=GPUS, default="h100", show_default=True),
    Option("--dtype", choices=("bf16", "fp8"),
           help="Weight precision (default: the preset's; llama-3.1-70b and deepseek-v3 default to fp8)."),
    Option("--kv-dtype", choices=("auto", "bf16", "fp8"),
           help="KV-cache dtype (default auto: the engine profile's default for the weights' precision, "
                "BF16 on vllm/sglang, FP8 for FP8 weights on trtllm)."),
    Option("--tp", "int", 1, show_default=True, help="Tensor parallel degree."),
    Option("--pp", "int", 1, show_default=True, help="Pipeline parallel stages."),
    Option("--dp", "int", 1, show_default=True, help="Data parallel replicas (behind --router)."),
    Option("--ep", "int", 1, show_default=True,
           help="Expert parallel width (MoE presets): 1 or tp×pcp×dp (experts over every GPU; EP adds none)."),
    Option("--expert-imbalance", "float", metavar="MAX/MEAN",
           help="MoE with --ep > 1: the busiest EP rank's expert load over the mean (1.0: balanced; "
                "default 1.3). That rank's GPU sets every MoE step."),
    Option("--spec-tokens", "int", minimum=0, metavar="K",
           help="Speculative decoding (MTP, EAGLE, a draft model): draft tokens each decode step verifies per "
                "sequence (vLLM's speculative_config num_speculative_tokens; default 0: off)."),
    Option("--spec-accept", "float", minimum=0, metavar="RATE",
           help="With --spec-tokens: chance a draft token is accepted when the ones before it were (default "
                "0.85); measure it on the real engine (accepted over drafted tokens)."),
    Option("--dcp", "int", 1, show_default=True, help="Decode context parallel (divides --tp)."),
    Option("--pcp", "int", 1, show_default=True, help="Prefill context parallel (extra GPUs)."),
    Option("--disagg", metavar="P:D", help="Prefill/decode disaggregation: P prefill, D decode instances."),
    Option("--router", choices=("round-robin", "least-queue", "kv-aware", "prefix-aware"), default="round-robin",
           show_default=True, help="How requests are spread over DP replicas."),
    Option("--profile", choices=PROFILES,
           help="Engine profile: scheduling policy, step/sequence/layer overheads and limits of one engine "
                "generation (vllm = V1, vllm-v0, sglang, sglang-2024, trtllm, tgi, legacy-2023); default: the flavour's."),
    Option("--config", "path", dest="config_path", help="TOML overrides: [gpu], [model], [profile], [engine] tables."),
    Option("--max-num-seqs", "int", help="Max running requests per instance."),
    Option("--max-num-batched-tokens", "int", help="Token budget per step."),
    Option("--gpu-memory-utilization", "float",
           help="Share of GPU memory for weights + KV cache (default: the engine profile's, 0.9)."),
    Option("--enable-prefix-caching", "switch", help="Prefix cache (default on)."),
    Option("--slowdown", "float", 1.0, show_default=True, help="Multiply every step time by this factor."),
    Option("--jitter", "float", 0.0, show_default=True, help="Gaussian step-time jitter sigma (fraction)."),
    Option("--seed", "int", 0, show_default=True, help="Seed for jitter and faults."),
    Option("--faults", help="Fault injection, e.g. reset=0.1,http500=0.05,stall=0.05:5s,slow_start=3s."),
    Option("--spin-us", "int", 0, show_default=True,
           help="Busy-wait this many µs before each deadline (tighter emission times at the cost of CPU)."),
    Option("--natural-stop", "float", 0.0, show_default=True, metavar="MEAN",
           help="Requests that do not force their length (no ignore_eos; TGI always) end at a seeded "
                "end-of-sequence with this mean length (0: every request gets max_tokens)."),
    Option("--max-concurrent-requests", "int", 128, show_default=True,
           help="TGI flavour: requests admitted at once (TGI's own default); the next one gets an "
                "in-stream 'overloaded' error, as TGI answers (0: no limit)."),
    Option("--max-num-queued-reqs", "int", 0, minimum=0, show_default=True,
           help="vLLM flavour: requests in the engine (waiting and running) at most (vLLM's "
                "--max-num-queued-reqs); the next one is answered HTTP 503, as vLLM does (0: no limit)."),
    Option("--max-queued-requests", "int", 0, minimum=0, show_default=True,
           help="SGLang flavour: requests waiting at most (SGLang's --max-queued-requests); the next one's "
                "stream ends with an abort, status 503, as SGLang does (0: no limit)."),
    Option("--engine-version", metavar="VERSION",
           help="SGLang flavour: the release imitated and reported (default 0.5.23): 0.5.6-0.5.9 speak the 0.5.8 "
                "generation, 0.5.10-0.5.11 the 0.5.10 one, 0.5.12 on the 0.5.23 one (timings, spans, checks)."),
    Option("--reasoning-tokens", "int", 0, minimum=0, show_default=True,
           help="Chat answers start with this many reasoning tokens (delta.reasoning_content), then the answer."),
    Option("--lora-adapters", default="", metavar="NAME,...",
           help="LoRA adapters served besides the model (requests name one as their model)."),
    Option("--max-loras", "int", 1, minimum=1, show_default=True,
           help="Adapters resident at once; loading another evicts the least recently used."),
    Option("--lora-swap-ms", "float", 0.0, minimum=0, show_default=True,
           help="Time to load an adapter that is not resident, waited by the request that needs it."),
    Option("--mlock", "flag", False,
           help="Lock the engine's memory (mlockall; needs root) so host memory reclaim cannot stall emission."),
    Option("--otlp-traces-endpoint", metavar="URL",
           help="Export each finished request's span over OTLP/HTTP to URL (http://HOST:PORT/v1/traces), "
                "in the flavour's naming (vLLM llm_request, SGLang rid; TGI none): bench run/sweep --otlp-receiver."),
    Option("--emission-log", "path", help="Parquet of every token's intended and actual send time (written at shutdown)."),
    Option("--nnodes", "int", 1, minimum=1, show_default=True,
           help="Ranks of a multi-node instance (as vLLM's --nnodes): rank 0 serves once every rank joined."),
    Option("--node-rank", "int", 0, minimum=0, show_default=True, help="This process's rank."),
    Option("--master-addr", help="Rendezvous address (rank 0's node)."),
    Option("--master-port", "int", help="Rendezvous port."),
    Option("--headless", "flag", False, help="A rank > 0: join the rendezvous, serve no HTTP."),
)  # fmt: skip


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ServeArgsError(message)


def _number(o: Option) -> Any:
    make = int if o.kind == "int" else float

    def parse(text: str) -> Any:
        try:
            value = make(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a valid {'integer' if make is int else 'float'}") from None
        if o.minimum is not None and value < o.minimum:
            raise argparse.ArgumentTypeError(f"{text} is not in the range x>={o.minimum:g}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="bench sim serve", add_help=False, allow_abbrev=False)
    for o in SERVE_OPTIONS:
        kw: dict[str, Any] = {"dest": o.name, "default": o.default}
        if o.kind == "flag":
            kw["action"] = "store_true"
        elif o.kind == "switch":
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["choices"] = o.choices
            if o.kind in ("int", "float"):
                kw["type"] = _number(o)
            elif o.kind == "path":
                kw["type"] = Path
        p.add_argument(o.flag, **kw)
    return p


def parse_serve_args(argv: Sequence[str]) -> dict[str, Any]:
    """``bench sim serve``'s parameters from its argv (every option, defaults filled), as the
    command has them. Raises ``ServeArgsError`` naming what it does not take."""
    ns, rest = _parser().parse_known_args(list(argv))
    if rest:
        raise ServeArgsError(f"No such option '{rest[0]}'." if rest[0].startswith("-") else f"Got unexpected extra argument ({rest[0]})")
    return vars(ns)


def build_config(kw: dict[str, Any]) -> Any:
    """The ``ServerConfig`` of ``bench sim serve``'s parameters (``parse_serve_args``, or the
    command's own)."""
    from bench_llm.sim.config import ServerConfig
    from bench_llm.sim.faults import FaultSpec
    from bench_llm.sim.options import ModelTiming, apply_toml
    from bench_llm.sim.timing import FixedTiming

    faults = FaultSpec.parse(kw.get("faults"))
    model_timing = None
    if kw.get("timing", "fixed") == "model":
        dp, dd = 0, 0
        if kw.get("disagg"):
            p, sep, d = str(kw["disagg"]).partition(":")
            try:
                dp, dd = int(p), int(d)
                if not sep or dp < 1 or dd < 1:
                    raise ValueError
            except ValueError:
                raise BenchError(f"--disagg {kw['disagg']!r}: expected P:D, e.g. 1:1") from None
        cli: dict[str, Any] = {
            "preset": kw.get("model_preset") or "llama-3.1-8b",
            "gpu": kw.get("gpu") or "h100",
            "tp": kw.get("tp", 1), "pp": kw.get("pp", 1), "dp": kw.get("dp", 1), "ep": kw.get("ep", 1),
            "dcp": kw.get("dcp", 1), "pcp": kw.get("pcp", 1),
            "disagg_prefill": dp, "disagg_decode": dd,
            "router": kw.get("router") or "round-robin",
            "profile": kw.get("profile") or kw.get("flavor") or "vllm",
            "slowdown": kw.get("slowdown", 1.0), "jitter": kw.get("jitter", 0.0), "seed": kw.get("seed", 0),
        }  # fmt: skip
        for key in _UNSET_BY_DEFAULT:
            if kw.get(key) is not None:
                cli[key] = kw[key]
        try:
            if kw.get("config_path"):
                defaults = {k: v for k, v in cli.items() if _given(kw, k)}
                model_timing = apply_toml(ModelTiming(**cli), Path(kw["config_path"]), defaults)
            else:
                model_timing = ModelTiming(**cli)
        except ValueError as exc:
            raise BenchError(str(exc)) from None
    model = kw.get("model") or (model_timing.preset if model_timing else "sim-model")
    timing = FixedTiming(float(kw.get("ttft_ms", 50.0)) / 1000, float(kw.get("itl_ms", 10.0)) / 1000,
                         int(kw.get("tokens_per_chunk", 1)))  # fmt: skip
    try:
        return _server_config(ServerConfig, kw, model, timing, model_timing, faults)
    except ValueError as exc:
        raise BenchError(str(exc)) from None


def _server_config(make: Any, kw: dict[str, Any], model: str, timing: Any, model_timing: Any, faults: Any) -> Any:
    return make(
        model=model, timing=timing, flavor=kw.get("flavor") or "vllm", model_timing=model_timing, faults=faults,
        emission_log=kw.get("emission_log"), seed=int(kw.get("seed", 0)),
        fixed_grid=bool(kw.get("fixed_grid")), spin_us=int(kw.get("spin_us") or 0),
        natural_stop_mean=float(kw.get("natural_stop") or 0.0),
        max_concurrent_requests=int(kw.get("max_concurrent_requests", 128) or 0),
        reasoning_tokens=int(kw.get("reasoning_tokens") or 0),
        lora_adapters=tuple(a.strip() for a in str(kw.get("lora_adapters") or "").split(",") if a.strip()),
        max_loras=int(kw.get("max_loras") or 1), lora_swap_ms=float(kw.get("lora_swap_ms") or 0.0),
        otlp_traces_endpoint=kw.get("otlp_traces_endpoint"),
        engine_version=kw.get("engine_version"),
        max_num_queued_reqs=int(kw.get("max_num_queued_reqs") or 0),
        max_queued_requests=int(kw.get("max_queued_requests") or 0),
    )  # fmt: skip


#: engine options with no default of their own (None unless given): a given one is passed on, and wins over
#: the TOML file's value
_UNSET_BY_DEFAULT = ("dtype", "kv_dtype", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching",
                     "gpu_memory_utilization", "expert_imbalance", "spec_tokens", "spec_accept")

_DEFAULTS = {"preset": "llama-3.1-8b", "gpu": "h100", "tp": 1, "pp": 1, "dp": 1, "ep": 1, "dcp": 1, "pcp": 1,
             "disagg_prefill": 0, "disagg_decode": 0, "router": "round-robin", "slowdown": 1.0, "jitter": 0.0,
             "seed": 0}  # fmt: skip


def _given(kw: dict[str, Any], key: str) -> bool:
    """True when a CLI value differs from its default (so the TOML file does not override it)."""
    if key in _UNSET_BY_DEFAULT:
        return True
    if key == "profile":
        return kw.get("profile") is not None
    if key == "preset":
        return kw.get("model_preset") not in (None, _DEFAULTS["preset"])
    if key in ("disagg_prefill", "disagg_decode"):
        return bool(kw.get("disagg"))
    return kw.get(key) != _DEFAULTS.get(key)
