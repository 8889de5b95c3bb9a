"""SSE framing, the OpenAI stream parser and the recorder's token accounting."""

from __future__ import annotations

import orjson
import pytest

from bench_llm.adapters.openai import OpenAIAdapter, OpenAIStreamParser
from bench_llm.adapters.sse import SSEFramer
from bench_llm.loadgen.recorder import (
    SOURCE_CHUNKS,
    SOURCE_CUMULATIVE,
    SOURCE_FINAL_SPREAD,
    RequestRecorder,
)
from bench_llm.workloads.spec import RequestSpec
from tests.conftest import shared_path

SPEC = RequestSpec("r1", input_tokens=5, max_output_tokens=4, prompt="a b c d e")


def test_framer_copes_with_any_split_point() -> None:
    stream = b'data: {"a":1}\n\ndata:{"b":2}\n\n: keep-alive\n\ndata: [DONE]\n\n'
    for cut in range(len(stream)):
        f = SSEFramer()
        out = f.feed(stream[:cut]) + f.feed(stream[cut:])
        assert out == [b'{"a":1}', b'{"b":2}', b"[DONE]"], cut
        assert f.pending == b""


def test_framer_crlf_and_multiline() -> None:
    f = SSEFramer()
    assert f.feed(b"data: x\r\ndata: y\r\n\r\n") == [b"x\ny"]


def _chunks(*objs: object) -> bytes:
    return b"".join(b"data: " + orjson.dumps(o) + b"\n\n" for o in objs) + b"data: [DONE]\n\n"


def _feed(recorder: RequestRecorder, data: bytes, t0: int = 1000) -> None:
    recorder.sent(t0)
    recorder.headers(t0 + 1, 200)
    # one payload per read, 10 ns apart
    for i, block in enumerate(data.split(b"\n\n")):
        if block:
            recorder.data(t0 + 10 * (i + 1), block + b"\n\n")


def test_role_frame_is_never_the_first_token() -> None:
    rec = RequestRecorder(SPEC, OpenAIStreamParser(chat=True), 0, 0)
    _feed(
        rec,
        _chunks(
            {"id": "x", "choices": [{"delta": {"role": "assistant", "content": ""}}], "usage": {"completion_tokens": 0}},
            {"id": "x", "choices": [{"delta": {"content": "hi"}}], "usage": {"completion_tokens": 2}},
            {"id": "x", "choices": [{"delta": {"content": " there"}, "finish_reason": "length"}], "usage": {"completion_tokens": 4}},
            {"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}},
        ),
    )
    r = rec.finish(2000)
    assert r.ok and r.token_source == SOURCE_CUMULATIVE
    assert r.chunk_tokens == [0, 2, 2, 0]
    assert r.first_token_ns == r.chunk_ns[1]
    assert (r.output_tokens, r.completion_tokens, r.prompt_tokens) == (4, 4, 5)
    assert r.finish_reason == "length" and r.server_request_id == "x"


def test_reasoning_gives_ttft_and_later_first_content() -> None:
    rec = RequestRecorder(SPEC, OpenAIStreamParser(chat=True), 0, 0)
    _feed(
        rec,
        _chunks(
            {"choices": [{"delta": {"reasoning_content": "hmm"}}], "usage": {"completion_tokens": 1}},
            {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}], "usage": {"completion_tokens": 2}},
        ),
    )
    r = rec.finish(2000)
    assert r.first_token_ns == r.chunk_ns[0] and r.first_content_ns == r.chunk_ns[1]


def test_final_usage_spread_when_no_per_chunk_usage() -> None:
    rec = RequestRecorder(SPEC, OpenAIStreamParser(chat=False), 0, 0)
    _feed(
        rec,
        _chunks(
            {"choices": [{"text": "a"}]},
            {"choices": [{"text": "bc"}]},
            {"choices": [{"text": "", "finish_reason": "length"}]},
            {"choices": [], "usage": {"completion_tokens": 5, "prompt_tokens": 3}},
        ),
    )
    r = rec.finish(2000)
    assert r.token_source == SOURCE_FINAL_SPREAD
    assert r.chunk_tokens == [3, 2, 0, 0] and r.output_tokens == 5


