"""n > 1 (several sequences per request) on vLLM's OpenAI server: token accounting on both
read paths, and the body bench asks for (issue 24)."""

from __future__ import annotations

import orjson
import pytest

from bench_llm.adapters.openai import OpenAIAdapter, OpenAIStreamParser
from bench_llm.loadgen.recorder import SOURCE_CUMULATIVE, SOURCE_FINAL_SPREAD, RequestRecorder
from bench_llm.workloads.spec import RequestSpec, Sampling

SPEC = RequestSpec("r1", input_tokens=4, max_output_tokens=4, prompt="a b c d")
U = {"prompt_tokens": 4}


def _completions(continuous: bool, last_finish: str = "length") -> list[dict[str, object]]:
    """vLLM 0.32 (CPU), /v1/completions, n=2, max_tokens 4, continuous_usage_stats: each
    choice's chunk carries that choice's own cumulative count, the choices interleave, choice
    0 ends first and the final usage chunk carries the total. Recorded (the texts of the
    middle chunks were abridged in the note and are filled in here)."""
    rows: list[tuple[int, str, str | None, int]] = [
        (0, " for", None, 1), (1, " x", None, 1), (0, "ized", None, 2), (1, " y", None, 2),
        (0, " z", None, 3), (1, " w", None, 3), (0, "ized", "length", 4), (1, "", last_finish, 4),
    ]
    out: list[dict[str, object]] = []
    for index, text, finish, count in rows:
        chunk: dict[str, object] = {"id": "cmpl-1", "object": "text_completion",
                                    "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish}]}
        if continuous:
            chunk["usage"] = {**U, "total_tokens": 4 + count, "completion_tokens": count}
        out.append(chunk)
    out.append({"id": "cmpl-1", "object": "text_completion", "choices": [],
                "usage": {"prompt_tokens": 4, "total_tokens": 12, "completion_tokens": 8}})
    return out


def _chat(continuous: bool) -> list[dict[str, object]]:
    """The same in chat: first a role delta per choice (completion_tokens 0)."""
    out: list[dict[str, object]] = []
    for index in (0, 1):
        role: dict[str, object] = {"id": "chat-1", "choices": [
            {"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        if continuous:
            role["usage"] = {**U, "total_tokens": 4, "completion_tokens": 0}
        out.append(role)
    for c in _completions(continuous):
        choices = c["choices"]
        assert isinstance(choices, list)
        chunk = dict(c, id="chat-1", object="chat.completion.chunk")
        chunk["choices"] = [{"index": ch["index"], "delta": {"content": ch["text"]}, "finish_reason": ch["finish_reason"]}
                            for ch in choices]
        out.append(chunk)
    return out


def _body(chunks: list[dict[str, object]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(o) + b"\n\n" for o in chunks) + b"data: [DONE]\n\n"


def _record(chat: bool, chunks: list[dict[str, object]]):  # type: ignore[no-untyped-def]
    rec = RequestRecorder(SPEC, OpenAIStreamParser(chat), 0, 0)
    rec.sent(1000)
    rec.headers(1001, 200)
    for i, block in enumerate(_body(chunks).split(b"\n\n")):
        if block:
            rec.data(1000 + 10 * (i + 1), block + b"\n\n")
    return rec.finish(5000)


@pytest.mark.parametrize("chat", [False, True])
def test_recorded_n2_stream_with_per_choice_counts_sums_the_choices(chat: bool) -> None:
    r = _record(chat, _chat(True) if chat else _completions(True))
    assert r.ok and r.token_source == SOURCE_CUMULATIVE
    # exact per chunk: each chunk is one token of one choice; the role and usage frames none
    tokens = [n for n in r.chunk_tokens]
    assert tokens == ([0, 0] if chat else []) + [1] * 8 + [0]
    assert r.output_tokens == r.completion_tokens == 8  # today: 4 (choice 0's count read as the request's)
    assert r.finish_reason == "length"


def test_the_request_ends_with_its_last_choice_not_its_first() -> None:
    r = _record(False, _completions(True, last_finish="stop"))
    assert r.finish_reason == "stop"  # choice 0 ended with "length" before choice 1 did


def test_a_single_choice_stream_is_unchanged() -> None:
    p = OpenAIStreamParser(chat=False)
    ev = p.parse(b'{"choices":[{"index":0,"text":"a"}],"usage":{"completion_tokens":3}}')
    assert ev is not None and ev.cumulative == 3
    ev = p.parse(b'{"choices":[{"index":0,"text":"b"}],"usage":{"completion_tokens":5}}')
    assert ev is not None and ev.cumulative == 5


def test_n_above_1_asks_the_final_usage_only() -> None:
    a = OpenAIAdapter(api="completions")
    two = RequestSpec("r", 4, 4, prompt="x", sampling=Sampling(n=2))
    one = RequestSpec("r", 4, 4, prompt="x", sampling=Sampling(n=1))
    assert a.body(two)["stream_options"] == {"include_usage": True} and a.body(two)["n"] == 2
    assert a.body(one)["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert a.body(SPEC)["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    # n given through the extra body is seen too; a stream_options of the user's own is kept
    assert OpenAIAdapter(extra_body={"n": 3}).body(SPEC)["stream_options"] == {"include_usage": True}
    mine = {"include_usage": True, "continuous_usage_stats": True}
    assert OpenAIAdapter(extra_body={"n": 3, "stream_options": mine}).body(SPEC)["stream_options"] == mine


def _http(body: bytes) -> list[bytes]:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    return [head] + [b"%x\r\n%b\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]


@pytest.mark.parametrize("chat", [False, True])
def test_the_shape_bench_asks_for_n2_gives_the_total_on_both_read_paths(chat: bool) -> None:
    """include_usage only (what bench asks with n > 1): the final total, spread over the text
    chunks, on the Python path and on the compiled one (which does not read choice indexes)."""
    pytest.importorskip("bench_llm.loadgen._fastpath", reason="the compiled read path is not built here")
    from tests.loadgen.test_fastpath import _run

    pieces = _http(_body(_chat(False) if chat else _completions(False)))
    records = [_run(pieces, compiled=c, chat=chat, close_at_end=True)[0] for c in (False, True)]
    for r in records:
        assert r.ok and r.token_source == SOURCE_FINAL_SPREAD
        assert r.output_tokens == r.completion_tokens == 8
        assert r.finish_reason == "length"
    assert records[0].chunk_tokens == records[1].chunk_tokens
