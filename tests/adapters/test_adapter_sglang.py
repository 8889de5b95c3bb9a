"""SGLang native /generate: cumulative text and completion_tokens → exact per-event deltas."""

from __future__ import annotations

import orjson
import pytest

from bench_llm.adapters.base import EventKind, get_adapter
from bench_llm.adapters.sglang import SGLangAdapter, SGLangStreamParser
from bench_llm.loadgen.recorder import SOURCE_CUMULATIVE
from bench_llm.workloads.spec import Message, RequestSpec
from tests.adapter_streams import SPEC, record, sse


def ev(text: str, n: int, finish: object = None, cached: int = 3, rid: str = "sg-1") -> dict[str, object]:
    return {"text": text, "meta_info": {"id": rid, "finish_reason": finish, "prompt_tokens": 5,
                                        "completion_tokens": n, "cached_tokens": cached}}  # fmt: skip


STREAM = sse(
    ev("He", 1),
    ev("Hello", 2),
    ev("Hello", 2),  # no new token (e.g. a stream_interval tick)
    ev("Hello wor", 4),  # two tokens in one event
    ev("Hello world", 5, {"type": "length", "length": 5}),
)


def test_cumulative_events_become_deltas() -> None:
    r = record(SGLangAdapter(), STREAM)
    assert r.ok, r.error_message
    assert r.chunk_tokens == [1, 1, 0, 2, 1]
    assert r.output_tokens == 5 == r.completion_tokens
    assert r.token_source == SOURCE_CUMULATIVE
    assert r.output_text == "Hello world"
    assert r.finish_reason == "length"
    assert (r.prompt_tokens, r.cached_tokens, r.server_request_id) == (5, 3, "sg-1")
    assert r.first_token_ns == r.chunk_ns[0]


def test_any_split_point() -> None:
    for cut in range(1, len(STREAM), 7):
        r = record(SGLangAdapter(), STREAM, split=[cut])
        assert r.ok and r.output_tokens == 5 and r.output_text == "Hello world", cut


def test_incremental_text_without_output_ids() -> None:
    r = record(SGLangAdapter(), sse(ev("He", 1), ev("llo", 2), ev(" world", 3, {"type": "stop", "matched": 2})))
    assert r.ok and r.chunk_tokens == [1, 1, 1] and r.output_text == "Hello world" and r.finish_reason == "stop"


def ids_ev(text: str, ids: list[int], n: int, finish: object = None) -> dict[str, object]:
    return {**ev(text, n, finish), "output_ids": ids}


def test_incremental_streaming_keeps_repeated_deltas() -> None:
    # --incremental-streaming-output: text and output_ids are deltas; "ha","ha","ha!" looks
    # like a growing prefix, and reading it as cumulative text gave "ha","","!"
    stream = sse(ids_ev("ha", [7], 1), ids_ev("ha", [7], 2), ids_ev("ha!", [7, 9], 4, {"type": "length"}))
    r = record(SGLangAdapter(), stream)
    assert r.ok and r.output_text == "hahaha!" and r.chunk_tokens == [1, 1, 2]


def test_cumulative_output_ids_keep_cumulative_text() -> None:
    stream = sse(ids_ev("ha", [7], 1), ids_ev("haha", [7, 7], 2), ids_ev("hahaha!", [7, 7, 7, 9], 4, {"type": "length"}))
    r = record(SGLangAdapter(), stream)
    assert r.ok and r.output_text == "hahaha!" and r.chunk_tokens == [1, 1, 2]


def test_stream_output_up_to_0_5_9_made_only_the_ids_deltas() -> None:
    # 0.5.3-0.5.9 --stream-output: output_ids deltas, text still cumulative (tokenizer_manager.py)
    stream = sse(ids_ev("ha", [7], 1), ids_ev("haha", [7], 2), ids_ev("hahaha!", [7, 9], 4, {"type": "length"}))
    r = record(SGLangAdapter(engine_version="0.5.8"), stream)
    assert r.ok and r.output_text == "hahaha!" and r.chunk_tokens == [1, 1, 2]
    assert get_adapter("sglang", engine_version="0.5.23").parser()._text_follows_ids  # type: ignore[attr-defined]


def test_incremental_mode_given_by_the_user_without_output_ids() -> None:
    stream = sse(ev("ha", 1), ev("ha", 2), ev("ha!", 3, {"type": "length"}))
    assert record(SGLangAdapter(incremental_output=True), stream).output_text == "hahaha!"


