"""The embedded engine's settings (``bench sim serve``'s options), apart from its HTTP server.

Kept out of ``sim.server`` so that building the configuration (``bench sim describe``, a
virtual-time run of the modelled engine) does not import aiohttp's web server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from bench_llm.sim.faults import FaultSpec
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.timing import FixedTiming


@dataclass(frozen=True)
class ServerConfig:
    model: str = "sim-model"
    timing: FixedTiming = FixedTiming()
    max_model_len: int = 131072
    flavor: str = "vllm"
    #: None: fixed timing; otherwise the performance model
    model_timing: ModelTiming | None = None
    faults: FaultSpec = field(default_factory=FaultSpec)
    emission_log: Path | None = None
    seed: int = 0
    #: fixed timing on a global ITL grid (all streams step together) instead of per-request deadlines
    fixed_grid: bool = False
    #: busy-wait the last microseconds before each deadline (tighter emission times, more CPU)
    spin_us: int = 0
    #: > 0: requests that do not force their length (no ignore_eos; TGI always) stop at a seeded
    #: geometric "end of sequence" with this mean length; 0: every request gets max_tokens
    natural_stop_mean: float = 0.0
    #: TGI flavour: TGI's --max-concurrent-requests (default 128; 0: no limit). Past it a request
    #: is answered at once with an in-stream "overloaded" error (router/src/infer/mod.rs)
    max_concurrent_requests: int = 128
    #: > 0: chat answers start with this many reasoning tokens (``delta.reasoning_content``,
    #: vLLM's reasoning-parser shape), always leaving at least one answer token
    reasoning_tokens: int = 0
    #: LoRA adapters served besides the base model (requests name one as their model)
    lora_adapters: tuple[str, ...] = ()
    #: adapters resident at once (vLLM --max-loras); loading another evicts the least recently used
    max_loras: int = 1
    #: time to load an adapter that is not resident: the request waits it before it can be scheduled
    lora_swap_ms: float = 0.0
    #: bench's OTLP/HTTP receiver (``http://host:port/v1/traces``): each finished request's span
    #: is exported there in the flavour's naming (sim/otlp.py); None: no spans
    otlp_traces_endpoint: str | None = None
    #: the imitated engine's release; SGLang flavour: which generation it speaks (SGLANG_GENERATIONS:
    #: meta_info timings, span attributes, the sampling-params schema check, /flush_cache) and the
    #: version it reports; None: the newest generation (SGLANG_VERSION)
    engine_version: str | None = None
    #: vLLM flavour: --max-num-queued-reqs (0: no limit): requests in the engine, waiting and
    #: running; past it a request is answered HTTP 503
    max_num_queued_reqs: int = 0
    #: SGLang flavour: --max-queued-requests (0: no limit); past it the stream ends with
    #: finish_reason {"type": "abort", "status_code": 503} (HTTP 503 without streaming)
    max_queued_requests: int = 0

    def __post_init__(self) -> None:
        if self.flavor not in ("vllm", "sglang", "tgi"):
            raise ValueError(f"flavor must be vllm, sglang or tgi, not {self.flavor!r}")
        if self.engine_version is not None and release(self.engine_version) is None:
            raise ValueError(f"engine_version {self.engine_version!r}: expected a release such as 0.5.23")
        if self.max_num_queued_reqs < 0 or self.max_queued_requests < 0:
            raise ValueError("max_num_queued_reqs and max_queued_requests must be >= 0 (0: no limit)")
        if self.max_num_queued_reqs and self.flavor != "vllm":
            raise ValueError(f"max_num_queued_reqs is vLLM's admission limit; the {self.flavor} flavour's is "
                             + ("max_queued_requests" if self.flavor == "sglang" else "max_concurrent_requests"))
        if self.max_queued_requests and self.flavor != "sglang":
            raise ValueError(f"max_queued_requests is SGLang's admission limit; the {self.flavor} flavour's is "
                             + ("max_num_queued_reqs" if self.flavor == "vllm" else "max_concurrent_requests"))

    @property
    def sglang_release(self) -> tuple[int, ...]:
        """The SGLang release the SGLang flavour imitates."""
        return release(self.engine_version or SGLANG_VERSION) or release(SGLANG_VERSION) or ()

    @property
    def sglang_generation(self) -> str:
        """Which of SGLANG_GENERATIONS the SGLang flavour speaks."""
        have = self.sglang_release
        return next(name for name, since in SGLANG_GENERATIONS if have >= since)


#: The newest SGLang release the SGLang flavour imitates (its default).
SGLANG_VERSION = "0.5.23"
#: SGLang generations the flavour speaks, newest first, with the first release of each
#: (docs/engines.md, "Per-request timings"): "0.5.23" reports wall-clock stamps and
#: first_token_latency, and its root span latency attributes; "0.5.10" the renamed
#: prefill_waiting_latency, the stamps and the span attributes; "0.5.8" the older keys and a
#: root span that names the request only.
SGLANG_GENERATIONS: tuple[tuple[str, tuple[int, ...]], ...] = (("0.5.23", (0, 5, 12)), ("0.5.10", (0, 5, 10)),
                                                                ("0.5.8", (0,)))  # fmt: skip
#: Releases from which SGLang refuses unknown sampling_params keys (HTTP 400, entrypoints/api_contract.py).
SGLANG_SCHEMA_CHECK_SINCE = (0, 5, 22)


def release(version: str) -> tuple[int, ...] | None:
    """``"0.5.23"`` or ``"v0.5.10.post1"`` -> (0, 5, 23) ...; None when unreadable."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None
