"""Configuration of the modelled engine: presets, parallel layout, limits and TOML overrides.

TOML layout (every table optional; unknown keys are rejected with their dotted path)::

    [gpu]       # any GpuSpec field, e.g. hbm_tb_s = 3.0, mbu = 0.75
    [model]     # any ModelSpec field, e.g. layers = 40
    [profile]   # any EngineProfile field, e.g. t_fixed_ms = 4.0
    [engine]    # any ModelTiming field, e.g. tp = 2, max_num_seqs = 64 (CLI flags win)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bench_llm.core.config import ConfigError, from_mapping, load_toml
from bench_llm.core.layout import Layout, layout_problems
from bench_llm.sim.costmodel import CostModel, Parallel
from bench_llm.sim.presets import GPUS, MODELS, PROFILES, Dtype, EngineProfile, GpuSpec, ModelSpec, calibration

#: draft tokens per step beyond which no engine goes (vLLM's and SGLang's examples use 1-5)
MAX_SPEC_TOKENS = 8

Router = Literal["round-robin", "least-queue", "kv-aware", "prefix-aware"]


@dataclass(frozen=True)
class ModelTiming:
    """Everything the performance-model engine needs (CLI flags map onto these fields)."""

    preset: str = "llama-3.1-8b"
    gpu: str = "h100"
    dtype: Dtype | None = None  # None: the model preset's default
    #: KV-cache dtype; "auto": the engine profile's default for the weights' precision
    #: (``EngineProfile.kv_dtype_for``: BF16 on vLLM and SGLang, FP8 for FP8 weights on TRT-LLM)
    kv_dtype: Dtype | Literal["auto"] = "auto"
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    dcp: int = 1
    pcp: int = 1
    disagg_prefill: int = 0  # 0: colocated
    disagg_decode: int = 0
    #: the prefill pool's own layout when it differs from the decode pool's (tp/dp/ep above): each
    #: prefill instance is ``prefill_dp`` DP ranks of ``prefill_tp`` GPUs with EP width ``prefill_ep``
    #: (0: the decode pool's value), as P/D deployments run (e.g. TP8 prefill, DP8 x EP8 decode)
    prefill_tp: int = 0
    prefill_dp: int = 0
    prefill_ep: int = 0
    #: the prefill pool's own running-request and per-step token limits (0: the decode pool's): P/D
    #: deployments launch their prefill workers with small batches (AIConfigurator's generator: a prefill
    #: worker's max_batch_size is its prefill batch size, 1 by default; max_num_tokens ISL + 1 500)
    prefill_max_num_seqs: int = 0
    prefill_max_num_batched_tokens: int = 0
    router: Router = "round-robin"
    profile: str = "vllm"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    #: Share of GPU memory for weights + KV (vLLM --gpu-memory-utilization); None: the profile's.
    gpu_memory_utilization: float | None = None
    slowdown: float = 1.0
    jitter: float = 0.0
    seed: int = 0
    #: max/mean expert load across EP ranks (1.0: perfectly balanced)
    expert_imbalance: float = 1.3
    #: P/D KV transfer link (default: InfiniBand NDR ~45 GB/s), setup and efficiency
    kv_link_gb_s: float = 45.0
    kv_setup_ms: float = 1.0
    kv_link_efficiency: float = 0.7
    #: speculative decoding (MTP, EAGLE, a draft model): draft tokens proposed per decode step and verified by
    #: the next target pass (vLLM/SGLang ``num_speculative_tokens``, TRT-LLM ``num_nextn_predict_layers``); 0: off
    spec_tokens: int = 0
    #: chance that a draft token is accepted when the ones before it were (one rate for the whole chain); a
    #: property of the model and the text, not of the engine: measure it (engines report accepted drafts)
    spec_accept: float = 0.85
    #: layers of one draft pass, in the target model's layers (DeepSeek's MTP module: one decoder layer)
    spec_draft_layers: float = 1.0
    gpu_spec: GpuSpec | None = None
    model_spec: ModelSpec | None = None
    profile_spec: EngineProfile | None = None

    def __post_init__(self) -> None:
        if self.preset not in MODELS and self.model_spec is None:
            raise ValueError(f"unknown model preset {self.preset!r}; known: {', '.join(MODELS)}")
        if self.gpu not in GPUS and self.gpu_spec is None:
            raise ValueError(f"unknown GPU {self.gpu!r}; known: {', '.join(GPUS)}")
        if self.profile not in PROFILES and self.profile_spec is None:
            raise ValueError(f"unknown engine profile {self.profile!r}; known: {', '.join(PROFILES)}")
        for name in ("tp", "pp", "dp", "ep", "dcp", "pcp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.tp % self.dcp:
            raise ValueError(f"dcp ({self.dcp}) must divide tp ({self.tp})")
        problems = layout_problems("sim", Layout(self.tp, self.pp, self.dp, self.ep, self.dcp, self.pcp), self.model)
        if problems:
            raise ValueError("; ".join(problems))
        if self.expert_imbalance < 1.0:
            raise ValueError(f"expert_imbalance {self.expert_imbalance} is a max/mean load ratio: at least 1.0")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization {self.gpu_memory_utilization} must be in (0, 1]")
        if self.slowdown <= 0:
            raise ValueError("slowdown must be > 0")
        if self.jitter < 0:
            raise ValueError("jitter must be >= 0")
        if not 0 <= self.spec_tokens <= MAX_SPEC_TOKENS:
            raise ValueError(f"spec_tokens {self.spec_tokens} must be in 0..{MAX_SPEC_TOKENS}")
        if not 0 <= self.spec_accept <= 1:
            raise ValueError(f"spec_accept {self.spec_accept} is a probability: in [0, 1]")
        if self.spec_draft_layers < 0:
            raise ValueError("spec_draft_layers must be >= 0")
        if (self.disagg_prefill > 0) != (self.disagg_decode > 0):
            raise ValueError("disaggregation needs both prefill and decode instances")
        if min(self.prefill_tp, self.prefill_dp, self.prefill_ep) < 0:
            raise ValueError("prefill_tp, prefill_dp and prefill_ep must be >= 0 (0: the decode pool's)")
        if min(self.prefill_max_num_seqs, self.prefill_max_num_batched_tokens) < 0:
            raise ValueError("prefill_max_num_seqs and prefill_max_num_batched_tokens must be >= 0 (0: the decode "
                             "pool's)")
        if (self.prefill_max_num_seqs or self.prefill_max_num_batched_tokens) and not self.disaggregated:
            raise ValueError("prefill pool limits (prefill_max_num_seqs/_batched_tokens) need disaggregation")
        if self.prefill_layout_differs:
            if not self.disaggregated:
                raise ValueError("a prefill pool layout (prefill_tp/dp/ep) needs disaggregation")
            pf = self.prefill_pool_timing()
            problems = layout_problems("sim", Layout(pf.tp, pf.pp, pf.dp, pf.ep, pf.dcp, pf.pcp), self.model)
            if problems:
                raise ValueError("prefill pool: " + "; ".join(problems))
        self.engine_profile.scheduling_policy()  # an unknown [profile] policy fails here, with the known ones

    @property
    def model(self) -> ModelSpec:
        return self.model_spec or MODELS[self.preset]

    @property
    def gpu_model(self) -> GpuSpec:
        return self.gpu_spec or GPUS[self.gpu]

    @property
    def engine_profile(self) -> EngineProfile:
        prof = self.profile_spec or PROFILES[self.profile]
        if self.gpu_memory_utilization is not None:
            prof = dataclasses.replace(prof, gpu_memory_utilization=self.gpu_memory_utilization)
        return prof

    @property
    def weight_dtype(self) -> Dtype:
        return self.dtype or self.model.default_dtype

    @property
    def kv_cache_dtype(self) -> Dtype:
        """The KV-cache dtype in effect (``kv_dtype``, with "auto" resolved by the engine profile)."""
        if self.kv_dtype == "auto":
            return self.engine_profile.kv_dtype_for(self.weight_dtype)
        return self.kv_dtype

    @property
    def parallel(self) -> Parallel:
        return Parallel(self.tp, self.pp, self.dp, self.ep, self.dcp, self.pcp)

    @property
    def disaggregated(self) -> bool:
        return self.disagg_prefill > 0

    @property
    def prefill_layout_differs(self) -> bool:
        return any(v and v != getattr(self, k) for k, v in
                   (("tp", self.prefill_tp), ("dp", self.prefill_dp), ("ep", self.prefill_ep)))

    def prefill_pool_timing(self) -> "ModelTiming":
        """The timing a prefill instance runs with: this one with the prefill pool's layout."""
        if not self.prefill_layout_differs:
            return self
        return dataclasses.replace(self, tp=self.prefill_tp or self.tp, dp=self.prefill_dp or self.dp,
                                   ep=self.prefill_ep or self.ep, dcp=1, prefill_tp=0, prefill_dp=0, prefill_ep=0)

    @property
    def gpus(self) -> int:
        per = self.tp * self.pp * self.pcp
        if self.disaggregated:
            pf = self.prefill_pool_timing()
            return pf.tp * pf.pp * pf.pcp * pf.dp * self.disagg_prefill + per * self.disagg_decode * self.dp
        return per * self.dp

    def cost_model(self) -> CostModel:
        return CostModel(
            self.model, self.gpu_model, self.engine_profile, self.parallel, self.weight_dtype, self.kv_cache_dtype,
            self.expert_imbalance if self.ep > 1 else 1.0, self.spec_tokens, self.spec_draft_layers,
        )

    def limits(self) -> tuple[int, int, bool]:
        """(max_num_seqs, max_num_batched_tokens, prefix caching) after profile and GPU defaults."""
        prof = self.engine_profile
        big = self.gpu_model.memory_gb >= 70 and self.gpu != "a100"
        seqs = self.max_num_seqs or prof.max_num_seqs or (1024 if big else 256)
        budget = self.max_num_batched_tokens or prof.max_num_batched_tokens or (8192 if big else 2048)
        if self.spec_tokens:
            # a speculative decode takes 1 + k tokens of the step's budget, and the model gives every decode
            # its k drafts: it runs no more requests than a step can hold (vLLM's V1 scheduler instead trims
            # the drafts of the requests the budget cannot hold; an approximation at the budget's edge)
            seqs = min(seqs, max(1, budget // (1 + self.spec_tokens)))
        prefix = prof.enable_prefix_caching if self.enable_prefix_caching is None else self.enable_prefix_caching
        return seqs, budget, prefix


_TABLES = ("gpu", "model", "profile", "engine")


def apply_toml(base: ModelTiming, path: Path, cli: dict[str, Any]) -> ModelTiming:
    """``base`` with the TOML file's overrides, then the explicitly given CLI values on top."""
    data = load_toml(path)
    unknown = [k for k in data if k not in _TABLES]
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(_TABLES)})")
    engine = data.get("engine", {})
    timing = from_mapping(ModelTiming, {**_plain(base), **engine, **cli}, "engine", str(path)) if engine or cli else base
    values: dict[str, Any] = {}
    if "gpu" in data:
        values["gpu_spec"] = from_mapping(GpuSpec, {**_plain(timing.gpu_model), **data["gpu"]}, "gpu", str(path))
    if "model" in data:
        values["model_spec"] = from_mapping(ModelSpec, {**_plain(timing.model), **data["model"]}, "model", str(path))
    if "profile" in data:
        values["profile_spec"] = from_mapping(
            EngineProfile, {**_plain(timing.engine_profile), **data["profile"]}, "profile", str(path)
        )
    return dataclasses.replace(timing, **values) if values else timing


