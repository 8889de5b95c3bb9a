"""Per-step roofline cost model (reference ``simulator-model.md`` §2).

One engine step processes prefill chunks and decode tokens together. Its time is the
blended roofline of the linear layers (weights read vs FLOPs), attention for prefill
chunks (FLOPs) and decode contexts (KV reads), the collectives of every parallel axis,
and a fixed per-step overhead from the engine profile. With pipeline parallelism a step
is a micro-batch: its tokens come out after all stages, but the first stage is free again
after one stage time, so up to ``pp`` micro-batches overlap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench_llm.core.errors import BenchError
from bench_llm.core.layout import Layout
from bench_llm.sim.presets import Dtype, EngineProfile, GpuSpec, ModelSpec

GB = 1e9


class OutOfMemory(BenchError, ValueError):
    """The configuration cannot hold the model weights (plus reserve) on its GPUs."""


#: The cost model's parallel layout is the one layout type (core/layout.py: the rules of what can run).
Parallel = Layout


@dataclass(frozen=True, slots=True)
class StepCost:
    latency_s: float  # step start -> tokens out
    occupancy_s: float  # step start -> the engine (first pipeline stage) can start the next step
    parts: dict[str, float]


#: The terms of a step's time, as ``StepCost.parts`` names them (``CostModel.times`` order).
STEP_PARTS = ("linear", "attn_prefill", "attn_decode", "tp", "dcp", "pcp", "ep", "moe_mla_layers", "eager", "pp_send",
              "fixed", "spec_draft")

#: Entries of a cost model's per-token-count cache before it starts afresh (bounds its memory).
_BY_TOKENS_CACHE = 1 << 16


def _blend(t_mem: float, t_comp: float) -> float:
    return max(t_mem, t_comp) + 0.5 * min(t_mem, t_comp)


def _pick(values: tuple[float, float, float], n: int) -> float:
    """Interpolate a 2/4/8-GPU table by log2(n)."""
    if n <= 2:
        return values[0]
    if n >= 8:
        return values[2]
    x = math.log2(n) - 1.0  # 4 -> 1
    lo = int(x)
    return values[lo] + (values[min(lo + 1, 2)] - values[lo]) * (x - lo)


class CostModel:
    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        profile: EngineProfile,
        parallel: Parallel,
        dtype: Dtype,
        kv_dtype: Dtype = "bf16",
        expert_imbalance: float = 1.0,
        spec_tokens: int = 0,
        spec_draft_layers: float = 1.0,
    ) -> None:
        self.m, self.g, self.prof, self.par, self.dtype = model, gpu, profile, parallel, dtype
        self.b_w = 1.0 if dtype == "fp8" else 2.0
        self.b_kv = 1.0 if kv_dtype == "fp8" else 2.0
        self.expert_imbalance = max(1.0, expert_imbalance)
        #: speculative decoding: each decode step verifies ``spec_tokens`` drafts per sequence (1 + k query
        #: tokens through the target model) and runs ``spec_tokens`` draft passes of ``spec_draft_layers`` layers
        self.spec_tokens = spec_tokens
        self._draft_share = spec_tokens * spec_draft_layers / (model.layers / parallel.pp)
        t, p = parallel.tp, parallel.pp
        self.layers_stage = model.layers / p
        self.flops = gpu.peak_flops(dtype)
        self.attn_flops = gpu.bf16_tflops * 1e12 * gpu.mfu_attn
        self.bw = gpu.hbm_tb_s * 1e12
        # weights on one GPU
        dense_params = (model.params_b - model.expert_params_b) * 1e9
        self.ep_width = parallel.ep if (model.is_moe and parallel.ep > 1) else t
        expert_params = model.expert_params_b * 1e9
        self.weight_bytes_gpu = dense_params * self.b_w / (t * p) + expert_params * self.b_w / (self.ep_width * p)
        self.dense_weight_bytes_gpu = dense_params * self.b_w / (t * p)
        self.expert_weight_bytes_gpu = expert_params * self.b_w / (self.ep_width * p)
        # KV bytes per token on one GPU (all layers of its stage)
        self.kv_bytes_token_gpu = self.layers_stage * model.kv_elems_per_token_layer(t) * self.b_kv / parallel.dcp
        self.kv_bytes_token_layer_total = model.kv_elems_per_token_layer(1) * self.b_kv
        # the expert-GEMM ceiling by dtype and FP8 scaling; none on a GPU without wgmma (presets: GpuSpec.wgmma)
        moe_tflops = ((profile.moe_gemm_tflops_fp8 if model.fp8_block_scaled else 0.0) if dtype == "fp8"
                      else profile.moe_gemm_tflops)
        moe_rate = moe_tflops * 1e12 if gpu.wgmma else 0.0
        self.moe_flops_factor = self.flops / moe_rate if 0 < moe_rate < self.flops else 1.0
        t_skew = min(t, profile.tp_skew_cap_tp) if profile.tp_skew_cap_tp else t
        self.skew_s = profile.tp_skew_us_at_4 * 1e-6 * (t_skew / 4.0) ** 1.25 if t > 1 else 0.0
        self._by_tokens: dict[tuple[int, int], tuple[float, float, float, float, float, float, float]] = {}
        #: ``times`` of decode-only steps by (decodes, context sum): a loaded engine's steps repeat them
        self._decode_times: dict[tuple[int, int], tuple[float, float, tuple[float, ...]]] = {}
        # constants of ``times`` (one step's attention and fixed costs)
        self._two_layers = 2.0 * self.layers_stage
        self._attn_split = t * parallel.pcp
        self._kv_read_bw = self.bw * gpu.mbu_kv
        # MLA decode attention runs on the latent cache with the projections absorbed (FlashMLA, TRT-LLM's MLA
        # generation kernels): per context token, per layer and per head on the GPU, a score over the 576-wide
        # latent + rope key and a 512-wide value product, 2 x (576 + 512) FLOPs. With attention DP every GPU
        # holds all 128 heads, so at long contexts the step is bound by these FLOPs, not by the latent's bytes
        # (DCP: each rank takes dcp x the heads over 1/dcp of the context, the same FLOPs)
        self._mla_dec_flops_ctx = (self._two_layers * (2 * model.mla_kv_dim - 64) * model.heads / t / parallel.pcp
                                   if model.mla_kv_dim else 0.0)
        self._mla_dec_flops = gpu.bf16_tflops * 1e12 * gpu.mfu_mla_decode
        self._fixed_s = profile.t_fixed_ms * 1e-3
        self._per_seq_s = profile.per_seq_us * 1e-6
        self._eager_s = self.layers_stage * profile.eager_layer_us * 1e-6
        self._graph_max_bs = profile.cuda_graph_max_bs

    # -- memory ------------------------------------------------------------------------
    @property
    def weights_gb_per_gpu(self) -> float:
        return self.weight_bytes_gpu / GB

    def kv_budget_bytes(self) -> float:
        return self.g.memory_gb * GB * self.prof.gpu_memory_utilization - self.weight_bytes_gpu - self.prof.reserve_gb * GB

    def check_fits(self) -> None:
        budget = self.kv_budget_bytes()
        if budget <= self.kv_bytes_token_gpu * self.prof.block_size * 16:
            raise OutOfMemory(
                f"out of memory: {self.m.name} {self.dtype} needs {self.weights_gb_per_gpu:.1f} GB of weights per GPU "
                f"(tp={self.par.tp}, pp={self.par.pp}, ep={self.par.ep}) plus a {self.prof.reserve_gb:g} GB reserve "
                f"and KV blocks, but a {self.g.name} has {self.g.memory_gb * self.prof.gpu_memory_utilization:.1f} GB "
                f"usable ({self.g.memory_gb:g} GB x {self.prof.gpu_memory_utilization})"
            )

    def kv_blocks(self) -> int:
        """KV blocks of one instance (the minimum over its GPUs; they are symmetric here)."""
        budget = max(0.0, self.kv_budget_bytes())
        return int(budget // (self.kv_bytes_token_gpu * self.prof.block_size))

    def kv_tokens(self) -> int:
        return self.kv_blocks() * self.prof.block_size

    # -- collectives ---------------------------------------------------------------------
    def all_reduce_s(self, n: int, nbytes: float) -> float:
        if n <= 1:
            return 0.0
        alpha = _pick(self.g.ar_alpha_us, n) * 1e-6
        bus = _pick(self.g.ar_bus_gb_s, n) * GB
        return alpha + 2.0 * (n - 1) / n * nbytes / bus

    def all_gather_s(self, n: int, nbytes: float) -> float:
        if n <= 1:
            return 0.0
        alpha = _pick(self.g.ar_alpha_us, n) * 1e-6
        bus = _pick(self.g.ar_bus_gb_s, n) * GB
        return alpha + (n - 1) / n * nbytes / bus

    # -- one step ------------------------------------------------------------------------
    def step(self, prefill: list[tuple[int, int]], n_decode: int, decode_ctx_sum: int) -> StepCost:
        """Cost of one step: ``prefill`` is (chunk tokens, context before the chunk) per request."""
        latency, occupancy, terms = self.times(prefill, n_decode, decode_ctx_sum)
        return StepCost(latency, occupancy, dict(zip(STEP_PARTS, terms)))

    def times(
        self, prefill: list[tuple[int, int]], n_decode: int, decode_ctx_sum: int
    ) -> tuple[float, float, tuple[float, ...]]:
        """``step`` as (latency, occupancy, the terms of ``STEP_PARTS``): the scheduler calls
        this once per step, so it builds no dict or dataclass. A decode-only step's answer is
        kept per (decodes, context sum) and returned as is the next time (the same tuple)."""
        if not prefill:
            key = (n_decode, decode_ctx_sum)
            done = self._decode_times.get(key)
            if done is None:
                if len(self._decode_times) >= _BY_TOKENS_CACHE:
                    self._decode_times.clear()
                done = self._decode_times[key] = self._times(prefill, n_decode, decode_ctx_sum)
            return done
        return self._times(prefill, n_decode, decode_ctx_sum)

    def _times(
        self, prefill: list[tuple[int, int]], n_decode: int, decode_ctx_sum: int
    ) -> tuple[float, float, tuple[float, ...]]:
        """``times``, computed."""
        m = self.m
        p = self.par.pp
        pf_tokens = 0
        attn_pf_flops = 0.0
        for chunk, ctx in prefill:
            pf_tokens += chunk
            attn_pf_flops += chunk * (ctx + chunk / 2.0)
        # with speculative decoding a decode carries 1 + k query tokens through every layer
        n_query = n_decode * (1 + self.spec_tokens)
        t_lin, t_tp, t_dcp, t_pcp, t_ep, t_layers, send = self._parts_by_tokens(pf_tokens, n_query)
        # attention (the precomputed factors are the leftmost ones: every product rounds as
        # it would written out in full, so the times are bit for bit those of the formula)
        t_attn_pf = self._two_layers * attn_pf_flops * 2.0 * m.heads * m.head_dim / self._attn_split / self.attn_flops
        t_attn_dec = decode_ctx_sum * self.kv_bytes_token_gpu / self._kv_read_bw
        if self._mla_dec_flops_ctx and decode_ctx_sum:
            # (a sequence's KV is read once for all its query tokens; the FLOPs are per query token)
            t_attn_dec = _blend(t_attn_dec, decode_ctx_sum * (1 + self.spec_tokens) * self._mla_dec_flops_ctx
                                / self._mla_dec_flops)
        draft = self._draft_s(n_decode, decode_ctx_sum) if self.spec_tokens and n_decode else 0.0
        stage = t_lin + t_attn_pf + t_attn_dec + t_tp + t_dcp + t_pcp + t_ep + t_layers + draft
        # an eager step (a prefill, or more decodes than the engine has CUDA graphs for) lasts at least
        # the CPU time of launching its layers' kernels; the GPU's work overlaps it
        eager = 0.0
        if self._eager_s > stage and (prefill or n_decode > self._graph_max_bs):
            eager = self._eager_s - stage
            stage = self._eager_s
        # engine CPU time: per step, plus per sequence in the step (scheduling, sampling, output)
        fixed = self._fixed_s + self._per_seq_s * (len(prefill) + n_decode)
        latency = p * stage + (p - 1) * send + fixed
        occupancy = stage + send + fixed if p > 1 else latency
        return latency, occupancy, (t_lin, t_attn_pf, t_attn_dec, t_tp, t_dcp, t_pcp, t_ep, t_layers, eager,
                                    (p - 1) * send, fixed, draft)

    def _parts_by_tokens(self, pf_tokens: int, n_query: int) -> tuple[float, float, float, float, float, float, float]:
        """``_token_parts``, cached per (prefill tokens, decode query tokens)."""
        key = (pf_tokens, n_query)
        by_tokens = self._by_tokens.get(key)
        if by_tokens is None:
            if len(self._by_tokens) >= _BY_TOKENS_CACHE:
                self._by_tokens.clear()
            by_tokens = self._by_tokens[key] = self._token_parts(pf_tokens, n_query)
        return by_tokens

    def _draft_s(self, n_decode: int, decode_ctx_sum: int) -> float:
        """The draft passes of a speculative step: ``spec_tokens`` passes over one token per sequence, each
        through ``spec_draft_layers`` layers costed as the target's layers are (weights, collectives, per-layer
        fixed costs, attention over the context); the draft's own embedding and LM head are not counted."""
        t_lin, t_tp, t_dcp, _, t_ep, t_layers, _ = self._parts_by_tokens(0, n_decode)
        t_attn = decode_ctx_sum * self.kv_bytes_token_gpu / self._kv_read_bw
        return self._draft_share * (t_lin + t_tp + t_dcp + t_ep + t_layers + t_attn)

    def _token_parts(self, pf_tokens: int, n_decode: int) -> tuple[float, float, float, float, float, float, float]:
        """The step's costs that depend on its token counts alone (linear layers, collectives,
        per-layer fixed costs, the pipeline send), cached per (prefill tokens, decodes) by ``step``:
        a run repeats the same few counts thousands of times."""
        m, g, par = self.m, self.g, self.par
        t, p = par.tp, par.pp
        T = pf_tokens + n_decode
        # PCP splits prompt tokens across its ranks: each rank runs the linear layers on its share
        T_rank = pf_tokens / par.pcp + n_decode if par.pcp > 1 else float(T)
        # linear layers (per GPU, one stage)
        active_expert = (m.active_params_b - (m.params_b - m.expert_params_b)) * 1e9 if m.is_moe else 0.0
        dense_active = m.active_params_b * 1e9 - active_expert
        lin_flops = 2.0 * dense_active * T_rank / (t * p)
        weight_bytes = self.dense_weight_bytes_gpu
        if m.is_moe:
            imb = self.expert_imbalance if self.ep_width > 1 and par.ep > 1 else 1.0
            # with attention data-parallel ranks feeding expert parallelism, each GPU's experts take the tokens
            # of every rank (the all-to-all gathers them), not its own rank's alone: dp x a rank's tokens
            # (ranks equally loaded, as they step in lock-step)
            moe_T = T_rank * par.dp if par.ep > 1 and par.dp > 1 else T_rank
            expert_flops = 2.0 * active_expert * moe_T / (self.ep_width * p) * imb
            # the engine's grouped expert GEMMs may run below the dense rate (profile's ceiling)
            lin_flops += expert_flops * self.moe_flops_factor
            # experts touched by T tokens (each picks top_k of E)
            touched = 1.0 - (1.0 - m.top_k / m.experts) ** max(moe_T, 0)
            weight_bytes += self.expert_weight_bytes_gpu * touched
        t_lin = _blend(weight_bytes / (self.bw * g.mbu), lin_flops / self.flops) if T else 0.0
        # collectives
        act_bytes = T_rank * m.hidden * 2.0
        t_tp = self.layers_stage * 2.0 * (self.all_reduce_s(t, act_bytes) + self.skew_s) if t > 1 and T else 0.0
        t_dcp = 0.0
        if par.dcp > 1 and n_decode:
            # per layer: the DCP group's decode queries all-gathered (each rank attends its KV shard with the
            # group's heads), then the partial outputs and their log-sum-exp exchanged back (bytes: ours, from
            # the query/output widths; MLA: 576-wide latent queries, 512-wide latent outputs)
            heads = m.heads / t * par.dcp
            q_width = m.mla_kv_dim or m.head_dim
            out_width = (m.mla_kv_dim - 64) if m.mla_kv_dim else m.head_dim
            q_bytes = n_decode * heads * q_width * 2.0
            out_bytes = n_decode * heads * (out_width * 2.0 + 4.0)
            t_dcp = self.layers_stage * (self.all_gather_s(par.dcp, q_bytes) + self.all_gather_s(par.dcp, out_bytes))
        t_pcp = 0.0
        if par.pcp > 1 and pf_tokens:
            t_pcp = self.layers_stage * self.all_gather_s(par.pcp, pf_tokens * self.kv_bytes_token_layer_total)
        t_ep = 0.0
        if m.is_moe and par.ep > 1 and T:
            moe_layers = m.moe_layers / p
            nbytes = T * m.top_k * m.hidden * 3.0 / par.ep  # FP8 dispatch + BF16 combine, per rank
            alpha = g.a2a_alpha_us * 1e-6 * (1.0 + math.log2(par.ep) / 3.0)
            t_ep = moe_layers * (2.0 * alpha + nbytes / (g.a2a_gb_s * GB)) * self.prof.ep_a2a_scale
        # per-layer fixed costs of MoE routing and MLA attention (engine generation's kernels)
        t_layers = 0.0
        if T:
            if m.is_moe:
                t_layers += m.moe_layers / p * self.prof.moe_layer_us * 1e-6
            if m.mla_kv_dim:
                t_layers += self.layers_stage * self.prof.mla_layer_us * 1e-6
        send = (g.p2p_alpha_us * 1e-6 + act_bytes / (g.p2p_gb_s * GB)) if p > 1 else 0.0
        return t_lin, t_tp, t_dcp, t_pcp, t_ep, t_layers, send

    def kv_transfer_s(self, tokens: int, link_gb_s: float, setup_ms: float, efficiency: float) -> float:
        """Moving a prompt's KV (all layers) from a prefill to a decode instance."""
        nbytes = tokens * self.kv_bytes_token_layer_total * self.m.layers
        return setup_ms * 1e-3 + nbytes / (efficiency * link_gb_s * GB)
