"""Structured output, embeddings and model (LoRA) mixes (issue 24): the body each engine gets,
what is refused by name, and each kind end to end against the simulated engine."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench_llm.adapters.base import check_requests
from bench_llm.adapters.generic import GenericOpenAIAdapter
from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.adapters.sglang import SGLangAdapter, SGLangOpenAIAdapter
from bench_llm.adapters.tgi import TGIAdapter
from bench_llm.analysis.format import format_summary
from bench_llm.analysis.load import load_run
from bench_llm.analysis.summary import summarize
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.server import ServerConfig
from bench_llm.sim.timing import FixedTiming
from bench_llm.workloads.definition import load_workload_file
from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.spec import Constraint, RequestOptions, RequestSpec
from tests.conftest import bench_argv
from tests.sim_helpers import run_against, schedule

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age"], "additionalProperties": False}
JSON_C = Constraint(json_schema=json.dumps(SCHEMA))
FAST = FixedTiming(0.004, 0.001)


def _spec(**kw: Any) -> RequestSpec:
    return RequestSpec("r0", 4, 16, prompt="a b c d", fixed_output=False, **kw)


def _body(adapter: object, spec: RequestSpec) -> dict[str, Any]:
    return orjson.loads(adapter.build(spec).body)  # type: ignore[attr-defined,no-any-return]


# -- structured output -------------------------------------------------------------------------
def test_each_engine_gets_its_own_structured_output_fields() -> None:
    regex, choice = Constraint(regex=r"\d{3}"), Constraint(choice=("yes", "no"))
    assert _body(OpenAIAdapter(), _spec(constraint=JSON_C))["structured_outputs"] == {"json": SCHEMA}
    assert _body(OpenAIAdapter(api="chat"), _spec(constraint=regex))["structured_outputs"] == {"regex": r"\d{3}"}
    assert _body(OpenAIAdapter(), _spec(constraint=choice))["structured_outputs"] == {"choice": ["yes", "no"]}
    sg = _body(SGLangAdapter(), _spec(constraint=JSON_C))["sampling_params"]
    assert json.loads(sg["json_schema"]) == SCHEMA
    assert _body(SGLangAdapter(), _spec(constraint=choice))["sampling_params"]["regex"] == "(yes|no)"
    so = _body(SGLangOpenAIAdapter(api="chat"), _spec(constraint=JSON_C))
    assert so["response_format"] == {"type": "json_schema", "json_schema": {"name": "bench", "schema": SCHEMA}}
    assert _body(SGLangOpenAIAdapter(), _spec(constraint=regex))["regex"] == r"\d{3}"
    assert _body(TGIAdapter(), _spec(constraint=JSON_C))["parameters"]["grammar"] == {"type": "json", "value": SCHEMA}
    assert _body(TGIAdapter(), _spec(constraint=regex))["parameters"]["grammar"] == {"type": "regex", "value": r"\d{3}"}
    # a generic OpenAI-compatible server: a JSON schema (the standard), a regex refused by name
    assert "response_format" in _body(GenericOpenAIAdapter(api="chat"), _spec(constraint=JSON_C))
    with pytest.raises(ValueError, match=r"^generic: .*JSON schema only.*regex"):
        check_requests(GenericOpenAIAdapter(), [_spec(), _spec(constraint=regex)])


def test_a_constraint_implies_a_natural_stop_and_one_constraint_at_most() -> None:
    sched = schedule(2).with_request(RequestOptions(regex=r"\d+"))
    assert all(s.constraint == Constraint(regex=r"\d+") and not s.fixed_output for s in sched.requests)
    assert sched.request.describe()["forced_length"] is False
    with pytest.raises(ValueError, match="exactly one of json_schema, regex, choice"):
        RequestOptions(regex="a", choice=("b",))
    with pytest.raises(ValueError, match="regex '\\(': "):
        RequestOptions(regex="(")
    # the command line's constraint replaces the file's whole (never two at once)
    merged = RequestOptions(regex="x").over(RequestOptions(json_schema=SCHEMA))
    assert merged.constraint() == Constraint(regex="x")
    # applied twice (a workload file's options, then the command line's over them): the latter win
    twice = schedule(2).with_request(RequestOptions(json_schema=SCHEMA)).with_request(merged)
    assert all(s.constraint == Constraint(regex="x") for s in twice.requests)


@pytest.mark.parametrize(
    ("flavor", "adapter", "options"),
    [("vllm", OpenAIAdapter(model="m", api="chat"), RequestOptions(json_schema=SCHEMA)),
     ("vllm", OpenAIAdapter(model="m"), RequestOptions(choice=("alpha", "beta"), stream=False)),
     ("sglang", SGLangAdapter(model="m"), RequestOptions(regex=r"[A-Z]{2}-\d{4}")),
     ("tgi", TGIAdapter(model="m"), RequestOptions(json_schema=SCHEMA))],
)
def test_structured_answers_conform_on_every_engine(tmp_path: Path, flavor: str, adapter: object,
                                                    options: RequestOptions) -> None:
    # natural stops on: they never cut a structured answer (its end is the structure's)
    c = ServerConfig(model="m", flavor=flavor, timing=FAST, natural_stop_mean=2.0)
    rows = run_against(c, schedule(6, output_tokens=64, concurrency=3).with_request(options), tmp_path, adapter)
    assert all(r["ok"] and r["structured_ok"] is True for r in rows), [(r["error_message"], r["output_tokens"]) for r in rows]
    # the structure ends the answer before max_tokens: a natural stop
    assert all(r["output_tokens"] < 64 and r["finish_reason"] in ("stop", "eos_token") for r in rows)
    s = summarize(load_run(tmp_path / "run").requests)
    assert s.kinds["structured"] == {"requests": 6, "conforming": 6, "share": 1.0}
    assert "structured output: 6/6 answers conform (100.0%" in format_summary(s)


def test_an_answer_cut_at_max_tokens_does_not_conform(tmp_path: Path) -> None:
    # the schema's smallest instance needs ~13 tokens: with 5 the JSON is cut, so it does not parse
    c = ServerConfig(model="m", flavor="vllm", timing=FAST)
    options = RequestOptions(json_schema=SCHEMA)
    sched = schedule(4, output_tokens=64, concurrency=2).with_request(options)
    short = {s.request_id for s in sched.requests[:2]}
    sched = dataclasses.replace(sched, requests=tuple(
        dataclasses.replace(s, max_output_tokens=5) if s.request_id in short else s for s in sched.requests))
    rows = run_against(c, sched, tmp_path, OpenAIAdapter(model="m", api="chat"))
    assert {r["request_id"]: r["structured_ok"] for r in rows} == {s.request_id: s.request_id not in short
                                                                   for s in sched.requests}
    assert all(r["finish_reason"] == "length" for r in rows if r["request_id"] in short)
    s = summarize(load_run(tmp_path / "run").requests)
    assert s.kinds["structured"] == {"requests": 4, "conforming": 2, "share": 0.5}
    from bench_llm.analysis.report import build_report

    build_report(tmp_path / "run", tmp_path / "report.html")
    assert "structured output</td><td>2/4 answers conform" in (tmp_path / "report.html").read_text().replace("\n", "")


def test_no_kind_lines_for_plain_text(tmp_path: Path) -> None:
    run_against(ServerConfig(model="m", timing=FAST), schedule(2), tmp_path, OpenAIAdapter(model="m"))
    s = summarize(load_run(tmp_path / "run").requests)
    text = format_summary(s)
    assert s.kinds is None and "structured output" not in text and "embeddings" not in text


# -- embeddings --------------------------------------------------------------------------------
def test_embeddings_bodies_and_refusals() -> None:
    spec = _spec(kind="embeddings", batch=3, stream=False)
    call = OpenAIAdapter(model="e5").build(spec)
    assert call.path == "/v1/embeddings"
    assert orjson.loads(call.body) == {"model": "e5", "input": ["a b c d", "1 a b c d", "2 a b c d"]}
    assert SGLangOpenAIAdapter().build(spec).path == "/v1/embeddings"
    with pytest.raises(ValueError, match=r"^sglang \(native /generate\): no embeddings route; use --engine sglang-openai"):
        check_requests(SGLangAdapter(), [spec])
    with pytest.raises(ValueError, match=r"^tgi: no embeddings route; TEI"):
        check_requests(TGIAdapter(), [spec])
    with pytest.raises(ValueError, match="set kind"):
        RequestOptions(batch=(2,))


@pytest.mark.parametrize("loop", ["closed", "open"])
def test_embeddings_end_to_end_at_batch_sizes(tmp_path: Path, loop: str) -> None:
    c = ServerConfig(model="m", flavor="vllm", model_timing=ModelTiming("llama-3.1-8b", "h100"))
    c = dataclasses.replace(c, model="m")
    base = schedule(12, input_tokens=64, concurrency=3) if loop == "closed" else schedule(12, input_tokens=64, rate=50.0)
    sched = base.with_request(RequestOptions(kind="embeddings", batch=(1, 8)))
    assert {s.batch for s in sched.requests} == {1, 8} and not any(s.stream for s in sched.requests)
    rows = run_against(c, sched, tmp_path, OpenAIAdapter(model="m"))
    assert all(r["ok"] for r in rows), [r["error_message"] for r in rows]
    for r in rows:
        assert r["kind"] == "embeddings" and r["first_token_ns"] is None and r["output_tokens"] == 0
        assert r["prompt_tokens"] >= 64 * r["inputs"]  # every input is prefilled
    s = summarize(load_run(tmp_path / "run").requests)
    emb = s.kinds["embeddings"]
    assert emb["requests"] == 12 and emb["inputs"] == sum(r["inputs"] for r in rows)
    assert set(emb["by_batch"]) == {1, 8} and emb["inputs_per_s"] > emb["requests_per_s"] > 0
    assert s.latency["ttft_ms"]["n"] == 0
    assert "embeddings: 12 requests" in format_summary(s)


# -- many models / LoRA adapters ----------------------------------------------------------------
def test_a_model_mix_is_drawn_per_request_the_same_for_the_same_seed() -> None:
    options = RequestOptions(models={"base": 2.0, "lora-a": 1.0, "lora-b": 1.0})
    one = [s.model for s in schedule(200, seed=3).with_request(options).requests]
    assert one == [s.model for s in schedule(200, seed=3).with_request(options).requests]
    counts = {m: one.count(m) for m in set(one)}
    assert set(counts) == {"base", "lora-a", "lora-b"} and 70 < counts["base"] < 130
    spec = _spec(model="lora-a")
    assert _body(OpenAIAdapter(model="base"), spec)["model"] == "lora-a"
    assert _body(SGLangAdapter(model="base"), spec)["lora_path"] == "lora-a"
    assert _body(TGIAdapter(model="base"), spec)["parameters"]["adapter_id"] == "lora-a"
    assert "lora_path" not in _body(SGLangAdapter(model="base"), _spec(model="base"))


def test_adapter_swaps_cost_ttft_and_the_summary_splits_by_model(tmp_path: Path) -> None:
    options = RequestOptions(models={"a": 1.0, "b": 1.0})
    sched = schedule(16, output_tokens=4, concurrency=1).with_request(options)
    ttft: dict[float, float] = {}
    for swap_ms in (0.0, 60.0):
        c = ServerConfig(model="m", flavor="vllm", timing=FAST, lora_adapters=("a", "b"), max_loras=1,
                         lora_swap_ms=swap_ms)
        run_against(c, sched, tmp_path / str(swap_ms), OpenAIAdapter(model="m"))
        s = summarize(load_run(tmp_path / str(swap_ms) / "run").requests)
        assert set(s.kinds["models"]) == {"a", "b"}
        assert sum(m["ok"] for m in s.kinds["models"].values()) == 16
        ttft[swap_ms] = s.latency["ttft_ms"]["mean"]
    # one resident adapter, two alternating at random: about half the requests wait a 60 ms load
    assert ttft[60.0] - ttft[0.0] > 15.0, ttft
    assert "model a: " in format_summary(s) and "model b: " in format_summary(s)


# -- the command line and workload files --------------------------------------------------------
def test_workload_file_request_table_kinds(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text('[lengths]\ninput = { kind = "fixed", value = 8 }\noutput = { kind = "fixed", value = 8 }\n'
                    '[request]\nkind = "embeddings"\nbatch = [2, 4]\nmodels = { base = 1.0, lora = 3.0 }\n')
    req = load_workload_file(path).request
    assert req.kind == "embeddings" and req.batch == (2, 4) and req.models == {"base": 1.0, "lora": 3.0}
    path.write_text('[lengths]\ninput = { kind = "fixed", value = 8 }\noutput = { kind = "fixed", value = 8 }\n'
                    '[request]\njson_schema = { type = "object", properties = { x = { type = "integer" } } }\n')
    assert load_workload_file(path).request.constraint() == Constraint(json_schema='{"properties":{"x":{"type":"integer"}},"type":"object"}')
    path.write_text('[lengths]\ninput = { kind = "fixed", value = 8 }\noutput = { kind = "fixed", value = 8 }\n'
                    '[request]\nregex = "a"\nchoice = ["b"]\n')
    with pytest.raises(WorkloadError, match="exactly one of"):
        load_workload_file(path)


def _run(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(bench_argv("run", "--concurrency", "2", "--requests", "6", "--input-tokens", "8",
                                     "--sim-ttft-ms", "3", "--sim-itl-ms", "1", "--out", str(tmp_path / name),
                                     "--json", "--no-progress", *args), capture_output=True, text=True, timeout=120)


def test_bench_run_structured_embeddings_and_model_mix_end_to_end(tmp_path: Path) -> None:
    p = _run(tmp_path, "json", "--api", "chat", "--output-tokens", "64", "--json-schema", json.dumps(SCHEMA))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["kinds"]["structured"]["share"] == 1.0
    p = _run(tmp_path, "emb", "--embeddings", "1,4", "--output-tokens", "1")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["kinds"]["embeddings"]["requests"] == 6
    p = _run(tmp_path, "mix", "--output-tokens", "4", "--model-mix", "sim-model=1,lora-x=1", "--sim-lora-swap-ms", "5")
    assert p.returncode == 0, p.stderr
    assert set(json.loads(p.stdout)["kinds"]["models"]) <= {"sim-model", "lora-x"}
    bad = _run(tmp_path, "bad", "--engine", "tgi", "--embeddings", "2")
    assert bad.returncode != 0 and "tgi: no embeddings route" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    virtual = _run(tmp_path, "virtual", "--launch", "--engine", "sim", "--model", "llama-3.1-8b", "--regex", "a+")
    assert virtual.returncode != 0 and "virtual time models plain text generation; structured output" in virtual.stderr


# -- tool calls -----------------------------------------------------------------------------------
def test_tool_definitions_in_chat_bodies_and_refusals() -> None:
    spec = _spec(tools=2, tool_choice="tool_1")
    body = _body(OpenAIAdapter(api="chat"), spec)
    assert [t["function"]["name"] for t in body["tools"]] == ["tool_0", "tool_1"]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "tool_1"}}
    assert _body(OpenAIAdapter(api="chat"), _spec(tools=1, tool_choice="required"))["tool_choice"] == "required"
    with pytest.raises(ValueError, match=r"^openai: tools are sent with chat requests: use --api chat"):
        check_requests(OpenAIAdapter(), [spec])
    with pytest.raises(ValueError, match=r"^sglang \(native /generate\): no tool definitions"):
        check_requests(SGLangAdapter(), [spec])
    with pytest.raises(ValueError, match=r"^tgi \(/generate_stream\): no tool definitions"):
        check_requests(TGIAdapter(), [spec])
    with pytest.raises(ValueError, match="tool_choice needs tools"):
        RequestOptions(tool_choice="auto")


@pytest.mark.parametrize("stream", [True, False])
def test_tool_calls_end_to_end(tmp_path: Path, stream: bool) -> None:
    c = ServerConfig(model="m", flavor="vllm", timing=FAST)
    sched = schedule(6, output_tokens=64, concurrency=3).with_request(RequestOptions(tools=3, stream=stream))
    rows = run_against(c, sched, tmp_path, OpenAIAdapter(model="m", api="chat"))
    assert all(r["ok"] for r in rows), [r["error_message"] for r in rows]
    for r in rows:
        assert r["tool_calls"] == 1 and r["finish_reason"] == "tool_calls" and r["output_tokens"] > 1
        # the arguments' deltas are output: the first of them is the first token
        assert (r["first_tool_call_ns"] == r["first_token_ns"]) if stream else r["first_tool_call_ns"] is None
    s = summarize(load_run(tmp_path / "run").requests)
    assert {k: s.kinds["tools"][k] for k in ("requests", "calling", "tool_calls")} == {
        "requests": 6, "calling": 6, "tool_calls": 6}
    assert "tool calls: 6/6 requests with tools called one" in format_summary(s)
    # tool_choice "none": the tools are sent, no call is made
    none = schedule(2, output_tokens=8).with_request(RequestOptions(tools=3, tool_choice="none"))
    rows = run_against(c, none, tmp_path / "none", OpenAIAdapter(model="m", api="chat"))
    assert all(r["ok"] and r["tool_calls"] == 0 and r["first_tool_call_ns"] is None for r in rows)


# -- images in chat -------------------------------------------------------------------------------
def test_images_are_local_pngs_in_content_parts_and_refused_where_unsupported() -> None:
    import base64
    import struct
    import zlib

    spec = _spec(images=((64, 32), (16, 16)))
    body = _body(OpenAIAdapter(api="chat"), spec)
    parts = body["messages"][-1]["content"]
    assert parts[0] == {"type": "text", "text": "a b c d"} and [p["type"] for p in parts[1:]] == ["image_url"] * 2
    raw = base64.b64decode(parts[1]["image_url"]["url"].split(",", 1)[1])
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", raw[16:24]) == (64, 32)
    idat_len = struct.unpack(">I", raw[33:37])[0]
    assert len(zlib.decompress(raw[41:41 + idat_len])) == 32 * (1 + 3 * 64)  # one filter byte per row, RGB
    assert len(_body(SGLangAdapter(), spec)["image_data"]) == 2
    with pytest.raises(ValueError, match=r"^openai: images are sent in chat messages"):
        check_requests(OpenAIAdapter(), [spec])
    with pytest.raises(ValueError, match=r"^tgi \(/generate_stream\): no images"):
        check_requests(TGIAdapter(), [spec])
    with pytest.raises(ValueError, match="image_size must be WIDTHxHEIGHT"):
        RequestOptions(images=1, image_size="big")


def test_images_end_to_end_charge_their_prefill(tmp_path: Path) -> None:
    c = ServerConfig(model="m", flavor="vllm", model_timing=ModelTiming("llama-3.1-8b", "h100"))
    c = dataclasses.replace(c, model="m")
    base = schedule(6, input_tokens=32, output_tokens=4, concurrency=1)
    ttft = {}
    for n in (0, 2):
        sched = base.with_request(RequestOptions(images=n, image_size="1024x1024"))
        rows = run_against(c, sched, tmp_path / str(n), OpenAIAdapter(model="m", api="chat"))
        assert all(r["ok"] for r in rows), [r["error_message"] for r in rows]
        if n:  # 1024/28 -> 37 tokens a side: 1,369 per image, in the server's prompt count
            assert all(r["prompt_tokens"] == 32 + 2 * 37 * 37 and r["images"] == 2 for r in rows)
        s = summarize(load_run(tmp_path / str(n) / "run").requests)
        ttft[n] = s.latency["ttft_ms"]["p50"]
    assert s.kinds["images"]["images"] == 12 and round(s.kinds["images"]["image_tokens_per_image"]) == 1369
    assert "images: 6 requests carried 12 images" in format_summary(s)
    assert s.tokens.prompt.compared == 0  # image requests are not held to the requested text length
    assert ttft[2] > ttft[0], ttft  # 2,738 more prompt tokens to prefill


def test_the_new_request_fields_survive_the_distributed_wire() -> None:
    import msgpack

    from bench_llm.bench.distributed.wire import spec_from_wire, spec_to_wire

    spec = _spec(constraint=Constraint(choice=("a", "b")), images=((8, 8),), model="lora-a", tools=2,
                 tool_choice="auto")
    assert spec_from_wire(msgpack.unpackb(msgpack.packb(spec_to_wire(spec)))) == spec
    emb = _spec(kind="embeddings", batch=4, stream=False, constraint=JSON_C)
    assert spec_from_wire(msgpack.unpackb(msgpack.packb(spec_to_wire(emb)))) == emb
