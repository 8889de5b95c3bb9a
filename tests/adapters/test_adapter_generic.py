"""Generic OpenAI servers (llama.cpp, transformers serve, llama-cpp-python): recorded streams."""

from __future__ import annotations

import orjson
import pytest

from bench_llm.adapters.base import get_adapter
from bench_llm.adapters.generic import GenericOpenAIAdapter
from bench_llm.loadgen.recorder import SOURCE_CHUNKS, SOURCE_FINAL_SPREAD
from tests.adapter_streams import SPEC, record, sse
from tests.conftest import shared_path


def _transcript(name: str) -> bytes:
    return shared_path("transcripts", name).read_bytes()


@pytest.mark.parametrize(
    "name, api, completion",
    [
        ("llama_server_completions_stream.sse", "completions", 5),
        ("llama_server_chat_stream.sse", "chat", 4),
        ("tfserve_completions_stream.sse", "completions", 6),
        ("tfserve_chat_stream.sse", "chat", 6),
        ("tfserve_cb_chat_stream_no_usage_requested.sse", "chat", 4),
    ],
)
def test_final_usage_is_spread_and_counts_match(name: str, api: str, completion: int) -> None:
    r = record(GenericOpenAIAdapter(api=api), _transcript(name))  # type: ignore[arg-type]
    assert r.ok, r.error_message
    assert r.completion_tokens == completion
    assert r.output_tokens == completion and sum(r.chunk_tokens) == completion
    assert r.token_source == SOURCE_FINAL_SPREAD  # approximate, and said so
    assert r.first_token_ns is not None and r.first_content_ns == r.first_token_ns
    assert r.finish_reason == "length"


@pytest.mark.parametrize("name, api", [("llcpp_py_completions_stream.sse", "completions"), ("llcpp_py_chat_stream.sse", "chat")])
def test_no_usage_at_all_counts_chunks(name: str, api: str) -> None:
    r = record(GenericOpenAIAdapter(api=api), _transcript(name))  # type: ignore[arg-type]
    assert r.ok and r.completion_tokens is None
    assert r.token_source == SOURCE_CHUNKS
    assert r.output_tokens == sum(1 for n in r.chunk_tokens if n) > 0
    # the role frame and the empty "" chunk carry no token
    assert r.chunk_tokens.count(0) >= 1


def test_vllm_usage_only_stream_through_generic() -> None:
    r = record(GenericOpenAIAdapter(), _transcript("vllm_completions_stream_usage_only.sse"))
    assert r.ok and r.output_tokens == 3 == r.completion_tokens and r.token_source == SOURCE_FINAL_SPREAD


def test_missing_done_is_fine_when_finished_but_not_when_cut() -> None:
    done = {"id": "x", "choices": [{"text": "a", "finish_reason": "stop"}]}
    r = record(GenericOpenAIAdapter(), sse({"id": "x", "choices": [{"text": "b"}]}, done, done=False))
    assert r.ok and r.finish_reason == "stop"
    r = record(GenericOpenAIAdapter(), sse({"id": "x", "choices": [{"text": "b"}]}, done=False))
    assert not r.ok and r.error_type == "truncated"


def test_sends_no_vllm_only_fields() -> None:
    body = orjson.loads(get_adapter("generic", model="m").build(SPEC).body)
    assert "ignore_eos" not in body and "min_tokens" not in body
    assert body["stream_options"] == {"include_usage": True}
    body = orjson.loads(GenericOpenAIAdapter(usage=False).build(SPEC).body)
    assert "stream_options" not in body
    d = GenericOpenAIAdapter().describe()
    assert "approximate" in d["token_counts"] and d["forces_output_length"] is False
