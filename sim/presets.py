"""Hardware, model and engine-profile presets for the simulated engine's cost model.

Figures come from ``shared/reference/simulator-model.md`` (§2.11 hardware, §3 calibration,
§5 defaults). Every preset can be overridden from TOML (see ``sim.options``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from bench_llm.sim.policy import SchedulingPolicy, make_policy

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
    #: MLA decode attention where compute-bound (all heads of a GPU over the latent cache): FlashMLA's README
    #: gives 660 TFLOP/s on H800 SXM5, 989 dense BF16 (deepseek-ai/FlashMLA), 0.67 of the peak
    mfu_mla_decode: float = 660.0 / 989.0
    mbu: float = 0.8
    mbu_kv: float = 0.75
    #: Hopper's warpgroup MMA (wgmma). The expert-GEMM ceilings (``EngineProfile.moe_gemm_tflops*``) model
    #: kernels that leave it unused; a GPU without it (A100, L40S) runs those kernels on the mma.sync path they
    #: were written for, at its dense rate (issue 35: Mixtral A100 BF16 1000/1000 offline 0.95x -> 0.65x with
    #: the Hopper-fitted 90 TFLOP/s applied to an A100, whose own dense BF16 rate is 225)
    wgmma: bool = False

    def peak_flops(self, dtype: Dtype) -> float:
        if dtype == "fp8" and self.fp8_tflops > 0:
            return self.fp8_tflops * 1e12 * self.mfu_gemm_fp8
        return self.bf16_tflops * 1e12 * self.mfu_gemm


GPUS: dict[str, GpuSpec] = {
    "a100": GpuSpec("a100", 312.0, 0.0, 2.039, 80.0, ar_alpha_us=(9.0, 12.0, 16.0), ar_bus_gb_s=(230.0, 240.0, 250.0),
                    p2p_gb_s=240.0, a2a_gb_s=120.0, mfu_gemm=0.72),
    "h100": GpuSpec("h100", 989.0, 1979.0, 3.35, 80.0, wgmma=True),
    "h200": GpuSpec("h200", 989.0, 1979.0, 4.8, 141.0, ar_alpha_us=(6.0, 9.0, 15.0), ar_bus_gb_s=(289.0, 330.0, 331.0),
                    wgmma=True),
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
    #: the FP8 checkpoint's weight scales are per 128x128 block (DeepSeek-V3/R1: ``weight_block_size``
    #: [128, 128]); False: per tensor (Mixtral FP8 checkpoints). Selects the expert-GEMM rate
    #: (``EngineProfile.moe_gemm_tflops_fp8`` applies to block-scaled experts only)
    fp8_block_scaled: bool = False

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
        top_k=8, moe_layers=58, mla_kv_dim=576, max_model_len=163840, fp8_block_scaled=True,
    ),
}


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One engine generation: its scheduling policy, fixed costs, limits, and what backs them.

    ``calibration`` names the published figures the profile's constants were fitted to and
    how closely the simulator reproduces them (empty: nothing backs it, the simulator says
    "uncalibrated"). The fitted figures and the held-out rows are in ``sim.validation``.
    """

    name: str
    #: ``sim.policy`` name: what one step may carry (mixed chunked steps, or prefill-first)
    policy: str = "v1-chunked"
    era: str = ""
    calibration: str = ""
    t_fixed_ms: float = 2.0
    tp_skew_us_at_4: float = 15.0  # added per all-reduce at TP4; scales as (tp/4)^1.25
    #: the skew stops growing above this TP degree (0: it grows as (tp/4)^1.25 at every degree). The 15 us is a
    #: fit on TP4 rows; its growth to TP8 (x2.4) was never fitted, and the measured vLLM 70B TP8 H200 rows say
    #: it does not grow: TPOT 1.26-1.61x with the growth (sim.silicon)
    tp_skew_cap_tp: int = 0
    request_overhead_ms: float = 5.0  # HTTP + tokenizer before a request can be scheduled
    #: the serial part of it: the API server's one event loop parses, validates and tokenises requests one
    #: at a time (about 1 ms for a 1k-token prompt: an estimate, not a fit), so a burst of k requests reaches
    #: the scheduler over k ms, and an idle engine starts a step with the first one alone. Without it, C
    #: closed-loop streams started together share every prefill step for ever (issue 35: bench's own client
    #: against the simulated server in real time splits them the same way)
    frontend_serial_ms: float = 1.0
    #: CPU time per sequence in a step (scheduling, sampling, detokenising, output objects)
    per_seq_us: float = 0.0
    #: fixed time per MoE layer per step (router GEMM, top-k, token permute/align, grouped-GEMM launch)
    moe_layer_us: float = 0.0
    #: FLOP/s ceiling (TFLOP/s) of the expert (grouped) GEMMs, whatever the GPU (0: the dense GEMM rate):
    #: vLLM's and SGLang's 2024 fused-MoE Triton kernels did not use Hopper's wgmma, so Hopper ran them at
    #: about Ampere's rate; fitted to vLLM CI Mixtral H200 throughput. Hopper only (``GpuSpec.wgmma``): an A100
    #: runs those kernels at its dense rate (the vLLM CI Mixtral A100 throughput row: 1.04; 0.92 when capped)
    moe_gemm_tflops: float = 0.0
    #: the same ceiling for block-scaled FP8 expert GEMMs (``ModelSpec.fp8_block_scaled``: DeepSeek's 128x128
    #: blocks; 0: the dense FP8 rate). FP8 MoE runs on other kernels than the 2024 BF16 Triton ones the ceiling
    #: above was fitted to (DeepGEMM/CUTLASS in SGLang 0.5, TRT-LLM's own), so the BF16 ceiling does not carry
    #: over (issue 35: it put SGLang DeepSeek TPOT at 1.1-1.5x); vLLM keeps block-FP8 experts on its Triton
    #: kernel. Per-tensor FP8 experts (Mixtral FP8 checkpoints) run at the dense FP8 rate on every profile:
    #: vLLM's ``fused_moe_kernel`` (model_executor/layers/fused_moe/fused_moe.py) accumulates them in place,
    #: ``tl.dot(a, b, acc=accumulator)``, and scales once after the K loop, where block-FP8 reloads both
    #: scale vectors and rescales every K step (``accumulator += tl.dot(a, b) * a_scale[:, None] *
    #: b_scale[None, :]``, BLOCK_SIZE_K capped at the 128 block: ``invoke_fused_moe_kernel``); compressed-
    #: tensors per-tensor/per-channel FP8 MoE on SM90 runs CUTLASS grouped GEMMs, block-quantised excluded
    #: (``CompressedTensorsW8A8Fp8MoEMethod``: ``use_cutlass = not self.block_quant and _is_fp8_w8a8_sm90``).
    #: Issue 35: the ceiling on per-tensor experts put Mixtral FP8 TP2 H100 1000/1000 offline at 0.19x
    #: (1.00x before the ceiling existed)
    moe_gemm_tflops_fp8: float = 0.0
    #: fixed time per MLA attention layer per step (latent projections, rope split, extra kernels)
    mla_layer_us: float = 0.0
    #: multiplies the EP all-to-all time of the cost model (dispatch + combine per MoE layer): an engine's
    #: own all-to-all kernels (TRT-LLM's fused MoE communication overlaps most of it)
    ep_a2a_scale: float = 1.0
    #: prefill/decode disaggregation: time a request spends between its prefill's end and its decode
    #: admission besides the KV bytes' transfer (the P/D router and front end, the transfer's set-up and
    #: completion notices); 0: none
    disagg_handoff_ms: float = 0.0
    #: decode batches above this size run without CUDA graphs (0: every step is graphed, or not modelled);
    #: such eager steps, and every step carrying a prefill, take at least ``eager_layer_us`` per layer:
    #: the CPU time to launch the layer's kernels one by one (the GPU waits for them)
    cuda_graph_max_bs: int = 0
    eager_layer_us: float = 0.0
    #: multi-step scheduling: decode steps in a row before a prefill may start (prefill-first policies)
    scheduler_steps: int = 1
    #: TGI router: a new batch joins when waiting >= ratio x running, or after max_waiting_steps
    waiting_served_ratio: float = 1.2
    max_waiting_steps: int = 20
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    reserve_gb: float = 2.0  # activations, CUDA graphs
    max_num_batched_tokens: int = 0  # 0: by GPU memory (8192 on >= 70 GiB GPUs, else 2048)
    max_num_seqs: int = 0  # 0: by GPU memory (1024 on >= 70 GiB GPUs, else 256)
    watermark: float = 0.01
    enable_prefix_caching: bool = True
    jitter_sigma: float = 0.0
    #: the KV-cache dtype the engine picks by default for an FP8 checkpoint ("auto"): vLLM and SGLang
    #: keep the activations' BF16 (``--kv-cache-dtype auto``: "the model's data type"); TRT-LLM takes the
    #: checkpoint's KV quantisation, FP8 in NVIDIA's FP8 (ModelOpt) checkpoints
    kv_dtype_fp8: str = "bf16"
    #: KV reserved at admission for output not yet generated (``sim.scheduler.Limits``): a new request needs
    #: free KV for its prompt and its remaining output (at most ``kv_reserve_clip`` tokens) after each running
    #: request's remaining output x this ratio is held back. 0: none (vLLM allocates as tokens come).
    #: SGLang 0.5 (schedule_policy.PrefillAdder): running requests x ``new_token_ratio``, 0.7 decaying over 600
    #: decode steps to 0.7 x 0.14 = 0.098 (global_config), outputs clipped at CLIP_MAX_NEW_TOKENS 4096.
    #: TRT-LLM (capacity scheduler GUARANTEED_NO_EVICT, its default): every request's whole output, 1.0
    kv_reserve_ratio: float = 0.0
    kv_reserve_clip: int = 1 << 30

    def kv_dtype_for(self, weights: Dtype) -> Dtype:
        """The KV-cache dtype this engine uses by default for weights of ``weights`` precision."""
        return "fp8" if weights == "fp8" and self.kv_dtype_fp8 == "fp8" else "bf16"

    def scheduling_policy(self) -> SchedulingPolicy:
        return make_policy(self.policy, self.scheduler_steps, self.waiting_served_ratio, self.max_waiting_steps)


