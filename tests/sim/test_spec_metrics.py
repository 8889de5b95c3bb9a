"""Speculative decoding's counters: what the simulated engine's /metrics exports (vLLM's four counters,
SGLang's two gauges) and what bench's summary makes of them (docs/metrics.md, "Speculative decoding
acceptance"). Exact where the acceptance is 1 or 0; at other rates, seeded draws over thousands of
drafts and a tolerance of several standard deviations (nothing here reads a wall-clock duration)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path

import aiohttp
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.analysis.load import load_run
from bench_llm.analysis.server_metrics import SpecDecodeAcceptance, server_summary, spec_decode_acceptance
from bench_llm.bench.execute import RunConfig, execute_run
from bench_llm.bench.report_text import _server_lines as server_lines
from bench_llm.loadgen.runner import RunOptions
from bench_llm.loadgen.scrape import DeltaTracker, parse_metrics
from bench_llm.results.reader import read_server_metrics
from bench_llm.results.schema import SERVER_METRICS_SCHEMA
from bench_llm.sim.backend import ModelBackend
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.server import ServerConfig, create_app, serve_in_process
from bench_llm.sim.virtual import Plan, Send, run
from bench_llm.workloads.spec import Schedule
from tests.sim_helpers import schedule

MODEL = ModelTiming("llama-3.1-8b", "h100")


def _served_run(cfg: ServerConfig, sched: Schedule, tmp: Path) -> Path:
    """``sched`` run by bench against ``cfg`` served in-process, /metrics scraped; the run's directory."""

    async def main() -> Path:
        async with serve_in_process(create_app(cfg)) as url:
            rc = RunConfig(out=tmp, url=url, engine="sim", model=cfg.model, schedule=sched,
                           options=RunOptions(progress=False, drain_timeout_s=30.0), scrape_interval_s=0.5)
            res = await execute_run(rc, OpenAIAdapter(model=cfg.model), install_signals=False)
            return res.run_dir

    return asyncio.run(main())


def _page(cfg: ServerConfig) -> str:
    async def main() -> str:
        async with serve_in_process(create_app(cfg)) as url, aiohttp.ClientSession() as s:
            async with s.get(url + "/metrics") as r:
                return await r.text()

    return asyncio.run(main())


def _increase(table: pa.Table, common: str) -> float:
    t = table.filter(pc.equal(table["common"], common))
    assert t.num_rows, common
    return float(pc.sum(pc.fill_null(t["delta"], 0)).as_py() or 0)


def _spec(cfg_timing: ModelTiming, flavor: str = "vllm") -> ServerConfig:
    return ServerConfig(model="llama-3.1-8b", flavor=flavor, model_timing=cfg_timing)


@pytest.mark.parametrize(("k", "accept"), [(1, 1.0), (2, 0.0)])
def test_the_vllm_counters_count_the_tokens_streamed(tmp_path: Path, k: int, accept: float) -> None:
    """Acceptance 1 with one draft: every verification step accepts its draft (accepted = drafts =
    draft tokens); acceptance 0 with two: none is accepted. Either way each request's tokens are its
    prefill's one plus, per step, one of its own and the accepted drafts, so the engine's
    ``generation_tokens`` is the tokens the client counted, and requests + drafts + accepted."""
    timing = dataclasses.replace(MODEL, spec_tokens=k, spec_accept=accept)
    # 21 tokens: 1 + 10 steps of 2 at acceptance 1 (the output's end never cuts a chain)
    run_dir = _served_run(_spec(timing), schedule(12, input_tokens=32, output_tokens=21, concurrency=4), tmp_path)
    requests = load_run(run_dir).requests
    assert all(requests["ok"].to_pylist())
    streamed = sum(requests["output_tokens"].to_pylist())
    assert streamed == 12 * 21
    table = read_server_metrics(run_dir)
    assert table is not None
    drafts, draft_tokens = _increase(table, "spec_decode_drafts"), _increase(table, "spec_decode_draft_tokens")
    accepted = _increase(table, "spec_decode_accepted_tokens")
    assert draft_tokens == k * drafts
    assert accepted == (drafts if accept == 1.0 else 0)
    # (the engine's generation counter exists at 0 from the start, as vLLM's: its increase is every token)
    assert _increase(table, "generation_tokens") == streamed == 12 + drafts + accepted
    s = server_summary(run_dir, requests)
    assert s is not None
    spec: SpecDecodeAcceptance = s["spec_decode"]
    assert (spec.drafts, spec.draft_tokens, spec.accepted_tokens) == (drafts, draft_tokens, accepted)
    assert spec.acceptance_rate == accept and spec.accepted_per_step == accept * k
    assert spec.by_position == (accept,) * k and spec.chain_acceptance == accept
    line = [x for x in server_lines(s) if x.startswith("speculative decoding")]
    assert line and f"acceptance {100 * accept:.1f}%" in line[0]


