"""vLLM OpenAI streams: recorded transcripts and reasoning edge cases."""

from __future__ import annotations

import orjson
import pytest

from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.loadgen.recorder import SOURCE_CUMULATIVE, SOURCE_FINAL_SPREAD
from tests.adapter_streams import record, sse
from tests.conftest import shared_path


@pytest.mark.parametrize("name, api, n", [("vllm_completions_stream.sse", "completions", 8), ("vllm_chat_stream.sse", "chat", 6)])
def test_recorded_streams_exact_counts(name: str, api: str, n: int) -> None:
    r = record(OpenAIAdapter(api=api), shared_path("transcripts", name).read_bytes())  # type: ignore[arg-type]
    assert r.ok, r.error_message
    assert r.token_source == SOURCE_CUMULATIVE
    assert r.output_tokens == n == r.completion_tokens
    assert r.server_request_id and r.server_request_id.startswith(("cmpl-", "chatcmpl-"))
    # the chat role frame is never the first token
    assert r.chunk_tokens[r.chunk_ns.index(r.first_token_ns)] > 0


def test_usage_only_stream_spreads_final_usage() -> None:
    r = record(OpenAIAdapter(), shared_path("transcripts", "vllm_completions_stream_usage_only.sse").read_bytes())
    assert r.ok and r.token_source == SOURCE_FINAL_SPREAD and r.output_tokens == 3


def _chunk(delta: dict[str, object], n: int, finish: str | None = None) -> dict[str, object]:
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            "usage": {"prompt_tokens": 4, "completion_tokens": n}}  # fmt: skip


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_then_content_gives_ttft_and_ttfo(field: str) -> None:
    stream = sse(
        _chunk({"role": "assistant", "content": ""}, 0),
        _chunk({field: "let me"}, 2),
        _chunk({field: " think"}, 3),
        _chunk({"content": "Yes"}, 4),
        _chunk({"content": "."}, 5, "stop"),
        {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 5,
                                                      "prompt_tokens_details": {"cached_tokens": 2}}},  # fmt: skip
    )
    r = record(OpenAIAdapter(api="chat"), stream)
    assert r.ok and r.chunk_tokens == [0, 2, 1, 1, 1, 0]
    assert r.first_token_ns == r.chunk_ns[1] and r.first_content_ns == r.chunk_ns[3]
    assert r.output_text == "Yes." and r.cached_tokens == 2


def test_reasoning_only_answer_has_no_first_content() -> None:
    r = record(OpenAIAdapter(api="chat"), sse(_chunk({"reasoning_content": "hm"}, 1, "length")))
    assert r.ok and r.first_token_ns is not None and r.first_content_ns is None


def test_error_then_done() -> None:
    err = {"error": {"object": "error", "message": "context too long", "type": "BadRequestError", "code": 400}}
    r = record(OpenAIAdapter(), sse({"id": "c", "choices": [{"text": "a"}], "usage": {"completion_tokens": 1}}, err))
    assert not r.ok and r.error_type == "BadRequestError" and r.output_tokens == 1


def test_request_body_asks_for_exact_counts() -> None:
    from tests.adapter_streams import SPEC

    body = orjson.loads(OpenAIAdapter(model="tiny").build(SPEC).body)
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["ignore_eos"] is True and body["min_tokens"] == body["max_tokens"] == 8
