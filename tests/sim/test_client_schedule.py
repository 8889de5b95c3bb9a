"""Virtual time runs the client's schedule: the same small closed-loop load, sent by bench's own
client to the simulated engine's HTTP server in real time, and run through the same engine in
virtual time (``bench run --clock virtual``), gives the same TTFT distribution.

Both start all C streams together after the warm-up has ended and refill a stream the moment its
request ends. The engine's steps are slowed (``slowdown``) so that one step is long against the
host's scheduling noise; the comparison is then of quantiles with a tolerance of a fraction of a
step, not of wall-clock noise."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from bench_llm.bench.execute import RunConfig
from bench_llm.bench.virtual import VirtualEngine, simulate_run
from bench_llm.sim.config import ServerConfig
from bench_llm.sim.options import ModelTiming
from tests.sim_helpers import run_against

#: Llama-3.1-8B BF16 on one H100, steps 4x slower than modelled: a 4 x 512-token prefill step takes
#: ~0.18 s, a decode step ~30 ms
TIMING = ModelTiming("llama-3.1-8b", "h100", "bf16", slowdown=4.0, enable_prefix_caching=False)
CONCURRENCY, REQUESTS, WARMUP = 4, 12, 4


def _ttfts_ms(rows: list[dict]) -> list[float]:
    out = [(r["first_token_ns"] - r["send_ns"]) / 1e6 for r in rows if r["phase"] == "measure"]
    return sorted(out)


@pytest.mark.timeout(120)
def test_closed_loop_ttft_in_virtual_time_matches_the_real_client(tmp_path: Path) -> None:
    from bench_llm.workloads.synthetic import SyntheticWorkload

    sched = SyntheticWorkload(requests=REQUESTS, input_tokens=512, output_tokens=8, concurrency=CONCURRENCY,
                              warmup=WARMUP, seed=3).schedule()
    real = run_against(ServerConfig(model="llama-3.1-8b", model_timing=TIMING), sched, tmp_path / "real")
    cfg = RunConfig(out=tmp_path / "virtual", url="virtual://", engine="sim", model="llama-3.1-8b", schedule=sched,
                    scrape_interval_s=None)
    done = simulate_run(cfg, VirtualEngine(TIMING, "vllm", ()))
    virtual = done.requests.to_pylist()
    # the warm-up is excluded the same way: the same requests are measured
    assert sorted(r["request_id"] for r in real if r["phase"] == "measure") == \
        sorted(r["request_id"] for r in virtual if r["phase"] == "measure")
    rt, vt = _ttfts_ms(real), _ttfts_ms(virtual)
    assert len(rt) == len(vt) == REQUESTS
    # all C streams start together, so the first prompts share a prefill step: far above a lone prompt's TTFT
    assert statistics.median(vt) > 100.0, vt
    print("real", [round(x) for x in rt], "virtual", [round(x) for x in vt])
    # an idle engine starts a step with the first request the front end hands it; the others of the wave
    # share the next one: one early first token per wave, in both
    early = (sum(1 for x in rt if x < 0.6 * statistics.median(rt)), sum(1 for x in vt if x < 0.6 * statistics.median(vt)))
    assert early[1] == REQUESTS // CONCURRENCY and abs(early[0] - early[1]) <= 1, early
    for q in (0.25, 0.5, 0.75):
        r, v = rt[int(q * (len(rt) - 1))], vt[int(q * (len(vt) - 1))]
        assert abs(r - v) <= 0.25 * v + 15.0, (q, rt, vt)


@pytest.mark.timeout(120)
def test_open_loop_sends_at_the_same_intended_times_in_both(tmp_path: Path) -> None:
    from bench_llm.workloads.synthetic import SyntheticWorkload

    sched = SyntheticWorkload(requests=8, input_tokens=512, output_tokens=8, rate=6.0, arrival="constant",
                              seed=3).schedule()
    real = run_against(ServerConfig(model="llama-3.1-8b", model_timing=TIMING), sched, tmp_path / "real")
    cfg = RunConfig(out=tmp_path / "virtual", url="virtual://", engine="sim", model="llama-3.1-8b", schedule=sched,
                    scrape_interval_s=None)
    virtual = simulate_run(cfg, VirtualEngine(TIMING, "vllm", ())).requests.to_pylist()

    def offsets(rows: list[dict]) -> list[int]:
        t0 = min(r["intended_send_ns"] for r in rows)
        return sorted(r["intended_send_ns"] - t0 for r in rows)

    assert offsets(real) == offsets(virtual)  # the same intended send times, relative to the first
    rt, vt = _ttfts_ms(real), _ttfts_ms(virtual)
    print("real", [round(x) for x in rt], "virtual", [round(x) for x in vt])
    for r, v in zip(rt, vt):
        assert abs(r - v) <= 0.25 * v + 15.0, (rt, vt)