def test_the_summary_gives_the_acceptance_the_engine_ran_with(tmp_path: Path) -> None:
    """Three drafts, each accepted with probability 0.7 once the ones before it were: the summary's
    per-draft (chain) acceptance is the 0.7 the simulator was given, the share of draft tokens accepted
    (0.7 + 0.49 + 0.343) / 3, and position i is reached by 0.7^(i+1) of the steps. Seeded draws over
    ~1,900 steps (~2,900 accept/reject trials: one standard deviation of the chain's rate is 0.009)."""
    a, k = 0.7, 3
    timing = dataclasses.replace(MODEL, spec_tokens=k, spec_accept=a)
    run_dir = _served_run(_spec(timing), schedule(24, input_tokens=32, output_tokens=200, concurrency=8), tmp_path)
    requests = load_run(run_dir).requests
    s = server_summary(run_dir, requests)
    assert s is not None
    spec: SpecDecodeAcceptance = s["spec_decode"]
    assert spec.drafts > 1500
    assert spec.chain_acceptance == pytest.approx(a, abs=0.04)
    assert spec.acceptance_rate == pytest.approx((a + a**2 + a**3) / 3, abs=0.04)
    assert spec.accepted_per_step == pytest.approx(a + a**2 + a**3, abs=0.12)
    for i, reached in enumerate(spec.by_position):
        assert reached == pytest.approx(a ** (i + 1), abs=0.04)
    assert spec.accepted_per_step == pytest.approx(sum(spec.by_position))  # the same counts, two ways


def test_a_virtual_run_samples_the_same_counters(tmp_path: Path) -> None:
    """``bench run --clock virtual`` records the counters the scheduler kept, exactly."""
    from bench_llm.bench.virtual import execute_virtual, virtual_engine
    from bench_llm.launch.config import ParallelConfig

    rc = RunConfig(out=tmp_path, url="virtual:", engine="sim", model="llama-3.1-8b",
                   schedule=schedule(16, input_tokens=64, output_tokens=200, concurrency=8))
    engine = virtual_engine("llama-3.1-8b", "h100", ParallelConfig(),
                            extra_args=("--spec-tokens", "3", "--spec-accept", "0.7"))
    r = load_run(execute_virtual(rc, engine).run_dir)
    s = server_summary(r.path, r.requests)
    assert s is not None
    spec: SpecDecodeAcceptance = s["spec_decode"]
    assert spec.draft_tokens == 3 * spec.drafts > 1000
    assert spec.chain_acceptance == pytest.approx(0.7, abs=0.05)
    # the client's tokens: each request's first, then per step its own and the accepted drafts,
    # less what the output's end cut from its last chain (at most k - 1 = 2 per request)
    streamed = sum(r.requests["output_tokens"].to_pylist())
    assert 0 <= 16 + spec.drafts + spec.accepted_tokens - streamed <= 2 * 16


def test_without_speculation_the_page_has_no_spec_counters(tmp_path: Path) -> None:
    """vLLM registers them only with a speculative config; SGLang sets its gauges to 0."""
    assert "spec_decode" not in _page(_spec(MODEL))
    page = _page(_spec(MODEL, "sglang"))
    assert 'sglang:spec_accept_length{' in page and 'sglang:spec_accept_rate{' in page
    rows = {r["metric"]: r["value"] for r in parse_metrics(page, 1) if r["metric"].startswith("sglang:spec_")}
    assert rows == {"sglang:spec_accept_length": 0.0, "sglang:spec_accept_rate": 0.0}
    page = _page(_spec(dataclasses.replace(MODEL, spec_tokens=2)))
    # registered from the start, every position: before any request all at 0
    zero = [r for r in parse_metrics(page, 1) if r["metric"].startswith("vllm:spec_decode")]
    assert {r["metric"] for r in zero} == {f"vllm:spec_decode_num_{n}_total" for n in
                                           ("drafts", "draft_tokens", "accepted_tokens", "accepted_tokens_per_pos")}
    assert sorted(r["labels"] for r in zero if "per_pos" in r["metric"]) == [
        '{"engine":"0","model_name":"llama-3.1-8b","position":"0"}',
        '{"engine":"0","model_name":"llama-3.1-8b","position":"1"}']  # fmt: skip
    assert all(r["value"] == 0 for r in zero)