# Per-step, per-sequence and per-layer constants are fitted in sim/validation.py (FIT rows);
# the figures and sources are listed there and in docs/simulator.md. A profile keeps the
# constants of the engine generation it names; "vllm", "sglang" and "tgi" are the flavours'
# defaults (``bench sim serve --flavor X`` uses profile X unless ``--profile`` is given).
#: Fitted constants (``python -m sim.validation --fit``, rounded): see sim/validation.py's FIT rows.
MOE_LAYER_US = 15.0  # vLLM CI Mixtral-8x7B TP2 H200 bs8 32/128 latency, 1921.1 ms
MOE_GEMM_TFLOPS = 90.0  # vLLM CI Mixtral-8x7B TP2 H200 offline ShareGPT, 8.05 req/s
MLA_LAYER_US = 356.0  # sglang#2643 DeepSeek-V3 TP8 H200 batch 1 128/256, 30.29 tok/s
#: sglang#3602 DeepSeek-V3 TP8 H200 at 40 req/s, 1403 output tok/s: decode batches above SGLang's default
#: CUDA-graph limit of 160 (its server_args at the time) and prefills run eagerly
SGLANG_2024_EAGER_LAYER_US = 3600.0
#: SGLang 0.5.6 Llama-3.1-8B FP8 on H200, all 46 measured rows (AIConfigurator's silicon data, C 20-512, TP1-8):
#: TPOT stays 23-39 ms from TP1 to TP8 at 100-500 running requests, the CPU's share of each step (scheduling,
#: sampling, detokenising per sequence) rather than the GPU's; 20 us per sequence per step (sim.silicon)
SGLANG_PER_SEQ_US = 20.0
#: TRT-LLM DeepSeek-V3/R1 FP8 on 8xH200, the 88 aggregated measured rows (sim.silicon): per MLA layer per
#: step (its MLA and MoE kernels beyond the roofline: TP8 TPOT was 0.51-0.84x without it), and the EP8
#: all-to-all at a quarter of the generic estimate (its fused MoE communication; EP8 TPOT was up to 1.5x):
#: a grid over (60-140 us) x (0.25, 0.5, 1), best TPOT count (28 -> 53 of 88 within ±20 %)
TRTLLM_MLA_LAYER_US = 100.0
TRTLLM_EP_A2A_SCALE = 0.25
#: P/D hand-off (router, front end, KV set-up besides its bytes): the median of measured - simulated TTFT
#: over the disaggregated DeepSeek rows at C <= 64 before it (TRT-LLM 35 rows: 995 ms, spread 0.4-7 s;
#: SGLang 40 rows: 446 ms, spread 0-1.4 s); noisy, the rows repeat one configuration at up to 3x apart.
#: Re-derived the same way once each pool ran its own layout (issue 35): TRT-LLM 1174 ms (quartiles 703 and
#: 2221), SGLang 455 (39 rows, quartiles 329 and 738: kept at 450)
#: Issue 35's P/D pass: re-derived the same way on the 15 TRT-LLM rows at C <= 64 whose deployment is known
#: (given, or taken from the labelled rows at the same concurrency; the 20 others run a guessed 1P:1D and
#: sat 1-7 s above): 796 ms (quartiles 550 and 1174), rounded to 800. It stays a fitted constant: the gap it
#: stands for grows with the request rate per prefill worker (about 0.5 s at 2.5 req/s, 0.7-0.9 s at 4-7,
#: 2.7-4.4 s near the worker's measured capacity), the shape of a queue (docs/simulator.md)
TRTLLM_PD_HANDOFF_MS = 800.0
SGLANG_PD_HANDOFF_MS = 450.0
#: SGLang's steady-state new_token_ratio (global_config: 0.7 x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR 0.14)
SGLANG_NEW_TOKEN_RATIO_MIN = 0.098
#: trtllm-serve's --max_batch_size default (BuildConfig.max_batch_size, TensorRT-LLM 0.x-1.x)
TRTLLM_MAX_BATCH_SIZE = 2048
V0_PER_SEQ_US = 70.0  # vLLM 0.6.0 70B TP4 H100 ShareGPT 4 req/s median TPOT 23.58 ms (sglang-060)
V0_REQUEST_OVERHEAD_MS = 40.0  # same row, median TTFT 179.15 ms
PROFILES: dict[str, EngineProfile] = {
    # vLLM V1 engine (0.8+, 2025): mixed chunked-prefill steps, async output processing.
    # MoE constants from the vLLM CI Mixtral-8x7B TP2 H200 rows (bs8 latency, offline throughput).
    "vllm": EngineProfile(
        "vllm", era="vLLM V1 engine (0.8+, 2025)",
        calibration="vLLM CI H200/H100 bs8 latency 8B/70B, Mixtral H200 latency and throughput, NIM c1 5000/500 "
                    "(fitted, within 5 %); held out: vLLM CI A100 and throughput rows, NIM under load",
        moe_layer_us=MOE_LAYER_US, moe_gemm_tflops=MOE_GEMM_TFLOPS,
        # FP8 experts too: vLLM's block-FP8 fused MoE on Hopper is its Triton kernel unless DeepGEMM is turned
        # on; the held-out DeepSeek-R1 TP8 row (vllm#25049) came out 1.73x without the ceiling, 1.03x with it
        moe_gemm_tflops_fp8=MOE_GEMM_TFLOPS, tp_skew_cap_tp=4,
    ),
    # vLLM V0 engine (0.5-0.6, 2024): prefill-only steps stall the decodes; no chunked prefill
    # below 32K context (budget = max_model_len, 4096 in the fitted rows); Python scheduling
    # and output processing cost per sequence.
    "vllm-v0": EngineProfile(
        "vllm-v0", policy="v0-prefill-first", era="vLLM V0 engine (0.5-0.6, 2024)",
        calibration="SGLang's vLLM 0.6.0 comparison, 70B TP4 H100 ShareGPT at 4 req/s (fitted: TPOT, TTFT); "
                    "held out: 8 req/s and offline throughput (see bench sim validate)",
        per_seq_us=V0_PER_SEQ_US, request_overhead_ms=V0_REQUEST_OVERHEAD_MS,
        moe_layer_us=MOE_LAYER_US, moe_gemm_tflops=MOE_GEMM_TFLOPS,
        moe_gemm_tflops_fp8=MOE_GEMM_TFLOPS,
        max_num_batched_tokens=4096, max_num_seqs=256,
    ),
    # SGLang (2025): prefill-first with chunked prefill (8192), overlap scheduler hides CPU cost.
    "sglang": EngineProfile(
        "sglang", policy="sglang-prefill-first", era="SGLang 0.4.x (2025)",
        calibration="dense constants shared with vllm; per_seq_us and the P/D hand-off fitted on measured H200 "
                    "rows (sim.silicon); held out: SGLang 0.3.0 70B TP4 H100 ShareGPT rows",
        request_overhead_ms=4.0, moe_layer_us=MOE_LAYER_US, moe_gemm_tflops=MOE_GEMM_TFLOPS,
        per_seq_us=SGLANG_PER_SEQ_US, disagg_handoff_ms=SGLANG_PD_HANDOFF_MS, tp_skew_cap_tp=4,
        kv_reserve_ratio=SGLANG_NEW_TOKEN_RATIO_MIN, kv_reserve_clip=4096,
    ),
    # SGLang at its first DeepSeek-V3 release (v0.4.1, Dec 2024): Triton MLA decode and fused-MoE
    # kernels, many small kernels per layer; MLA term fitted to the batch-1 row of sgl-project/sglang#2643.
    "sglang-2024": EngineProfile(
        "sglang-2024", policy="sglang-prefill-first", era="SGLang 0.4.1 (Dec 2024)",
        calibration="DeepSeek-V3 TP8 H200 batch 1 (sgl-project/sglang#2643, fitted: mla_layer_us) and TP8 at 40 "
                    "req/s (sglang#3602, fitted: eager steps above 160); held out: batch 8/32 within 12 %, EP8 over "
                    "TP8 0.95, ShareGPT 5k with DP attention 1.02x (1.66x before issue 35's DP x EP expert tokens)",
        request_overhead_ms=4.0, moe_layer_us=MOE_LAYER_US, moe_gemm_tflops=MOE_GEMM_TFLOPS,
        mla_layer_us=MLA_LAYER_US, cuda_graph_max_bs=160, eager_layer_us=SGLANG_2024_EAGER_LAYER_US,
        # v0.4.1 ran DeepSeek's FP8 experts on its Triton fused-MoE kernels too: the ceiling holds for FP8
        moe_gemm_tflops_fp8=MOE_GEMM_TFLOPS,
    ),
    # TensorRT-LLM: in-flight batching with chunked context (mixed steps), C++ runtime: no
    # engine skew on the all-reduces (the 15 us skew is a vLLM fit, reference §3.4). Nothing fitted.
    "trtllm": EngineProfile(
        "trtllm", era="TensorRT-LLM (2024)", tp_skew_us_at_4=0.0,
        mla_layer_us=TRTLLM_MLA_LAYER_US, ep_a2a_scale=TRTLLM_EP_A2A_SCALE, disagg_handoff_ms=TRTLLM_PD_HANDOFF_MS,
        calibration="dense: nothing fitted (held out: 405B TP8 vs PP8 ratios, NVIDIA blog; measured H200 70B rows); "
                    "MLA layer, EP all-to-all and P/D hand-off fitted on measured DeepSeek H200 rows (sim.silicon)",
        kv_dtype_fp8="fp8", kv_reserve_ratio=1.0, max_num_seqs=TRTLLM_MAX_BATCH_SIZE,
    ),
    "tgi": EngineProfile(
        "tgi", policy="tgi-waiting-ratio", era="TGI 2.x router (2024)", t_fixed_ms=3.0, request_overhead_ms=5.0,
        max_num_batched_tokens=4096, enable_prefix_caching=True,
    ),
    "legacy-2023": EngineProfile(
        "legacy-2023", policy="v0-prefill-first", era="vLLM 0.1-0.2 (2023)",
        calibration="Splitwise 70B TP4/TP8 H100 batch-1 token time (fitted, within 7 %); held out: DistServe 13B "
                    "A100 colocated and P/D goodput",
        t_fixed_ms=13.0, tp_skew_us_at_4=15.0, request_overhead_ms=10.0,
        max_num_batched_tokens=4096, max_num_seqs=256, enable_prefix_caching=False,
    ),
}


