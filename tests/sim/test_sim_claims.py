"""The seed's claims, each as a measured comparison on the modelled engine (virtual time).

The scheduler and cost model are the ones the server runs; ``simulate`` drives them with
synthetic arrivals without waiting for real time.
"""

from __future__ import annotations

import dataclasses
import statistics

from bench_llm.sim.backend import Arrival, ModelBackend, Outcome, simulate
from bench_llm.sim.options import ModelTiming


def run(t: ModelTiming, arrivals: list[Arrival]) -> list[Outcome]:
    return simulate(ModelBackend(t), arrivals)


def single(t: ModelTiming, prompt: int, output: int) -> Outcome:
    return run(t, [Arrival(0.0, prompt, output)])[0]


def throughput(outs: list[Outcome]) -> float:
    """Output tokens per second over the whole run."""
    start = min(o.arrival_ns for o in outs)
    end = max(o.token_ns[-1] for o in outs)
    return sum(len(o.token_ns) for o in outs) / ((end - start) / 1e9)


def burst(n: int, prompt: int, output: int) -> list[Arrival]:
    return [Arrival(0.0, prompt, output) for _ in range(n)]


def poisson(rate: float, seconds: float, prompt: int, output: int, seed: int = 1) -> list[Arrival]:
    import random

    rng = random.Random(seed)
    t, out = 0.0, []
    while t < seconds:
        out.append(Arrival(t, prompt, output))
        t += rng.expovariate(rate)
    return out


