"""Speculative decoding (MTP, EAGLE, draft models) in the performance model, and the measured rows run with it.

A speculative decode step verifies k draft tokens per sequence (1 + k query tokens through the target model),
runs k draft passes, and keeps the sequence's own token plus the drafts accepted in a row. Checked in virtual
time: the tokens a step keeps, what the step costs, and the silicon rows' MTP campaigns."""

from __future__ import annotations

import dataclasses
import random
import statistics
from pathlib import Path

import pytest

from bench_llm.core.errors import BenchError
from bench_llm.sim import silicon
from bench_llm.sim.backend import ModelBackend
from bench_llm.sim.options import ModelTiming, describe
from bench_llm.sim.scheduler import Instance
from bench_llm.sim.serve_args import build_config, parse_serve_args
from bench_llm.sim.virtual import Plan, Send, run
from tests.sim_helpers import run_against, spaced

from .test_sim_silicon import COLUMNS

BASE = ModelTiming("deepseek-v3", "h200", "fp8", tp=8, profile="trtllm", enable_prefix_caching=False)


def _one_request(timing: ModelTiming, osl: int = 101) -> list[int]:
    res = run(ModelBackend(timing), [Send(256, osl)], Plan(concurrency=1))
    return res.outcomes[0].token_ns


def test_every_accepted_draft_leaves_with_its_step() -> None:
    """Acceptance 1 with one draft: after the prefill's token, every step keeps two tokens (sent together)."""
    plain = _one_request(BASE)
    spec = _one_request(dataclasses.replace(BASE, spec_tokens=1, spec_accept=1.0))
    assert len(plain) == len(spec) == 101  # the output length is exact whatever the drafts
    assert len(set(plain)) == 101
    assert len(set(spec)) == 1 + 50  # the first token, then 100 tokens two by two
    assert spec == sorted(spec)
    # each step costs more (two query tokens, a draft pass) but gives twice the tokens
    tpot = (spec[-1] - spec[0]) / 100
    assert (plain[-1] - plain[0]) / 100 * 0.5 < tpot < (plain[-1] - plain[0]) / 100


def test_rejected_drafts_only_cost() -> None:
    """Acceptance 0: every draft is thrown away, so the stream is slower than without speculation."""
    plain = _one_request(BASE)
    spec = _one_request(dataclasses.replace(BASE, spec_tokens=2, spec_accept=0.0))
    assert len(set(spec)) == 101
    assert spec[-1] - spec[0] > plain[-1] - plain[0]


def test_kept_tokens_follow_the_acceptance_chain() -> None:
    """Mean tokens per step with k drafts at rate a: 1 + a + a^2 + ... + a^k (seeded draws)."""
    timing = dataclasses.replace(BASE, spec_tokens=3, spec_accept=0.6)
    backend = ModelBackend(timing)
    inst: Instance = backend.instances[0]
    inst.rng = random.Random(1)

    class _Req:
        max_tokens, generated, seqs = 1 << 20, 0, 1

    kept = [inst._accepted_tokens(_Req()) for _ in range(20_000)]  # type: ignore[arg-type]
    assert statistics.fmean(kept) == pytest.approx(1 + 0.6 + 0.36 + 0.216, abs=0.03)
    assert max(kept) == 4 and min(kept) == 1
    near_end = _Req()
    near_end.generated = near_end.max_tokens - 2
    assert all(inst._accepted_tokens(near_end) <= 2 for _ in range(200))  # never past the output length


def test_a_speculative_step_costs_its_verify_tokens_and_draft_passes() -> None:
    plain = BASE.cost_model().step([], 32, 32 * 2000)
    spec = dataclasses.replace(BASE, spec_tokens=1).cost_model().step([], 32, 32 * 2000)
    assert spec.parts["spec_draft"] > 0 and plain.parts["spec_draft"] == 0
    assert spec.parts["linear"] > plain.parts["linear"]  # 64 query tokens touch more experts than 32
    assert spec.parts["attn_decode"] >= plain.parts["attn_decode"]
    assert sum(spec.parts.values()) == pytest.approx(spec.latency_s)
    # one MTP layer of 61: the draft pass is a small share of the step
    assert spec.parts["spec_draft"] < 0.1 * spec.latency_s
    # a prefill-only step carries no drafts
    assert dataclasses.replace(BASE, spec_tokens=1).cost_model().step([(512, 0)], 0, 0).parts["spec_draft"] == 0


def test_a_decode_takes_its_verify_tokens_from_the_step_budget() -> None:
    """With a budget of 8 tokens and one draft each, a step decodes at most 4 sequences (more without drafts)."""
    timing = dataclasses.replace(BASE, spec_accept=0.5, max_num_batched_tokens=8, max_num_seqs=16)

    def widest_decode(spec: int) -> int:
        backend = ModelBackend(dataclasses.replace(timing, spec_tokens=spec))
        cost = backend.instances[0].cost
        seen: list[int] = []
        times = cost.times

        def spy(prefill: list[tuple[int, int]], n_decode: int, ctx: int) -> tuple[float, float, tuple[float, ...]]:
            seen.append(n_decode)
            return times(prefill, n_decode, ctx)

        cost.times = spy  # type: ignore[method-assign]
        res = run(backend, [Send(8, 20) for _ in range(8)], Plan(concurrency=8))
        assert all(len(o.token_ns) == 20 for o in res.outcomes)
        return max(seen)

    assert widest_decode(1) == 4
    assert widest_decode(0) > 4
    # no more running requests than the budget can step at once (the others would wait behind them)
    assert dataclasses.replace(timing, spec_tokens=1).limits()[0] == 4
    assert dataclasses.replace(timing, spec_tokens=0).limits()[0] == 16
    many = run(ModelBackend(dataclasses.replace(timing, spec_tokens=3, max_num_batched_tokens=16)),
               [Send(4, 30) for _ in range(16)], Plan(concurrency=16))
    assert all(len(o.token_ns) == 30 for o in many.outcomes)


