"""Capacity under SLOs of parallel layouts on the modelled engine, in virtual time.

For each layout and workload, finds the highest Poisson rate at which at least 90 % of
requests meet the SLOs (bisection), using the same scheduler and cost model as
``bench sim serve --timing model``. Shows the trade-off a sweep should find:

    python benchmarks/sim_tradeoffs.py
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_llm.sim.backend import Arrival, ModelBackend, simulate  # noqa: E402
from bench_llm.sim.options import ModelTiming  # noqa: E402


def attainment(t: ModelTiming, rate: float, prompt: int, output: int, ttft_s: float, tpot_s: float,
               seconds: float = 30.0) -> float:
    rng = random.Random(11)
    arrivals, x = [], 0.0
    while x < seconds:
        arrivals.append(Arrival(x, prompt, output))
        x += rng.expovariate(rate)
    outs = simulate(ModelBackend(t), arrivals)
    ok = sum(1 for o in outs if o.ttft_s <= ttft_s and o.tpot_s <= tpot_s)
    return ok / len(outs)


def capacity(t: ModelTiming, prompt: int, output: int, ttft_s: float, tpot_s: float) -> float:
    lo, hi = 0.0, 1.0
    while attainment(t, hi, prompt, output, ttft_s, tpot_s) >= 0.9:
        lo, hi = hi, hi * 2
        if hi > 512:
            break
    for _ in range(7):
        mid = (lo + hi) / 2
        if attainment(t, mid, prompt, output, ttft_s, tpot_s) >= 0.9:
            lo = mid
        else:
            hi = mid
    return lo


def main() -> None:
    layouts = {
        "TP4": ModelTiming("llama-3.1-70b", "h100", tp=4),
        "DP2xTP2": ModelTiming("llama-3.1-70b", "h100", tp=2, dp=2, router="least-queue"),
    }
    workloads = [
        ("long prompts 8000/128, TTFT<=0.6 s, TPOT<=60 ms", 8000, 128, 0.6, 0.060),
        ("short prompts 256/256, TTFT<=2.0 s, TPOT<=60 ms", 256, 256, 2.0, 0.060),
    ]
    print("llama-3.1-70b (fp8 weights) on 4x H100; capacity = highest rate with >= 90 % of requests within SLO")
    for name, prompt, output, ttft, tpot in workloads:
        print(f"  {name}:")
        for label, t in layouts.items():
            print(f"    {label:<8} {capacity(t, prompt, output, ttft, tpot):7.2f} req/s  "
                  f"(KV tokens/instance {t.cost_model().kv_tokens():,})")


if __name__ == "__main__":
    main()