def p(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def test_tp2_cuts_long_prefill_but_gains_less_than_2x_per_decode_step() -> None:
    tp1 = ModelTiming("llama-3.1-8b", "h100", tp=1)
    tp2 = dataclasses.replace(tp1, tp=2)
    a, b = single(tp1, 8000, 64), single(tp2, 8000, 64)
    prefill_gain = a.ttft_s / b.ttft_s
    decode_gain = a.tpot_s / b.tpot_s
    print(f"TP1->TP2 long-prompt TTFT {a.ttft_s*1e3:.1f} -> {b.ttft_s*1e3:.1f} ms (x{prefill_gain:.2f}); "
          f"decode step {a.tpot_s*1e3:.2f} -> {b.tpot_s*1e3:.2f} ms (x{decode_gain:.2f})")
    assert prefill_gain > 1.6
    assert 1.0 < decode_gain < 1.7
    assert decode_gain < prefill_gain


def test_pp_does_not_speed_up_one_request_but_raises_throughput_with_many_in_flight() -> None:
    pp1 = ModelTiming("llama-3.1-8b", "h100")
    pp2 = dataclasses.replace(pp1, pp=2)
    a, b = single(pp1, 512, 64), single(pp2, 512, 64)
    print(f"single request TPOT pp1 {a.tpot_s*1e3:.2f} ms, pp2 {b.tpot_s*1e3:.2f} ms")
    assert b.tpot_s >= a.tpot_s * 0.95 and b.ttft_s >= a.ttft_s * 0.9
    load = burst(512, 1024, 128)
    ta, tb = throughput(run(pp1, load)), throughput(run(pp2, load))
    print(f"512 in flight: pp1 {ta:.0f} tok/s, pp2 {tb:.0f} tok/s (x{tb/ta:.2f})")
    assert tb > 1.4 * ta


def test_dp2_doubles_capacity_at_the_same_single_request_latency() -> None:
    dp1 = ModelTiming("llama-3.1-70b", "h100", tp=2)
    dp2 = dataclasses.replace(dp1, dp=2)
    a, b = single(dp1, 1000, 100), single(dp2, 1000, 100)
    assert abs(b.ttft_s / a.ttft_s - 1) < 0.02 and abs(b.tpot_s / a.tpot_s - 1) < 0.02
    load = burst(600, 1000, 200)
    ta, tb = throughput(run(dp1, load)), throughput(run(dp2, load))
    print(f"capacity dp1 {ta:.0f} tok/s, dp2 {tb:.0f} tok/s (x{tb/ta:.2f})")
    assert 1.7 < tb / ta < 2.3


def test_dcp_raises_kv_capacity_at_a_higher_tpot() -> None:
    base = ModelTiming("llama-3.1-70b", "h100", tp=8)  # tp > kv heads: KV replicated without DCP
    dcp = dataclasses.replace(base, dcp=8)
    ka, kb = base.cost_model().kv_tokens(), dcp.cost_model().kv_tokens()
    print(f"KV tokens tp8 {ka}, tp8 dcp8 {kb}")
    assert kb > 7 * ka
    a, b = single(base, 2000, 64), single(dcp, 2000, 64)
    print(f"TPOT tp8 {a.tpot_s*1e3:.2f} ms, tp8 dcp8 {b.tpot_s*1e3:.2f} ms")
    assert b.tpot_s > a.tpot_s
    # more concurrency fits: with a small KV pool, long contexts; peak running requests
    from bench_llm.sim.presets import PROFILES

    small = dataclasses.replace(PROFILES["vllm"], gpu_memory_utilization=0.16)
    load = burst(60, 6000, 300)
    sa = ModelBackend(dataclasses.replace(base, profile_spec=small))
    sb = ModelBackend(dataclasses.replace(dcp, profile_spec=small))
    peak_a = _peak_running(sa, load)
    peak_b = _peak_running(sb, load)
    print(f"peak running (6k-token prompts, small KV pool): tp8 {peak_a}, tp8 dcp8 {peak_b}")
    assert peak_b > 2 * peak_a


def _peak_running(backend: ModelBackend, load: list[Arrival]) -> int:
    peak = 0

    def watch(req: object, event: str, t: int) -> None:
        nonlocal peak
        peak = max(peak, backend.running)

    backend.observer = watch
    simulate(backend, load)
    return peak


def test_ep_spreads_expert_weights_but_skewed_expert_load_slows_the_step() -> None:
    no_ep = ModelTiming("mixtral-8x7b", "h100", "fp8", dp=4)
    ep = dataclasses.replace(no_ep, ep=4, expert_imbalance=1.0)
    wa, wb = no_ep.cost_model().weights_gb_per_gpu, ep.cost_model().weights_gb_per_gpu
    print(f"weights per GPU: DP4 {wa:.1f} GB, DP4+EP4 {wb:.1f} GB")
    assert wb < 0.4 * wa
    skewed = dataclasses.replace(ep, expert_imbalance=2.0)
    load = burst(1024, 200, 64)
    ta, tb = throughput(run(ep, load)), throughput(run(skewed, load))
    print(f"EP4 balanced {ta:.0f} tok/s, skewed (max/mean 2.0) {tb:.0f} tok/s")
    assert tb < 0.9 * ta
    big = [(4096, 0)]
    sa = ep.cost_model().step(big, 0, 0).latency_s
    sb = skewed.cost_model().step(big, 0, 0).latency_s
    assert sb > 1.2 * sa


def test_disaggregation_keeps_itl_flat_under_prefill_heavy_load_at_a_kv_transfer_cost() -> None:
    colo = ModelTiming("llama-3.1-8b", "h100", dp=2, router="least-queue")
    disagg = dataclasses.replace(colo, dp=1, disagg_prefill=1, disagg_decode=1)
    a, b = single(colo, 2000, 32), single(disagg, 2000, 32)
    t_kv = disagg.cost_model().kv_transfer_s(2000, disagg.kv_link_gb_s, disagg.kv_setup_ms, disagg.kv_link_efficiency)
    print(f"TTFT colocated {a.ttft_s*1e3:.1f} ms, disaggregated {b.ttft_s*1e3:.1f} ms (KV transfer {t_kv*1e3:.1f} ms)")
    assert b.ttft_s >= a.ttft_s + t_kv
    # prefill-heavy: long prompts arriving while others decode
    load = poisson(6.0, 8.0, 6000, 200, seed=3)
    itl_a = [x for o in run(colo, load) for x in o.itls_s]
    itl_b = [x for o in run(disagg, load) for x in o.itls_s]
    print(f"ITL p50/p99 colocated {p(itl_a,.5)*1e3:.1f}/{p(itl_a,.99)*1e3:.1f} ms, "
          f"disaggregated {p(itl_b,.5)*1e3:.1f}/{p(itl_b,.99)*1e3:.1f} ms")
    assert p(itl_b, 0.99) < 1.5 * p(itl_b, 0.5)  # flat
    assert p(itl_a, 0.99) > 2.0 * p(itl_a, 0.5)  # prefill chunks stall colocated decodes
    assert p(itl_b, 0.99) < 0.5 * p(itl_a, 0.99)


def test_overload_ttft_grows_with_queue_time_while_itl_plateaus() -> None:
    t = ModelTiming("llama-3.1-8b", "h100", max_num_seqs=64)
    res = {}
    for rate in (10.0, 40.0, 80.0, 160.0):
        outs = run(t, poisson(rate, 6.0, 500, 200, seed=7))
        res[rate] = (statistics.mean(o.ttft_s for o in outs), statistics.median(x for o in outs for x in o.itls_s),
                     statistics.mean((o.queue_ns or 0) / 1e9 for o in outs))
        print(f"rate {rate:5.0f}/s: TTFT mean {res[rate][0]*1e3:8.1f} ms, ITL p50 {res[rate][1]*1e3:.2f} ms, "
              f"queue {res[rate][2]*1e3:8.1f} ms")
    assert res[160.0][0] > 3 * res[40.0][0] and res[80.0][0] > 3 * res[10.0][0]
    assert abs(res[160.0][1] / res[80.0][1] - 1) < 0.15  # ITL plateaus (batch capped)
    # TTFT growth is queue time
    assert res[160.0][0] - res[80.0][0] > 0.8 * (res[160.0][2] - res[80.0][2])


def test_prefix_cache_hits_skip_prefill_and_are_reported() -> None:
    t = ModelTiming("llama-3.1-8b", "h100")
    load = [Arrival(i * 0.5, 4000, 8, prefix_id=1, prefix_len=3900) for i in range(4)]
    backend = ModelBackend(t)
    outs = simulate(backend, load)
    assert outs[0].cached_tokens == 0 and all(o.cached_tokens >= 3840 for o in outs[1:])
    assert outs[1].ttft_s < 0.5 * outs[0].ttft_s
    assert backend.prefix_hits >= 3 * 3840 and backend.prefix_queries == 4 * 4000
    off = ModelBackend(dataclasses.replace(t, enable_prefix_caching=False))
    outs_off = simulate(off, load)
    assert all(o.cached_tokens == 0 for o in outs_off) and off.prefix_hits == 0


def test_kv_exhaustion_preempts_and_every_request_still_finishes() -> None:
    t = ModelTiming("llama-3.1-70b", "h100", tp=2)
    from bench_llm.sim.presets import PROFILES

    tight = dataclasses.replace(t, profile_spec=dataclasses.replace(PROFILES["vllm"], gpu_memory_utilization=0.5))
    backend = ModelBackend(tight)
    kv = backend.cost.kv_tokens()
    load = burst(40, 1000, 1500)  # 40 x 2500 tokens >> KV capacity
    outs = simulate(backend, load)
    print(f"KV tokens {kv}, preemptions {backend.preemptions}")
    assert kv < 40 * 2500 and backend.preemptions > 0
    assert all(len(o.token_ns) == 1500 for o in outs)


def test_prefix_aware_router_keeps_a_prefix_on_one_replica() -> None:
    base = ModelTiming("llama-3.1-8b", "h100", dp=4)
    load = [Arrival(i * 0.05, 2000, 4, prefix_id=i % 2, prefix_len=1900) for i in range(32)]
    hits = {}
    for router in ("round-robin", "prefix-aware"):
        b = ModelBackend(dataclasses.replace(base, router=router))
        simulate(b, load)
        hits[router] = b.prefix_hits
    print(f"prefix hits: {hits}")
    assert hits["prefix-aware"] > hits["round-robin"]


def test_sweep_trade_off_tp4_for_long_prompts_dp2tp2_for_short_prompts_at_load() -> None:
    tp4 = ModelTiming("llama-3.1-70b", "h100", tp=4)
    dp2 = ModelTiming("llama-3.1-70b", "h100", tp=2, dp=2)
    assert dp2.cost_model().kv_tokens() > 100_000  # FP8 default leaves a usable KV cache at TP2
    a, b = single(tp4, 16000, 32), single(dp2, 16000, 32)
    print(f"16k prompt TTFT: TP4 {a.ttft_s*1e3:.0f} ms, DP2xTP2 {b.ttft_s*1e3:.0f} ms")
    assert a.ttft_s < 0.75 * b.ttft_s
    load = burst(800, 200, 200)  # 400 per replica: fits DP2xTP2's KV (no preemption)
    ta, tb = throughput(run(tp4, load)), throughput(run(dp2, load))
    print(f"short prompts at load: TP4 {ta:.0f} tok/s, DP2xTP2 {tb:.0f} tok/s")
    assert tb > 1.1 * ta


def test_pcp_shortens_very_long_prefill_at_extra_gpus() -> None:
    base = ModelTiming("llama-3.1-8b", "h100")
    pcp = dataclasses.replace(base, pcp=2)
    a, b = single(base, 60000, 4), single(pcp, 60000, 4)
    print(f"60k prompt TTFT: pcp1 {a.ttft_s*1e3:.0f} ms, pcp2 {b.ttft_s*1e3:.0f} ms ({pcp.gpus} GPUs)")
    assert b.ttft_s < 0.9 * a.ttft_s and pcp.gpus == 2


def test_jitter_is_seeded() -> None:
    t = ModelTiming("llama-3.1-8b", "h100", jitter=0.08, seed=4)
    load = [Arrival(0.0, 300, 40), Arrival(0.01, 300, 40)]
    a = [o.token_ns for o in run(t, load)]
    assert a == [o.token_ns for o in run(t, load)]
    assert a != [o.token_ns for o in run(dataclasses.replace(t, seed=5), load)]
    itl = [x for o in run(t, load) for x in o.itls_s]
    assert statistics.pstdev(itl) / statistics.mean(itl) > 0.03


def test_least_queue_and_kv_aware_routers_spread_a_burst() -> None:
    for router in ("least-queue", "kv-aware", "round-robin"):
        b = ModelBackend(ModelTiming("llama-3.1-8b", "h100", dp=2, router=router))
        outs = simulate(b, [Arrival(i * 0.001, 3000, 50) for i in range(10)])
        per = [sum(1 for o in outs if o.replica == r) for r in (0, 1)]
        assert per == [5, 5], (router, per)


def test_moe_dp_attention_ranks_step_together_so_a_long_prefill_on_one_slows_all() -> None:
    ep = ModelTiming("mixtral-8x7b", "h100", "fp8", dp=2, ep=2, router="round-robin")
    no_ep = dataclasses.replace(ep, ep=1)
    # rank 0 decodes a short request; rank 1 gets a 8000-token prompt meanwhile
    load = [Arrival(0.0, 100, 60), Arrival(0.05, 8000, 2)]
    short_ep = run(ep, load)[0]
    short_plain = run(no_ep, load)[0]
    worst_ep, worst_plain = max(short_ep.itls_s), max(short_plain.itls_s)
    print(f"decode ITL max on the other rank: EP lock-step {worst_ep*1e3:.1f} ms, independent DP {worst_plain*1e3:.1f} ms")
    assert short_ep.replica != 1 and worst_ep > 3 * worst_plain


def test_long_prompts_competing_for_kv_never_deadlock() -> None:
    from bench_llm.sim.presets import PROFILES

    t = ModelTiming("llama-3.1-70b", "h100", tp=2, max_num_batched_tokens=2048,
                    profile_spec=dataclasses.replace(PROFILES["vllm"], gpu_memory_utilization=0.5))
    backend = ModelBackend(t)
    kv = backend.cost.kv_tokens()
    prompt = int(kv * 0.6)
    outs = simulate(backend, [Arrival(0.0, prompt, 20), Arrival(0.0, prompt, 20), Arrival(0.001, prompt, 20)])
    assert all(len(o.token_ns) == 20 for o in outs)