def test_spec_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="spec_tokens"):
        dataclasses.replace(BASE, spec_tokens=9)
    with pytest.raises(ValueError, match="probability"):
        dataclasses.replace(BASE, spec_accept=1.5)
    with pytest.raises(BenchError, match="spec_accept"):
        build_config(parse_serve_args(["--timing", "model", "--spec-tokens", "1", "--spec-accept", "2"]))


def test_the_serve_flags_reach_the_model_and_its_stream(tmp_path: Path) -> None:
    """``bench sim serve --spec-tokens 1 --spec-accept 1``: in real time, a 21-token answer arrives as its
    first token and then ten chunks of two tokens (the accepted draft leaves with its step's chunk)."""
    kw = parse_serve_args(["--timing", "model", "--model-preset", "llama-3.1-8b", "--gpu", "h100",
                           "--spec-tokens", "1", "--spec-accept", "1"])
    cfg = build_config(kw)
    mt = cfg.model_timing
    assert mt is not None and (mt.spec_tokens, mt.spec_accept) == (1, 1.0)
    assert describe(mt)["speculative"] == {"draft_tokens": 1, "accept": 1.0, "draft_layers": 1.0}
    assert "speculative" not in describe(build_config(parse_serve_args(["--timing", "model"])).model_timing)
    rows = run_against(cfg, spaced(["a b c d"], 21, gap_ms=5), tmp_path)
    (row,) = rows
    assert row["ok"] and row["output_tokens"] == 21
    # tokens per streamed chunk, whatever the clock: the prefill's one, then ten steps of two (the last,
    # tokenless chunk ends the stream)
    assert [n for n in row["chunk_tokens"] if n] == [1] + [2] * 10


#: made-up rows (figures invented): the same configuration measured on two days, and a row of another engine
_MTP_ROWS = (
    "m1,measured=2026-01-14T00:00:00Z,trtllm,1.1,deepseek-ai/DeepSeek-R1,h200_sxm,fp8,agg,256,16,fp8,fp8,4,8,1,1,1,8,"
    ",,,,,,,,,,,,,,400.0,8.0",
    "m2,measured=2025-12-15T00:00:00Z,trtllm,1.1,deepseek-ai/DeepSeek-R1,h200_sxm,fp8,agg,256,16,fp8,fp8,4,8,1,1,1,8,"
    ",,,,,,,,,,,,,,300.0,12.0",
    "m3,measured=2026-01-14T00:00:00Z,sglang,0.5,deepseek-ai/DeepSeek-V3,h200_sxm,fp8,agg,256,16,fp8,fp8,4,8,1,1,1,8,"
    ",,,,,,,,,,,,,,300.0,12.0",
)


def test_rows_of_an_mtp_campaign_run_with_one_draft(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("\n".join((COLUMNS, *_MTP_ROWS)) + "\n")
    points = {p.id: p for p in silicon.load(path)}
    assert points["m1"].spec_tokens == silicon.MTP_DRAFTS == 1
    assert points["m2"].spec_tokens == 0 and points["m3"].spec_tokens == 0  # another day; another engine
    assert points["m1"].key != points["m2"].key  # simulated apart
    timing = silicon.engine_timing(points["m1"])
    assert (timing.spec_tokens, timing.spec_accept) == (1, silicon.MTP_ACCEPT)
    assert silicon.engine_timing(points["m2"]).spec_tokens == 0
    # the evidence is the measured rows alone: the earlier day's TPOT and TTFT over the MTP row's
    assert silicon.mtp_evidence(list(points.values())) == [(12.0 / 8.0, 300.0 / 400.0)]
    later = silicon.load(path)[1]  # measured after the MTP day: not evidence
    later_pts = [points["m1"], dataclasses.replace(later, measured="2026-02-01")]
    assert silicon.mtp_evidence(later_pts) == []
    assert "run with MTP" in silicon.report(path, workers=1)


REAL = silicon.default_path()


@pytest.mark.skipif(REAL is None, reason="no ../shared/reference/silicon/h200_silicon.csv (measured H200 rows) here")
def test_the_measured_mtp_campaign() -> None:
    """The real rows: the MTP campaign's configurations measured earlier without MTP had more TPOT (the
    inference rests on that, model-free), and a small sample of the campaign (1 024/1 024 TP8 EP8, C <= 8)
    runs within ±20 % of its TPOT with one draft at the unfitted 0.85 and 1.4x or more off without it."""
    assert REAL is not None
    points = silicon.load(REAL)
    pairs = silicon.mtp_evidence(points)
    assert len(pairs) >= 15 and min(t for t, _ in pairs) > 1.15
    sample = [p for p in points if p.spec_tokens and (p.isl, p.osl) == (1024, 1024) and p.concurrency <= 8]
    assert len(sample) >= 2
    for s in silicon.score(sample):
        assert abs(s.ratios[1] - 1) <= 0.20, silicon.rows_table([s])
        plain = silicon.simulate(dataclasses.replace(s.point, spec_tokens=0))
        assert plain[1] / s.point.tpot_ms > 1.4