def test_sglang_gauges_cover_the_steps_since_the_last_page() -> None:
    """SGLang's ``spec_accept_length`` (the step's own token included) and ``spec_accept_rate``, over
    the verification steps since the last page (SGLang: since its last decode log point)."""
    from bench_llm.sim.prom import FlavorMetrics
    from bench_llm.sim.spec_counts import SpecDecodeCounts

    m = FlavorMetrics("sglang", "m")

    def gauges(spec: SpecDecodeCounts | None) -> dict[str, float]:
        page = m.render(0, 0, 0.0, 0, 0, 0, 100, 100, [], 0.0, spec)
        return {r["metric"]: r["value"] for r in parse_metrics(page, 1) if r["metric"].startswith("sglang:spec_")}

    c = SpecDecodeCounts(2)
    for _ in range(10):
        c.observe(2)
    assert gauges(c) == {"sglang:spec_accept_length": 3.0, "sglang:spec_accept_rate": 1.0}
    for _ in range(10):
        c.observe(0)
    assert gauges(c) == {"sglang:spec_accept_length": 1.0, "sglang:spec_accept_rate": 0.0}  # the window only
    assert gauges(c) == {"sglang:spec_accept_length": 1.0, "sglang:spec_accept_rate": 0.0}  # no steps: kept


def test_the_output_end_does_not_cut_the_counted_chain() -> None:
    """vLLM counts the drafts the rejection sampler accepted before the stop check trims the output,
    and schedules all k drafts near ``max_tokens``: at acceptance 1 every step counts k accepted even
    where the output had room for fewer, and the tokens and their times are those without counting."""
    timing = dataclasses.replace(ModelTiming("deepseek-v3", "h200", "fp8", tp=8, profile="trtllm"),
                                 spec_tokens=3, spec_accept=1.0)
    b = ModelBackend(timing)
    res = run(b, [Send(256, 100)], Plan(concurrency=1))  # 1 + 24 steps of 4, then a step with room for 3
    assert len(res.outcomes[0].token_ns) == 100
    spec = b.spec_decode
    assert spec is not None and (spec.drafts, spec.draft_tokens, spec.accepted) == (25, 75, 75)
    assert spec.accepted_per_pos == [25, 25, 25]


def test_the_acceptance_definition_on_two_engines_pages() -> None:
    """Counter increases summed over DP ranks; positions read from their label."""

    def page(drafts: int, accepted: int, per_pos: tuple[int, int]) -> str:
        """Both DP ranks at the same counts."""
        values = {"drafts": [("", drafts)], "draft_tokens": [("", 2 * drafts)], "accepted_tokens": [("", accepted)],
                  "accepted_tokens_per_pos": [(f',position="{i}"', n) for i, n in enumerate(per_pos)]}
        lines = []
        for family, samples in values.items():
            lines.append(f"# TYPE vllm:spec_decode_num_{family} counter")
            lines += [f'vllm:spec_decode_num_{family}_total{{engine="{e}",model_name="m"{extra}}} {v}'
                      for e in ("0", "1") for extra, v in samples]
        return "\n".join(lines) + "\n"

    d = DeltaTracker()
    rows = []
    for ts, text in ((1, page(100, 90, (60, 30))), (2, page(300, 250, (170, 80)))):
        r = parse_metrics(text, ts)
        d.apply(r)
        rows += r
    spec = spec_decode_acceptance(pa.Table.from_pylist(rows, schema=SERVER_METRICS_SCHEMA))
    assert spec is not None
    # per engine: 200 drafts, 400 draft tokens, 160 accepted; position 0 reached 110 times, position 1 50
    assert (spec.drafts, spec.draft_tokens, spec.accepted_tokens) == (400, 800, 320)
    assert spec.acceptance_rate == 0.4 and spec.accepted_per_step == 0.8
    assert spec.by_position == (220 / 400, 100 / 400)
    # trials: 320 accepted + (400 - 100) steps that ended on a rejection
    assert spec.chain_acceptance == pytest.approx(320 / 620)
    assert spec_decode_acceptance(pa.Table.from_pylist(rows[:0], schema=SERVER_METRICS_SCHEMA)) is None
    assert math.isnan(SpecDecodeAcceptance(0, 0, 0, math.nan, math.nan, (), None).acceptance_length)