def test_output_ids_are_counted_not_decoded() -> None:
    from bench_llm.adapters.sglang import _drop_output_ids

    ev_bytes = orjson.dumps(ids_ev('say "output_ids":[9]', [4, 5, 6], 3))
    rest, n = _drop_output_ids(ev_bytes)
    assert n == 3 and orjson.loads(rest)["output_ids"] == [] and orjson.loads(rest)["text"] == 'say "output_ids":[9]'
    assert _drop_output_ids(b'{"text": "a", "output_ids": [], "meta_info": {}}')[1] == 0  # json.dumps spacing
    assert _drop_output_ids(orjson.dumps(ev("a", 1))) == (orjson.dumps(ev("a", 1)), None)


def test_missing_done_is_a_failure() -> None:
    r = record(SGLangAdapter(), sse(ev("a", 1), ev("ab", 2, {"type": "length"}), done=False))
    assert not r.ok and r.error_type == "no_done"
    assert r.output_tokens == 2  # what arrived is still counted


def test_error_event_and_abort() -> None:
    r = record(SGLangAdapter(), sse(ev("a", 1), {"error": {"message": "boom", "type": "internal"}}))
    assert not r.ok and r.error_type == "internal" and "boom" in (r.error_message or "")
    r = record(SGLangAdapter(), sse(ev("a", 1), ev("a", 1, {"type": "abort", "message": "client gone"})))
    assert not r.ok and r.error_type == "abort" and "client gone" in (r.error_message or "")


def test_malformed_json_fails_the_request_only() -> None:
    r = record(SGLangAdapter(), sse(ev("a", 1), b"{not json"))
    assert not r.ok and r.error_type == "malformed_chunk"


def test_build_forces_length_and_flattens_chat() -> None:
    call = get_adapter("sglang", model="m").build(SPEC)
    body = orjson.loads(call.body)
    assert call.path == "/generate" and body["stream"] is True and body["text"] == SPEC.prompt
    sp = body["sampling_params"]
    assert sp == {"max_new_tokens": 8, "ignore_eos": True, "min_new_tokens": 8}
    chat = RequestSpec("c", input_tokens=4, max_output_tokens=2, messages=(Message("user", "hi"),), fixed_output=False)
    body = orjson.loads(SGLangAdapter().build(chat, history=(Message("user", "before"),)).body)
    assert body["text"] == "before\nhi" and "ignore_eos" not in body["sampling_params"]


def test_parser_state_is_per_request() -> None:
    a = SGLangAdapter()
    p1, p2 = a.parser(), a.parser()
    assert p1.parse(orjson.dumps(ev("abc", 3))).text == "abc"
    assert p2.parse(orjson.dumps(ev("xy", 2))).text == "xy"


def test_openai_surface_is_registered() -> None:
    a = get_adapter("sglang-openai", model="m", api="chat")
    body = orjson.loads(a.build(SPEC).body)
    assert body["stream_options"]["continuous_usage_stats"] is True and body["ignore_eos"] is True
    p = a.parser()
    e = p.parse(orjson.dumps({"id": "x", "choices": [{"delta": {"reasoning_content": "hm"}}],
                              "usage": {"completion_tokens": 1, "prompt_tokens": 3}}))  # fmt: skip
    assert e is not None and e.kind == EventKind.REASONING and e.cumulative == 1


@pytest.mark.parametrize("payload", [b"[1, 2]", b'"text"'])
def test_non_object_payload(payload: bytes) -> None:
    r = record(SGLangAdapter(), sse(payload))
    assert not r.ok and r.error_type == "malformed_chunk"


def test_an_abort_with_status_503_is_an_admission_rejection_and_other_aborts_are_not() -> None:
    # SGLang 0.5.23 managers/scheduler.py _abort_on_queued_limit, past --max-queued-requests
    full = {"type": "abort", "status_code": 503, "message": "The request queue is full."}
    ev = SGLangStreamParser().parse(orjson.dumps({"text": "", "meta_info": {"id": "r", "finish_reason": full,
                                                                              "completion_tokens": 0}}))  # fmt: skip
    assert ev is not None and ev.error_type == "abort_503" and ev.error_message == "The request queue is full."
    other = {"type": "abort", "message": "Abort in waiting queue", "status_code": None}
    ev = SGLangStreamParser().parse(orjson.dumps({"text": "", "meta_info": {"id": "r", "finish_reason": other}}))
    assert ev is not None and ev.error_type == "abort"
