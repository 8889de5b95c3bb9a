"""The requests users send beyond plain streamed text (issue 24): sampling parameters, stop
sequences and natural stops, and a general extra body, per engine and end to end."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench_llm.adapters.base import check_requests
from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.adapters.sglang import SGLangAdapter
from bench_llm.adapters.tgi import TGIAdapter
from bench_llm.analysis.format import format_summary
from bench_llm.analysis.load import load_run
from bench_llm.analysis.summary import summarize
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.server import ServerConfig
from bench_llm.workloads.catalog import build_named_schedule
from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.spec import RequestOptions, RequestSpec, Sampling, Schedule
from tests.conftest import bench_argv
from tests.sim_helpers import run_against, schedule

SAMPLING = Sampling(temperature=0.7, top_p=0.9, top_k=40, seed=7, stop=("###",), logprobs=2)


def _spec(sampling: Sampling | None = SAMPLING, fixed: bool = False) -> RequestSpec:
    return RequestSpec("r0", 4, 16, prompt="a b c d", sampling=sampling, fixed_output=fixed)


def _body(adapter: object, spec: RequestSpec) -> dict[str, object]:
    return orjson.loads(adapter.build(spec).body)  # type: ignore[attr-defined,no-any-return]


def test_each_engine_gets_its_own_field_names() -> None:
    completions = _body(OpenAIAdapter(), _spec())
    assert {k: completions[k] for k in ("temperature", "top_p", "top_k", "seed", "stop", "logprobs")} == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 7, "stop": ["###"], "logprobs": 2}
    assert "ignore_eos" not in completions and "min_tokens" not in completions  # stop sequences must be free to end it
    chat = _body(OpenAIAdapter(api="chat"), _spec())
    assert chat["logprobs"] is True and chat["top_logprobs"] == 2
    sg = _body(SGLangAdapter(), _spec())
    assert sg["sampling_params"] == {"max_new_tokens": 16, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
                                     "sampling_seed": 7, "stop": ["###"]}
    assert sg["return_logprob"] is True and sg["top_logprobs_num"] == 2
    tgi = _body(TGIAdapter(), _spec())
    assert tgi["parameters"] == {"max_new_tokens": 16, "details": True, "temperature": 0.7, "do_sample": True,
                                 "top_p": 0.9, "top_k": 40, "seed": 7, "stop": ["###"], "top_n_tokens": 2}
    # TGI rejects temperature 0 and top_p 1: they are its defaults, so they are left out
    greedy = _body(TGIAdapter(), _spec(Sampling(temperature=0.0, top_p=1.0)))
    assert greedy["parameters"] == {"max_new_tokens": 16, "details": True}


def test_what_an_engine_cannot_express_is_refused_by_name() -> None:
    specs = [_spec(None), _spec(Sampling(n=2))]
    check_requests(OpenAIAdapter(), specs)
    with pytest.raises(ValueError, match=r"^tgi: .*\bn\b"):
        check_requests(TGIAdapter(), specs)
    with pytest.raises(ValueError, match=r"^sglang .*sglang-openai"):
        check_requests(SGLangAdapter(), specs)
    with pytest.raises(ValueError, match="top_p must be in"):
        Sampling(top_p=1.5)


def test_extra_body_merges_nested_objects_key_by_key() -> None:
    extra = {"parameters": {"repetition_penalty": 1.1}, "truncate": 100}
    tgi = _body(TGIAdapter(extra_body=extra), _spec(None, fixed=True))
    assert tgi["parameters"]["repetition_penalty"] == 1.1 and tgi["parameters"]["max_new_tokens"] == 16
    assert tgi["truncate"] == 100
    sg = _body(SGLangAdapter(extra_body={"sampling_params": {"min_p": 0.1}}), _spec(None, fixed=True))
    assert sg["sampling_params"]["min_p"] == 0.1 and sg["sampling_params"]["ignore_eos"] is True
    oa = _body(OpenAIAdapter(extra_body={"repetition_penalty": 1.2}), _spec(None, fixed=True))
    assert oa["repetition_penalty"] == 1.2 and oa["ignore_eos"] is True


def test_cli_options_win_over_the_workload_file_and_a_rows_own_fields_win_over_both() -> None:
    file = RequestOptions(temperature=0.2, top_p=0.5, extra_body={"a": {"x": 1}})
    cli = RequestOptions(temperature=0.9, extra_body={"a": {"y": 2}})
    merged = cli.over(file)
    assert (merged.temperature, merged.top_p, merged.extra_body) == (0.9, 0.5, {"a": {"x": 1, "y": 2}})
    assert merged.forced and not RequestOptions(natural_stop=True).forced and not RequestOptions(stop=("x",)).forced
    sched = schedule(3)
    own = dataclasses.replace(sched.requests[0], sampling=Sampling(temperature=0.0))
    sched = dataclasses.replace(sched, requests=(own, *sched.requests[1:]))
    out = sched.with_request(merged)
    assert out.requests[0].sampling == Sampling(temperature=0.0, top_p=0.5)
    assert out.requests[1].sampling == Sampling(temperature=0.9, top_p=0.5)
    assert all(s.fixed_output for s in out.requests)
    assert not any(s.fixed_output for s in out.with_request(RequestOptions(stop=("###",))).requests)


def test_workload_file_request_table(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text('[lengths]\nlike = "fixed"\n[request]\ntemperature = 0.5\nstop = ["END"]\n'
                    'extra_body = { parameters = { repetition_penalty = 1.1 } }\n')
    sched = build_named_schedule(str(path), requests=4, rate=None, arrival="poisson", concurrency=2, warmup=0, seed=0)
    assert all(s.sampling == Sampling(temperature=0.5, stop=("END",)) and not s.fixed_output for s in sched.requests)
    assert sched.request.extra_body == {"parameters": {"repetition_penalty": 1.1}}
    path.write_text('[lengths]\nlike = "fixed"\n[request]\ntop_k = 0\n')
    with pytest.raises(WorkloadError, match=r"w\.toml: request: top_k must be >= 1"):
        build_named_schedule(str(path), requests=4, rate=None, arrival="poisson", concurrency=2, warmup=0, seed=0)
    path.write_text('[lengths]\nlike = "fixed"\n[request]\ntemprature = 0.5\n')
    with pytest.raises(WorkloadError, match="request.temprature"):
        build_named_schedule(str(path), requests=4, rate=None, arrival="poisson", concurrency=2, warmup=0, seed=0)


MODEL = ModelTiming("llama-3.1-8b", "h100")


@pytest.mark.parametrize(
    ("flavor", "adapter", "natural"),
    [("vllm", None, "stop"), ("sglang", SGLangAdapter(model="llama-3.1-8b"), "stop"),
     ("tgi", TGIAdapter(model="llama-3.1-8b"), "stop_sequence")],
)
def test_stop_sequences_end_requests_naturally_on_every_engine(
    tmp_path: Path, flavor: str, adapter: object, natural: str
) -> None:
    c = ServerConfig(model="llama-3.1-8b", flavor=flavor, model_timing=MODEL, natural_stop_mean=8.0)
    sched = schedule(10, input_tokens=16, output_tokens=60, concurrency=5).with_request(
        RequestOptions(temperature=0.7, top_p=0.9, seed=1, stop=("###",)))
    rows = run_against(c, sched, tmp_path, adapter)
    assert all(r["ok"] for r in rows), [r["error_message"] for r in rows if not r["ok"]]
    stopped = [r for r in rows if r["finish_reason"] == natural]
    assert len(stopped) >= 5 and all(r["output_tokens"] < 60 for r in stopped)
    s = summarize(load_run(tmp_path / "run").requests)
    assert s.tokens.natural_stops == len(stopped)
    assert f"natural stops {len(stopped)}/10" in format_summary(s)


def test_forced_runs_show_no_finish_reason_line(tmp_path: Path) -> None:
    c = ServerConfig(model="llama-3.1-8b", flavor="vllm", model_timing=MODEL, natural_stop_mean=8.0)
    run_against(c, schedule(4, output_tokens=20), tmp_path)
    s = summarize(load_run(tmp_path / "run").requests)
    assert s.tokens.finish_reasons == {"length": 4} and s.tokens.natural_stops == 0
    assert "finish reasons" not in format_summary(s)


def test_the_simulated_engine_refuses_what_vllm_refuses(tmp_path: Path) -> None:
    c = ServerConfig(model="llama-3.1-8b", flavor="vllm", model_timing=MODEL)
    rows = run_against(c, schedule(2), tmp_path, OpenAIAdapter(model="llama-3.1-8b", extra_body={"top_p": 0}))
    assert all(r["http_status"] == 400 and "top_p" in (r["error_message"] or "") for r in rows)


def test_bench_run_sampling_options_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = subprocess.run(bench_argv(
        "run", "--concurrency", "4", "--requests", "12", "--input-tokens", "8", "--output-tokens", "40",
        "--sim-ttft-ms", "5", "--sim-itl-ms", "1", "--sim-natural-stop", "6", "--temperature", "0.8",
        "--stop", "###", "--extra-body", '{"repetition_penalty": 1.05}', "--out", str(out), "--json", "--no-progress",
    ), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["requests"]["ok"] == 12 and s["tokens"]["natural_stops"] >= 6
    config = json.loads(load_run(out).meta["config_json"])
    assert config["request"] == {"sampling": {"temperature": 0.8, "stop": ["###"]}, "forced_length": False, "stream": True,
                                 "extra_body_keys": ["repetition_penalty"]}
    bad = subprocess.run(bench_argv("run", "--engine", "tgi", "--n", "2", "--requests", "2", "--out",
                                    str(tmp_path / "bad"), "--no-progress"), capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "tgi: /generate_stream has no n" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


def test_bench_run_no_stream_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ("run", "--concurrency", "2", "--requests", "4", "--input-tokens", "8", "--output-tokens", "8",
            "--sim-ttft-ms", "5", "--sim-itl-ms", "1", "--no-stream", "--no-progress")
    p = subprocess.run(bench_argv(*args, "--out", str(out)), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "non-streaming: 4 requests answered in one response" in p.stdout
    assert "TTFT (ms)" not in p.stdout and "cross-check" not in p.stdout and "nan" not in p.stdout
    bad = subprocess.run(bench_argv(*args, "--slo", "ttft_ms=500", "--out", str(tmp_path / "bad")),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "--slo ttft_ms: non-streaming" in bad.stderr


@pytest.mark.parametrize(
    ("flavor", "adapter"),
    [("vllm", None), ("vllm", OpenAIAdapter(model="llama-3.1-8b", api="chat")),
     ("sglang", SGLangAdapter(model="llama-3.1-8b")), ("tgi", TGIAdapter(model="llama-3.1-8b"))],
)
def test_non_streaming_requests_have_e2e_only(tmp_path: Path, flavor: str, adapter: object) -> None:
    c = ServerConfig(model="llama-3.1-8b", flavor=flavor, model_timing=MODEL)
    sched = schedule(6, input_tokens=16, output_tokens=12, concurrency=3).with_request(RequestOptions(stream=False))
    rows = run_against(c, sched, tmp_path, adapter)
    assert all(r["ok"] for r in rows), [r["error_message"] for r in rows if not r["ok"]]
    for r in rows:
        assert r["output_tokens"] == 12 and r["token_source"] == "response_usage"
        assert r["first_token_ns"] is None and r["chunk_ns"] == [] and r["end_ns"] > r["send_ns"]
    s = summarize(load_run(tmp_path / "run").requests)
    assert s.requests.non_streaming == 6
    assert s.latency["e2e_ms"]["n"] == 6
    assert s.latency["ttft_ms"]["n"] == s.latency["tpot_ms"]["n"] == s.latency["itl_ms"]["n"] == 0
    text = format_summary(s)
    assert "non-streaming: 6 requests" in text and "TTFT (ms)" not in text


def test_non_streaming_bodies_per_engine() -> None:
    spec = dataclasses.replace(_spec(None, fixed=True), stream=False)
    oa = _body(OpenAIAdapter(), spec)
    assert oa["stream"] is False and "stream_options" not in oa
    assert TGIAdapter().build(spec).path == "/generate" and "stream" not in _body(TGIAdapter(), spec)
    assert _body(SGLangAdapter(), spec)["stream"] is False


# -- local datasets --------------------------------------------------------------------------
SHAREGPT = [
    {"id": f"c{i}", "conversations": [{"from": "system", "value": "be brief"},
                                      {"from": "human", "value": f"question number {i} " + "word " * i},
                                      {"from": "gpt", "value": "answer " * (i + 1)}]}
    for i in range(12)
]


def _schedule(path: Path, seed: int = 0, requests: int = 8, **kw: Any) -> Schedule:
    return build_named_schedule(str(path), requests=requests, rate=None, arrival="poisson", concurrency=2, warmup=0,
                                seed=seed, **kw)


def test_sharegpt_json_gives_prompts_and_reply_lengths_and_the_same_seed_the_same_sample(tmp_path: Path) -> None:
    path = tmp_path / "sharegpt.json"
    path.write_bytes(orjson.dumps(SHAREGPT))
    a, b, c = _schedule(path, 1), _schedule(path, 1), _schedule(path, 2)
    prompts = [s.prompt for s in a.requests]
    assert prompts == [s.prompt for s in b.requests] != [s.prompt for s in c.requests]
    assert len(set(prompts)) == 8  # no row repeats before every row was taken
    for s in a.requests:
        i = int(s.prompt.split()[2])
        assert s.prompt.startswith("question number") and s.max_output_tokens == i + 1
        assert s.input_tokens_source == "given"


def test_jsonl_of_prompts_and_hf_parquet_and_json(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text('{"prompt": "one two three"}\n{"text": "four five"}\n')
    with pytest.raises(WorkloadError) as err:
        _schedule(jsonl)
    from bench_llm.bench.errors import setting_message

    # the CLI names the flag; the library names the setting (a TOML workload sets it too)
    assert re.search(r"prompts\.jsonl:1: no output length .*--output-tokens", setting_message(err.value))
    assert str(err.value).endswith("give output_tokens"), err.value
    sched = _schedule(jsonl, requests=4, output_tokens=32)
    assert sorted({s.prompt for s in sched.requests}) == ["four five", "one two three"]
    assert all(s.max_output_tokens == 32 for s in sched.requests)
    table = pa.table({"instruction": ["a b c", "d e"], "response": ["x y", "z"], "output_tokens": [None, 7]})
    pq.write_table(table, tmp_path / "hf.parquet")
    sched = _schedule(tmp_path / "hf.parquet", requests=2)
    assert {(s.prompt, s.max_output_tokens) for s in sched.requests} == {("a b c", 2), ("d e", 7)}
    hf_json = tmp_path / "hf.json"  # Dataset.to_json writes JSON lines
    hf_json.write_text('{"question": "why", "answer": "because it is"}\n')
    assert [(s.prompt, s.max_output_tokens) for s in _schedule(hf_json, requests=1).requests] == [("why", 3)]


def test_dataset_errors_name_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": "cut\n')
    with pytest.raises(WorkloadError, match=r"bad\.jsonl:2: not valid JSON"):
        _schedule(bad, output_tokens=8)
    noprompt = tmp_path / "np.json"
    noprompt.write_bytes(orjson.dumps([{"conversations": [{"from": "human", "value": "hi"}]}, {"title": "x"}]))
    with pytest.raises(WorkloadError, match=r"np\.json: item 1: no prompt"):
        _schedule(noprompt, output_tokens=8)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(WorkloadError, match=r"broken\.parquet: not a readable Parquet file"):
        _schedule(broken)


def test_bench_run_on_a_local_dataset_sends_its_prompts(tmp_path: Path) -> None:
    path = tmp_path / "sharegpt.json"
    path.write_bytes(orjson.dumps(SHAREGPT))
    out = tmp_path / "run"
    p = subprocess.run(bench_argv(
        "run", "--workload", str(path), "--concurrency", "3", "--requests", "6", "--seed", "4", "--sim-ttft-ms", "2",
        "--sim-itl-ms", "1", "--out", str(out), "--json", "--no-progress"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = load_run(out).requests.to_pylist()
    want = {s.request_id: s for s in _schedule(path, 4, requests=6).requests}
    for r in rows:
        assert r["ok"] and r["output_tokens"] == want[r["request_id"]].max_output_tokens
        assert r["prompt_tokens"] == want[r["request_id"]].input_tokens  # the simulated engine counts words too


# -- reasoning models ------------------------------------------------------------------------
def test_reasoning_tokens_come_first_and_are_counted_apart(tmp_path: Path) -> None:
    from bench_llm.sim.timing import FixedTiming

    c = ServerConfig(model="m", flavor="vllm", timing=FixedTiming(0.005, 0.004), reasoning_tokens=6)
    rows = run_against(c, schedule(4, input_tokens=8, output_tokens=10, concurrency=2), tmp_path,
                       OpenAIAdapter(model="m", api="chat"))
    for r in rows:
        assert r["ok"] and r["output_tokens"] == 10 and r["reasoning_tokens"] == 6
        # the reasoning comes first: the answer's first token is never before the first token
        # (equal only when one read brought both)
        assert r["first_content_ns"] >= r["first_token_ns"]
    s = summarize(load_run(tmp_path / "run").requests)
    assert s.tokens.reasoning is not None and s.tokens.reasoning.to_json() == {"requests": 4, "reasoning_tokens": 24, "answer_tokens": 16,
                                        "reasoning_tokens_mean": 6.0, "answer_tokens_mean": 4.0}
    assert s.latency["ttfo_ms"]["p50"] >= s.latency["ttft_ms"]["p50"]
    assert "reasoning: 4 requests reasoned" in format_summary(s)


def test_no_reasoning_line_without_reasoning(tmp_path: Path) -> None:
    c = ServerConfig(model="m", flavor="vllm", reasoning_tokens=6)
    run_against(c, schedule(2, output_tokens=8), tmp_path, OpenAIAdapter(model="m"))  # completions: no reasoning
    s = summarize(load_run(tmp_path / "run").requests)
    assert s.tokens.reasoning is None and "reasoning" not in format_summary(s)


def test_bench_run_reasoning_on_the_embedded_engine(tmp_path: Path) -> None:
    p = subprocess.run(bench_argv(
        "run", "--api", "chat", "--concurrency", "2", "--requests", "4", "--input-tokens", "8", "--output-tokens", "12",
        "--sim-ttft-ms", "2", "--sim-itl-ms", "1", "--sim-reasoning-tokens", "5", "--out", str(tmp_path / "run"),
        "--json", "--no-progress"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["tokens"]["reasoning"]["reasoning_tokens"] == 20
