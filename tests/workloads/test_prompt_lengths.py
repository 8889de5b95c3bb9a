"""Issue 16 item 6: prompts of the length asked for, and said when they are not."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench_llm.analysis.format import format_summary
from bench_llm.analysis.summary import prompt_length_accounting
from bench_llm.analysis.summary_types import (
    DistributionMethod,
    RequestCounts,
    RunSummary,
    Throughput,
    TimingCheck,
    TokenAccounting,
)
from bench_llm.bench.sweep.loads import Load, build_schedule
from bench_llm.bench.sweep.spec import SweepSpec, WorkloadSpec
from bench_llm.results.reader import read_requests
from bench_llm.workloads.prompts import _CountingSynth
from bench_llm.workloads.synthetic import SyntheticWorkload
from tests.conftest import bench_argv
from tests.workloads.test_workload_schedule import tokenize_server  # noqa: F401, F811  (the fixture)


def _bpe_like(text: str) -> int:
    """Words of up to four characters are one token, longer ones two (as a small BPE vocabulary
    splits them); words split at spaces, so counts add up."""
    return sum(1 if len(w) <= 4 else 2 for w in text.split())


def test_word_adjusting_hits_exact_lengths_with_multi_token_words() -> None:
    synth = _CountingSynth(_bpe_like)  # what --tokenize-url does, with the server's count
    rng = np.random.default_rng(0)
    for n in range(20, 400, 9):
        assert _bpe_like(synth.text(n, rng)) == n
    assert synth.misses == 0
    prefix = synth.text(100, rng)
    assert _bpe_like(synth.text(50, rng, prefix)) == 150


def test_an_unreachable_length_keeps_the_closest_try() -> None:
    synth = _CountingSynth(lambda t: 2 * len(t.split()))  # every word two tokens: odd lengths cannot be hit
    rng = np.random.default_rng(1)
    for n in (21, 57, 129):
        got = 2 * len(synth.text(n, rng).split())
        assert abs(got - n) == 1, (n, got)
    assert synth.misses == 3


def test_synthetic_workload_takes_a_prompt_synth() -> None:
    class Counting(_CountingSynth):
        source = "server_tokenize"

    s = SyntheticWorkload(requests=6, input_tokens=64, output_tokens=4, concurrency=1).schedule(Counting(_bpe_like))
    assert [_bpe_like(r.prompt or "") for r in s.requests] == [64] * 6
    assert {r.input_tokens_source for r in s.requests} == {"server_tokenize"}
    assert s.description["prompt"] == {"method": "server_tokenize"}


def _rows(got: list[int | None], want: int = 128, turns: list[int | None] | None = None) -> pd.DataFrame:
    return pd.DataFrame({"prompt_tokens": pd.array(got, dtype="Int32"), "input_tokens_target": want,
                         "turn": pd.array(turns or [None] * len(got), dtype="Int32")})  # fmt: skip


def test_prompt_lengths_compared_and_warned() -> None:
    exact = prompt_length_accounting(_rows([128] * 10))
    assert exact.compared == 10 and exact.exact_share == 1.0 and exact.ratio_p50 == 1.0
    assert exact.warning is None
    # what real vLLM did with --input-tokens 128 and the word approximation: 171-214, p50 192
    off = prompt_length_accounting(_rows([171, 192, 192, 214, 180, 200, 128, None]))
    assert off.compared == 7 and off.exact_share == pytest.approx(1 / 7)
    assert off.ratio_p50 == pytest.approx(1.5)
    assert off.warning and "not the length asked for" in off.warning
    # counted exactly (chat API): the excess is the engine's own (its chat template)
    chat = _rows([145] * 4)
    chat["input_tokens_source"] = "server_tokenize"
    assert "chat template" in (prompt_length_accounting(chat).warning or "")
    # a later turn holds the conversation so far: not compared
    turns = prompt_length_accounting(_rows([128, 900], turns=[0, 1]))
    assert turns.compared == 1 and turns.warning is None


def test_summary_text_prints_the_prompt_line_and_warning() -> None:
    s = RunSummary(
        requests=RequestCounts(rows=1, warmup_excluded=0, measured=1, ok=1, failed=0, cancelled_at_end=0, anomalies=0,
                               anomaly_kinds={}, error_rate=0.0, errors={}, top_errors=[], non_streaming=0),
        throughput=Throughput(requests_per_s=1.0, output_tokens_per_s=1.0, total_tokens_per_s=1.0),
        window_s=1.0, percentiles=(50,), latency={},
        timing=TimingCheck(0, 0, True), token_distributions=DistributionMethod("exact", 0, 1, 0.0),
        tokens=TokenAccounting(sources={}, chunk_vs_server_mismatches=0, shorter_than_requested=0,
                               longer_than_requested=0, prompt=prompt_length_accounting(_rows([192, 192, 171])),
                               finish_reasons={}, natural_stops=0),
    )  # fmt: skip
    text = format_summary(s)
    assert "prompt tokens, server vs requested (n=3): 0% exact, p50 ratio 1.50" in text
    assert "WARNING: prompts are not the length asked for" in text


def test_bench_run_exact_lengths_without_workload(tmp_path: Path) -> None:
    """--tokenize-url worked only with --workload; 'auto' asks the engine measured."""
    res = subprocess.run(
        bench_argv("run", "--tokenize-url", "auto", "--requests", "4", "--concurrency", "2", "--input-tokens", "40",
                   "--output-tokens", "4", "--out", str(tmp_path / "run"), "--no-progress", "--json"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = read_requests(tmp_path / "run").to_pylist()
    assert {r["input_tokens_source"] for r in rows} == {"server_tokenize"}
    prompt = json.loads(res.stdout)["tokens"]["prompt"]
    assert prompt["compared"] == 4 and prompt["exact_share"] == 1.0


def test_sweep_loads_use_the_cells_tokenize_route(tokenize_server: str) -> None:  # noqa: F811
    spec = SweepSpec(model="m", workloads=(WorkloadSpec(input_tokens=30, output_tokens=4, tokenize_url="auto"),))
    load = Load("concurrency", 2, spec.workloads[0])
    s = build_schedule(load, spec, warmup=0, url=tokenize_server)
    assert {r.input_tokens_source for r in s.requests} == {"server_tokenize"}
    assert all(len((r.prompt or "").split()) == 30 for r in s.requests)
