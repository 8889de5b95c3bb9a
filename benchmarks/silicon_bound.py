"""Can any engine reach a measured H200 row? A lower bound on one GPU's busy time (issue 35).

For each aggregated dense (Llama) row of the measured H200 data (``sim.silicon``), the closed loop's own
figures give its request rate: each of the C streams sends a request every TTFT + (OSL - 1) x TPOT, so
``rate = C / (TTFT + (OSL - 1) TPOT)`` per instance (one instance of ``tp`` GPUs: these rows have no DP).
If every prompt is prefilled (random prompts, as ``sim.silicon`` runs them), each GPU must do, per second
of the run, at least:

* ``linear``: the prompts' matrix multiplies, 2 x (matmul parameters) FLOPs per prompt token over ``tp``
  GPUs, at the FP8 dense peak (the weights are FP8). The matmul parameters leave out the token embedding
  (a lookup) and the LM head (vLLM, SGLang and TRT-LLM compute logits for a prompt's last token only):
  Llama-3.1 has a 128 256-token vocabulary, so 2 x 128 256 x hidden parameters fewer than the preset's
  total;
* ``attn``: the prompts' causal attention, 4 x heads x head_dim x ISL^2 / 2 FLOPs per layer, at the BF16
  dense peak (the attention kernels run in BF16);
* ``kv``: the decode steps' KV reads, every generated token after the first reading its request's whole
  context, ``(OSL - 1) x (ISL + OSL / 2)`` tokens' KV per request, at the full HBM bandwidth, in the KV
  dtype the engine's profile uses for FP8 weights (``EngineProfile.kv_dtype_for``) and, beside it, in FP8.

These are separate kernels run one after the other, so their times add; every figure is at 100 % of the
peak (no kernel reaches it), and the all-reduces of TP > 1 and the weight reads are left out: the sum is a
lower bound. A row whose bound is above 1 cannot be measured with every prompt prefilled, on any engine.
The last column (``model``) is the same work at the cost model's own rates (``Bound.at_model_rates``).

    python benchmarks/silicon_bound.py [CSV] [--all]    # the vLLM 8B rows, or --all: every dense agg row
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_llm.sim.presets import GPUS, MODELS, PROFILES, GpuSpec, ModelSpec  # noqa: E402
from bench_llm.sim.silicon import PROFILE_OF, Point, default_path, load  # noqa: E402

#: Llama-3.1's vocabulary (the token embedding and the LM head are vocab x hidden each)
LLAMA31_VOCAB = 128256


@dataclass(frozen=True)
class Bound:
    """A row's request rate and one GPU's busy fraction per term (1.0: the whole second)."""

    point: Point
    rate: float  # requests per second per instance
    linear: float
    attn: float
    kv: float  # in the profile's KV dtype
    kv_fp8: float  # in FP8

    @property
    def total(self) -> float:
        return self.linear + self.attn + self.kv

    @property
    def total_fp8_kv(self) -> float:
        return self.linear + self.attn + self.kv_fp8

    def at_model_rates(self, gpu: GpuSpec) -> float:
        """The same work at the simulator's cost-model rates (FP8 GEMMs at ``mfu_gemm_fp8`` of the peak,
        attention at ``mfu_attn``, KV reads at ``mbu_kv`` of the bandwidth): above 1, the simulated engine
        cannot keep up with the row's rate whatever its scheduling."""
        return self.linear / gpu.mfu_gemm_fp8 + self.attn / gpu.mfu_attn + self.kv / gpu.mbu_kv


def bound(p: Point, model: ModelSpec, gpu: GpuSpec, kv_bytes_per_elem: float) -> Bound:
    """The busy-time lower bound of one GPU for row ``p`` (module docstring)."""
    rate = p.concurrency / p.dp / ((p.ttft_ms + (p.osl - 1) * p.tpot_ms) / 1e3)
    matmul_params = model.params_b * 1e9 - 2.0 * LLAMA31_VOCAB * model.hidden
    linear = rate * p.isl * 2.0 * matmul_params / p.tp / (gpu.fp8_tflops * 1e12)
    attn = rate * model.layers * 4.0 * model.heads * model.head_dim * p.isl * p.isl / 2.0 / p.tp / (gpu.bf16_tflops * 1e12)
    kv_tokens = rate * (p.osl - 1) * (p.isl + p.osl / 2.0)
    kv_elems = model.layers * model.kv_elems_per_token_layer(p.tp)  # one GPU's share of a token's KV
    hbm = gpu.hbm_tb_s * 1e12
    return Bound(p, rate, linear, attn, kv_tokens * kv_elems * kv_bytes_per_elem / hbm, kv_tokens * kv_elems / hbm)


def bounds(points: list[Point], everything: bool) -> list[Bound]:
    gpu = GPUS["h200"]
    out = []
    for p in points:
        if p.mode != "agg" or not p.model.startswith("llama"):
            continue
        if not everything and (p.backend, p.model) != ("vllm", "llama-3.1-8b"):
            continue
        kv_b = 1.0 if PROFILES[PROFILE_OF[p.backend]].kv_dtype_for("fp8") == "fp8" else 2.0
        out.append(bound(p, MODELS[p.model], gpu, kv_b))
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="?", type=Path, default=None)
    ap.add_argument("--all", action="store_true", help="every dense aggregated row, not only vLLM 8B")
    a = ap.parse_args(argv)
    path = a.rows or default_path()
    if path is None:
        print("skipped: no measured rows (sim.silicon.default_path)")
        return 0
    rows = bounds(load(path), a.all)
    gpu = GPUS["h200"]
    print(f"{'row':40s} {'req/s':>7s} {'linear':>6s} {'attn':>5s} {'kv':>5s} {'bound':>6s} {'FP8 KV':>6s} {'model':>6s}")
    for b in rows:
        p = b.point
        name = f"{p.backend} {p.model} {p.isl}/{p.osl} C{p.concurrency} TP{p.tp}"
        print(f"{name:40s} {b.rate:7.1f} {b.linear:6.2f} {b.attn:5.2f} {b.kv:5.2f} {b.total:6.2f} {b.total_fp8_kv:6.2f} "
              f"{b.at_model_rates(gpu):6.2f}")
    groups: dict[str, list[Bound]] = {}
    for b in rows:
        groups.setdefault(b.point.group, []).append(b)
    for g, bs in groups.items():
        over = sum(1 for b in bs if b.total > 1.0)
        over_fp8 = sum(1 for b in bs if b.total_fp8_kv > 1.0)
        over_model = sum(1 for b in bs if b.at_model_rates(gpu) > 1.0)
        print(f"{g}: {len(bs)} rows, bound above 1: {over} (with FP8 KV: {over_fp8}), highest "
              f"{max(b.total for b in bs):.2f}; above 1 at the simulator's rates: {over_model}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