def with_dtype_default(model: ModelSpec, dtype: Dtype | None) -> Dtype:
    return dtype or model.default_dtype


def override(obj: object, values: dict[str, object]) -> object:
    """``dataclasses.replace`` that tolerates frozen slotted dataclasses."""
    return replace(obj, **values)  # type: ignore[type-var]


#: (model preset, profile) pairs that published figures back (sim.validation rows, fitted or
#: held out); what each model was checked against. Any other pair is "uncalibrated".
BACKED: dict[str, tuple[str, tuple[str, ...]]] = {
    "llama-3.1-8b": ("vLLM CI bs8 latency and offline throughput, H200/H100/A100; SGLang 0.5.6 FP8 on H200 "
                     "(AIConfigurator's measured rows, bench sim validate --only silicon)",
                     ("vllm", "vllm-v0", "sglang", "legacy-2023")),
    "llama-3.1-70b": ("vLLM CI, NIM 70B FP8 TP2, SGLang's vLLM 0.6 comparison, Splitwise, TRT-LLM PP/TP ratios",
                      ("vllm", "vllm-v0", "sglang", "legacy-2023", "trtllm")),
    "mixtral-8x7b": ("vLLM CI Mixtral-8x7B TP2 rows (H200 fitted, A100 held out)", ("vllm",)),
    "deepseek-v3": (("sgl-project/sglang#2643 and #3602 DeepSeek-V3 TP8 H200 (batch 1 and TP8 at 40 req/s fitted; "
                     "batch 8/32 within 12 %, EP8 over TP8 0.95; ShareGPT 5k with DP attention 1.02x); "
                     "SGLang 0.5.x and TRT-LLM FP8 on 8xH200, aggregated and P/D (AIConfigurator's measured rows, "
                     "bench sim validate --only silicon)"),
                    ("sglang-2024", "sglang", "trtllm")),
}


def calibration(model: str, profile: EngineProfile) -> str:
    """What backs this model on this engine profile, or why nothing does (starts "uncalibrated")."""
    backed = BACKED.get(model)
    if backed is None or profile.name not in backed[1]:
        known = ", ".join(backed[1]) if backed else "none"
        return (f"uncalibrated: no published figure backs {model} on the {profile.name} profile "
                f"(calibrated profiles for it: {known}); its timings are the roofline model's alone")
    return f"calibrated against {backed[0]}; profile: {profile.calibration or 'constants shared with vllm'}"