def test_chunk_count_when_no_usage_at_all() -> None:
    rec = RequestRecorder(SPEC, OpenAIStreamParser(chat=False), 0, 0)
    _feed(rec, _chunks({"choices": [{"text": "a"}]}, {"choices": [{"text": "b", "finish_reason": "stop"}]}))
    r = rec.finish(2000)
    assert r.token_source == SOURCE_CHUNKS and r.chunk_tokens == [1, 1]


@pytest.mark.parametrize(
    ("body", "error_type"),
    [
        (b'data: {"choices": [{"text": "a"}]}\n\n', "no_done"),
        (b'data: {"choices": [{"text": "a"}]}\n\ndata: {not json\n\ndata: [DONE]\n\n', "malformed_chunk"),
        (b'data: {"error": {"message": "boom", "type": "InternalError"}}\n\ndata: [DONE]\n\n', "InternalError"),
        (b'data: {"choices": [{"text": "a"}]}\n\ndata: {"choi', "no_done"),
    ],
)
def test_broken_streams_are_failures(body: bytes, error_type: str) -> None:
    rec = RequestRecorder(SPEC, OpenAIStreamParser(chat=False), 0, 0)
    rec.sent(1)
    rec.headers(2, 200)
    rec.data(3, body)
    r = rec.finish(10)
    assert not r.ok and r.error_type == error_type


def test_http_error_keeps_status_and_body() -> None:
    rec = RequestRecorder(SPEC, OpenAIStreamParser(chat=False), 0, 0)
    rec.sent(1)
    rec.headers(2, 503)
    rec.data(3, b'{"message": "overloaded"}')
    r = rec.finish(10)
    # 503 is an admission rejection (vLLM past --max-num-queued-reqs): its own type (core/rejections.py)
    assert not r.ok and r.error_type == "http_503" and r.http_status == 503 and "overloaded" in (r.error_message or "")
    rec = RequestRecorder(SPEC, OpenAIStreamParser(chat=False), 0, 0)
    rec.sent(1)
    rec.headers(2, 404)
    rec.data(3, b'{"message": "no such model"}')
    r = rec.finish(10)
    assert r.error_type == "http_error" and r.http_status == 404
    rec = RequestRecorder(SPEC, OpenAIStreamParser(chat=False), 0, 0)
    rec.sent(1)
    rec.headers(2, 429)  # TGI's non-streaming answer past --max-concurrent-requests; a router's full queue
    rec.data(3, b'{"error": "Model is overloaded", "error_type": "overloaded"}')
    assert rec.finish(10).error_type == "http_429"


def test_request_body_asks_for_exact_lengths_and_usage() -> None:
    a = OpenAIAdapter(model="m", api="chat")
    body = orjson.loads(a.build(SPEC).body)
    assert body["stream"] is True and body["ignore_eos"] is True and body["min_tokens"] == 4
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["messages"] == [{"role": "user", "content": "a b c d e"}]
    assert a.path == "/v1/chat/completions"


def test_api_key_goes_to_header_not_description() -> None:
    a = OpenAIAdapter(model="m", api_key="sk-secret")
    assert ("Authorization", "Bearer sk-secret") in a.build(SPEC).headers
    assert "sk-secret" not in repr(a.describe())


@pytest.mark.parametrize(
    ("name", "chat", "source"),
    [
        ("vllm_completions_stream.sse", False, SOURCE_CUMULATIVE),
        ("vllm_chat_stream.sse", True, SOURCE_CUMULATIVE),
        ("vllm_completions_stream_usage_only.sse", False, SOURCE_FINAL_SPREAD),
    ],
)
def test_recorded_vllm_streams(name: str, chat: bool, source: str) -> None:
    data = shared_path("transcripts", name).read_bytes()
    rec = RequestRecorder(SPEC, OpenAIStreamParser(chat=chat), 0, 0)
    rec.sent(1)
    rec.headers(2, 200)
    for i in range(0, len(data), 37):  # arbitrary read boundaries
        rec.data(10 + i, data[i : i + 37])
    r = rec.finish(10**9)
    assert r.ok, r.error_message
    assert r.token_source == source
    assert r.completion_tokens is not None and r.output_tokens == r.completion_tokens
    assert r.first_token_ns is not None
    assert all(t >= 0 for t in r.chunk_tokens)
    if chat:
        assert r.chunk_tokens[0] == 0  # the role-only opening frame carries no token
