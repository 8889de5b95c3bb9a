"""Engine tuning flags a sweep may use as axes, per engine, and which ones an engine refuses.

One row per tuning concept, with each engine's own flag name for the version targeted
(docs/engines.md): vLLM ``vllm/engine/arg_utils.py``, SGLang
``python/sglang/srt/server_args.py``, TGI ``launcher/src/main.rs``, and the flags the
simulated engine models (``bench sim serve``). A flag that is another engine's name for a
concept is refused by name with this engine's name for it, so a matrix written for vLLM does
not silently run on SGLang with a flag it ignores or rejects late. Flags in no row pass
through untouched (the engine itself checks them at start-up); the simulated engine refuses
every flag it does not model.
"""

from __future__ import annotations

from collections.abc import Sequence

#: concept -> engine -> flag name (without ``--``); None: the engine has no such flag.
TUNING_FLAGS: dict[str, dict[str, str | None]] = {
    # TGI bounds its batch by --max-batch-total-tokens; --max-batch-size (launcher/src/main.rs) caps the
    # number of requests per batch, documented for hardware without unpadded inference
    "max running requests": {
        "vllm": "max-num-seqs", "sglang": "max-running-requests", "tgi": "max-batch-size", "sim": "max-num-seqs",
    },
    # admission: beyond it a request is refused (vLLM 0.32: HTTP 503; TGI: an in-stream "overloaded");
    # the simulated engine models vLLM's (its vLLM flavour, what a sweep launches; real time only)
    "requests in flight (admission limit)": {
        "vllm": "max-num-queued-reqs", "sglang": None, "tgi": "max-concurrent-requests", "sim": "max-num-queued-reqs",
    },
    # SGLang 0.5.23 arg_groups/fields/schedule.py: the waiting queue only (ignored in P/D mode); past
    # it the stream ends with an abort, status 503 (core/rejections.py)
    "queued requests (admission limit)": {"vllm": None, "sglang": "max-queued-requests", "tgi": None, "sim": None},
    "batched-token budget per step": {
        "vllm": "max-num-batched-tokens", "sglang": "chunked-prefill-size", "tgi": "max-batch-prefill-tokens",
        "sim": "max-num-batched-tokens",
    },
    "KV memory fraction": {
        "vllm": "gpu-memory-utilization", "sglang": "mem-fraction-static", "tgi": "cuda-memory-fraction",
        "sim": "gpu-memory-utilization",
    },
    # the KV pool's absolute size; units differ: bytes per GPU (vLLM), tokens (SGLang, TGI)
    "KV cache size": {
        "vllm": "kv-cache-memory-bytes", "sglang": "max-total-tokens", "tgi": "max-batch-total-tokens", "sim": None,
    },
    # the longest request served (prompt + output): what each request may reserve
    "longest request (context length)": {
        "vllm": "max-model-len", "sglang": "context-length", "tgi": "max-total-tokens", "sim": None,
    },
    "KV cache dtype": {"vllm": "kv-cache-dtype", "sglang": "kv-cache-dtype", "tgi": "kv-cache-dtype", "sim": None},
    "scheduling conservativeness": {
        "vllm": None, "sglang": "schedule-conservativeness", "tgi": None, "sim": None,
    },
    "weight quantisation": {"vllm": "quantization", "sglang": "quantization", "tgi": "quantize", "sim": "dtype"},
    "prefix caching": {
        "vllm": "enable-prefix-caching", "sglang": None, "tgi": None, "sim": None,
    },
    "DP routing policy": {"vllm": None, "sglang": "load-balance-method", "tgi": None, "sim": "router"},
    # the SGLang router's own flag (smg or sglang_router): bench passes it to the router it starts
    # in front of DP replicas or P/D instances (launch/engines.py)
    "router policy (DP or P/D)": {"vllm": None, "sglang": "policy", "tgi": None, "sim": None},
}  # fmt: skip

#: Every flag of ``bench sim serve`` a sweep may vary (tests/bench/test_sweep_axes.py checks each is
#: one of its options); anything else is refused on the simulated engine.
SIM_TUNING_FLAGS = frozenset(
    {
        "max-num-seqs", "max-num-batched-tokens", "gpu-memory-utilization", "dtype", "router", "profile",
        "slowdown", "jitter", "max-num-queued-reqs", "expert-imbalance",
    }
)  # fmt: skip


def flag_name(arg: str) -> str | None:
    """``--max-num-seqs=8`` -> ``max-num-seqs``; None for anything that is not a long flag."""
    if not arg.startswith("--"):
        return None
    return arg[2:].split("=", 1)[0].replace("_", "-")


def flag_present(args: Sequence[str], flag: str) -> bool:
    """Whether ``args`` set ``--flag`` (as ``--flag V`` or ``--flag=V``)."""
    return any(flag_name(a) == flag for a in args)


def _concept(flag: str, engine: str) -> tuple[str, dict[str, str | None]] | None:
    """The row ``flag`` names a concept in: ``engine``'s own row first (the same name can mean
    different things to two engines: ``--max-total-tokens`` is SGLang's KV pool, TGI's request length)."""
    rows = [(concept, names) for concept, names in TUNING_FLAGS.items() if flag in names.values()]
    own = [row for row in rows if row[1].get(engine) == flag]
    found = own or rows
    return found[0] if found else None


def _label(engine: str) -> str:
    return {"vllm": "vLLM", "sglang": "SGLang", "tgi": "TGI", "sim": "the simulated engine"}.get(engine, engine)


def unsupported_args(engine: str, args: Sequence[str]) -> list[str]:
    """Reasons ``engine`` refuses these tuning arguments (empty when it takes them all)."""
    out: list[str] = []
    for arg in args:
        flag = flag_name(arg)
        if flag is None:
            continue
        found = _concept(flag, engine)
        own = found[1].get(engine) if found else None
        if engine == "sim" and flag in SIM_TUNING_FLAGS:
            continue
        if engine != "sim" and (found is None or flag == own):
            continue  # its own name, or a flag bench has no row for: the engine checks it
        if found is None:
            out.append(f"{_label(engine)} does not model --{flag}")
            continue
        concept, _ = found
        if own is None:
            out.append(f"{_label(engine)} has no {concept} flag (--{flag})")
        else:
            out.append(f"{_label(engine)} has no --{flag}; its {concept} flag is --{own}")
    return out