def _plain(obj: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            continue
        out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def describe(t: ModelTiming) -> dict[str, Any]:
    """A JSON-able summary (served by /server_info and /info, logged at start)."""
    cm = t.cost_model()
    seqs, budget, prefix = t.limits()
    return {
        "model": t.model.name,
        "gpu": t.gpu_model.name,
        "dtype": t.weight_dtype,
        "kv_dtype": t.kv_cache_dtype,
        "profile": t.engine_profile.name,
        "policy": t.engine_profile.policy,
        "era": t.engine_profile.era,
        "calibration": calibration(t.model.name, t.engine_profile),
        "parallel": {"tp": t.tp, "pp": t.pp, "dp": t.dp, "ep": t.ep, "dcp": t.dcp, "pcp": t.pcp,
                     "disagg": f"{t.disagg_prefill}:{t.disagg_decode}" if t.disaggregated else None,
                     **({"prefill_pool": {"tp": t.prefill_pool_timing().tp, "dp": t.prefill_pool_timing().dp,
                                          "ep": t.prefill_pool_timing().ep}} if t.prefill_layout_differs else {})},
        "gpus": t.gpus,
        "router": t.router,
        "weights_gb_per_gpu": round(cm.weights_gb_per_gpu, 2),
        "kv_tokens_per_instance": cm.kv_tokens(),
        "gpu_memory_utilization": t.engine_profile.gpu_memory_utilization,
        "max_num_seqs": seqs,
        "max_num_batched_tokens": budget,
        "enable_prefix_caching": prefix,
        "slowdown": t.slowdown,
        "jitter": t.jitter,
        "seed": t.seed,
        **({"speculative": {"draft_tokens": t.spec_tokens, "accept": t.spec_accept,
                            "draft_layers": t.spec_draft_layers}} if t.spec_tokens else {}),
        **({"moe": moe_layout(t)} if t.model.is_moe else {}),
    }


def moe_layout(t: ModelTiming) -> dict[str, Any]:
    """Where a MoE model's experts sit and what sets its MoE step: with EP, whole experts over the
    instance's tp×pcp×dp GPUs, and the busiest GPU's expert load (``expert_imbalance`` × the mean)
    sets the step; without EP, every GPU holds a 1/tp slice of every expert (no imbalance)."""
    m = t.model
    if t.ep > 1:
        return {
            "experts": m.experts, "top_k": m.top_k, "ep_group_gpus": t.ep,
            "experts_per_gpu": round(m.experts / t.ep, 2), "expert_imbalance": t.expert_imbalance,
            "step": f"the busiest expert GPU sets each MoE step: {t.expert_imbalance:g}x the mean expert load",
        }
    return {
        "experts": m.experts, "top_k": m.top_k, "ep_group_gpus": 1,
        "experts_per_gpu": round(m.experts / t.tp, 2), "expert_imbalance": None,
        "step": f"no EP: every GPU holds 1/{t.tp} of every expert, so expert load does not skew the step",
    }

