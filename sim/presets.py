"""Hardware, model and engine-profile presets for the simulated engine's cost model.

Figures come from ``shared/reference/simulator-model.md`` (§2.11 hardware, §3 calibration,
§5 defaults). Every preset can be overridden from TOML (see ``sim.options``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Dtype = Literal["bf16", "fp8"]


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    bf16_tflops: float  # dense
    fp8_tflops: float  # dense (0: no FP8 tensor cores; BF16 peak is used)
    hbm_tb_s: float
    memory_gb: float
    #: All-reduce latency α (µs) at 2/4/8 GPUs and large-message bus bandwidth (GB/s).
    ar_alpha_us: tuple[float, float, float] = (8.0, 11.0, 15.0)
    ar_bus_gb_s: tuple[float, float, float] = (305.0, 342.0, 414.0)
    p2p_alpha_us: float = 6.0
    p2p_gb_s: float = 360.0
    a2a_alpha_us: float = 13.0
    a2a_gb_s: float = 155.0
    mfu_gemm: float = 0.77  # BF16 GEMMs at large token counts
    mfu_gemm_fp8: float = 0.55  # achieved fraction of the FP8 peak (NIM TTFT fit, §3.4)
    mfu_attn: float = 0.5
    mbu: float = 0.8
    mbu_kv: float = 0.75

    def peak_flops(self, dtype: Dtype) -> float:
        if dtype == "fp8" and self.fp8_tflops > 0:
            return self.fp8_tflops * 1e12 * self.mfu_gemm_fp8
        return self.bf16_tflops * 1e12 * self.mfu_gemm


GPUS: dict[str, GpuSpec] = {
    "a100": GpuSpec("a100", 312.0, 0.0, 2.039, 80.0, ar_alpha_us=(9.0, 12.0, 16.0), ar_bus_gb_s=(230.0, 240.0, 250.0),
                    p2p_gb_s=240.0, a2a_gb_s=120.0, mfu_gemm=0.72),
    "h100": GpuSpec("h100", 989.0, 1979.0, 3.35, 80.0),
    "h200": GpuSpec("h200", 989.0, 1979.0, 4.8, 141.0, ar_alpha_us=(6.0, 9.0, 15.0), ar_bus_gb_s=(289.0, 330.0, 331.0)),
    # PCIe only (no NVLink): slow, latency-heavy collectives (reference §2.4, unverified).
    "l40s": GpuSpec("l40s", 362.0, 733.0, 0.864, 48.0, ar_alpha_us=(25.0, 30.0, 40.0), ar_bus_gb_s=(22.0, 22.0, 22.0),
                    p2p_alpha_us=15.0, p2p_gb_s=25.0, a2a_alpha_us=30.0, a2a_gb_s=20.0, mfu_gemm=0.65),
}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    params_b: float  # total parameters (billions)
    active_params_b: float  # parameters used per token (MoE: attention + top-k experts)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    default_dtype: Dtype = "bf16"
    #: MoE: expert parameters (billions, all experts, all layers), experts, top-k, MoE layers.
    expert_params_b: float = 0.0
    experts: int = 0
    top_k: int = 0
    moe_layers: int = 0
    #: Latent KV (MLA): elements per token per layer, shared by all heads (0: regular GQA KV).
    mla_kv_dim: int = 0
    max_model_len: int = 131072

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def kv_elems_per_token_layer(self, tp: int) -> float:
        """KV elements one GPU stores per token per layer at tensor-parallel degree ``tp``."""
        if self.mla_kv_dim:
            return float(self.mla_kv_dim)  # latent KV is replicated across TP ranks
        return 2.0 * -(-self.kv_heads // tp) * self.head_dim if tp <= self.kv_heads else 2.0 * self.head_dim


#: ``default_dtype`` fp8 for the 70B preset: in BF16, 70B at TP2 on 80 GB GPUs leaves ~1-2 GB per
#: GPU for KV, which starves every TP2 cell; FP8 weights (as the NIM reference rows) keep the
#: real TP-vs-DP trade-off visible. Pass ``--dtype bf16`` for the vLLM-CI rows.
MODELS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec("llama-3.1-8b", 8.03, 8.03, 32, 4096, 32, 8, 128),
    "llama-3.1-70b": ModelSpec("llama-3.1-70b", 70.6, 70.6, 80, 8192, 64, 8, 128, default_dtype="fp8"),
    "mixtral-8x7b": ModelSpec(
        "mixtral-8x7b", 46.7, 12.9, 32, 4096, 32, 8, 128, expert_params_b=45.1, experts=8, top_k=2, moe_layers=32,
        max_model_len=32768,
    ),
    "deepseek-v3": ModelSpec(
        "deepseek-v3", 671.0, 37.0, 61, 7168, 128, 128, 128, default_dtype="fp8", expert_params_b=656.0, experts=256,
        top_k=8, moe_layers=58, mla_kv_dim=576, max_model_len=163840,
    ),
}


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Per-engine constants: fixed step overhead, TP skew, batch limits, request overhead."""

    name: str
    t_fixed_ms: float = 2.0
    tp_skew_us_at_4: float = 15.0  # added per all-reduce at TP4; scales as (tp/4)^1.25
    request_overhead_ms: float = 5.0  # HTTP + tokenizer before a request can be scheduled
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    reserve_gb: float = 2.0  # activations, CUDA graphs
    max_num_batched_tokens: int = 0  # 0: by GPU memory (8192 on >= 70 GiB GPUs, else 2048)
    max_num_seqs: int = 0  # 0: by GPU memory (1024 on >= 70 GiB GPUs, else 256)
    watermark: float = 0.01
    enable_prefix_caching: bool = True
    jitter_sigma: float = 0.0


PROFILES: dict[str, EngineProfile] = {
    "vllm": EngineProfile("vllm"),
    "sglang": EngineProfile("sglang", t_fixed_ms=2.0, request_overhead_ms=4.0),
    "tgi": EngineProfile("tgi", t_fixed_ms=3.0, request_overhead_ms=5.0, max_num_batched_tokens=4096,
                         enable_prefix_caching=True),
    "legacy-2023": EngineProfile("legacy-2023", t_fixed_ms=13.0, tp_skew_us_at_4=15.0, request_overhead_ms=10.0,
                                 max_num_batched_tokens=4096, max_num_seqs=256, enable_prefix_caching=False),
}


def with_dtype_default(model: ModelSpec, dtype: Dtype | None) -> Dtype:
    return dtype or model.default_dtype


def override(obj: object, values: dict[str, object]) -> object:
    """``dataclasses.replace`` that tolerates frozen slotted dataclasses."""
    return replace(obj, **values)  # type: ignore[type-var]
