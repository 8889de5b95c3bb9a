"""The embedded engine's settings (``bench sim serve``'s options), apart from its HTTP server.

Kept out of ``sim.server`` so that building the configuration (``bench sim describe``, a
virtual-time run of the modelled engine) does not import aiohttp's web server.
"""

from __future__ import annotations

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

    def __post_init__(self) -> None:
        if self.flavor not in ("vllm", "sglang", "tgi"):
            raise ValueError(f"flavor must be vllm, sglang or tgi, not {self.flavor!r}")
