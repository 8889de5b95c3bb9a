"""TGI /generate_stream: one token per event, details on the last, no [DONE], error events."""

from __future__ import annotations

import orjson

from bench_llm.adapters.base import get_adapter
from bench_llm.adapters.tgi import TGIAdapter
from bench_llm.loadgen.recorder import SOURCE_PROTOCOL
from tests.adapter_streams import SPEC, record, sse


def tok(i: int, text: str, special: bool = False, final: dict[str, object] | None = None) -> dict[str, object]:
    out: dict[str, object] = {
        "index": i,
        "token": {"id": 100 + i, "text": text, "logprob": -0.5, "special": special},
        "generated_text": None,
        "details": None,
    }
    if final is not None:
        out.update(final)
    return out


FINAL = {"generated_text": "Hello world", "details": {"finish_reason": "length", "generated_tokens": 3,
                                                      "seed": None, "input_length": 5}}  # fmt: skip
# axum framing: no space after "data:", keep-alive comments, no [DONE]
STREAM = (
    b": keep-alive\n\n"
    + sse(tok(1, "Hello"), tok(2, " wor"), done=False, space=False)
    + b":\n\n"
    + sse(tok(3, "ld", final=FINAL), done=False, space=False)
)


def test_one_token_per_event_no_done() -> None:
    r = record(TGIAdapter(), STREAM)
    assert r.ok, r.error_message
    assert r.chunk_tokens == [1, 1, 1] and r.token_source == SOURCE_PROTOCOL
    assert r.output_tokens == 3 == r.completion_tokens
    assert r.prompt_tokens == 5 and r.finish_reason == "length"
    assert r.output_text == "Hello world"


def test_any_split_point() -> None:
    for cut in range(1, len(STREAM), 5):
        r = record(TGIAdapter(), STREAM, split=[cut])
        assert r.ok and r.output_tokens == 3, cut


def test_end_of_sequence_token_counts_but_adds_no_text() -> None:
    final = {"generated_text": "Hi", "details": {"finish_reason": "eos_token", "generated_tokens": 2, "input_length": 5}}
    r = record(TGIAdapter(), sse(tok(1, "Hi"), tok(2, "</s>", special=True, final=final), done=False, space=False))
    assert r.ok and r.output_tokens == 2 == r.completion_tokens and r.output_text == "Hi"
    assert r.finish_reason == "eos_token"


def test_stream_ending_without_final_event_is_truncated() -> None:
    r = record(TGIAdapter(), sse(tok(1, "a"), tok(2, "b"), done=False, space=False))
    assert not r.ok and r.error_type == "truncated" and r.output_tokens == 2


def test_error_event() -> None:
    err = {"error": "Request failed during generation: Server error: CUDA out of memory", "error_type": "generation"}
    r = record(TGIAdapter(), sse(tok(1, "a"), err, done=False, space=False))
    assert not r.ok and r.error_type == "generation" and "out of memory" in (r.error_message or "")
    overloaded = {"error": "Model is overloaded", "error_type": "overloaded"}
    r = record(TGIAdapter(), sse(overloaded, done=False, space=False))
    assert not r.ok and r.error_type == "overloaded" and r.first_token_ns is None


def test_final_event_without_details() -> None:
    r = record(TGIAdapter(), sse(tok(1, "a", final={"generated_text": "a"}), done=False, space=False))
    assert r.ok and r.output_tokens == 1 and r.completion_tokens is None


def test_build_and_cannot_force_length() -> None:
    a = get_adapter("tgi", model="m")
    call = a.build(SPEC)
    body = orjson.loads(call.body)
    assert call.path == "/generate_stream"
    assert body["inputs"] == SPEC.prompt
    assert body["parameters"] == {"max_new_tokens": 8, "details": True}
    assert a.forces_output_length is False and a.requires_done is False
    d = a.describe()
    assert d["forces_output_length"] is False and "cannot force" in d["note"]
