"""SGLang's native /generate stream on the compiled read path (issue 20): the scan takes the
content events (cumulative or delta text, ``output_ids`` counted, not decoded) and keeps the
parser's stream state while it does; the records equal the Python path's on the same bytes,
payload by payload and stream by stream, over arbitrary HTTP chunking and read splits."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest

from bench_llm.adapters.base import EventKind
from bench_llm.adapters.sglang import SGLangStreamParser, _drop_output_ids, _timings
from bench_llm.loadgen.recorder import RequestRecorder
from tests.loadgen.test_fastpath import TEXTS, _comparable, _dump, _http, _run, _split

fastpath = pytest.importorskip("bench_llm.loadgen._fastpath", reason="the compiled read path is not built here (no C compiler?)")

TIMING = {"queue_time": 0.0125, "prefill_launch_delay": 0, "prefill_launch_latency": 3.5e-3}


def _meta(rng: random.Random, rid: str, cum: int, finish: Any = None, timing: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"id": rid, "finish_reason": finish, "prompt_tokens": 8, "completion_tokens": cum}
    if rng.random() < 0.7:
        meta["cached_tokens"] = rng.choice([0, 4, None])
    if timing:
        meta.update(timing)
    if rng.random() < 0.1:
        meta["weight_version"] = "default"
    if rng.random() < 0.3:  # key order is free
        meta = dict(rng.sample(list(meta.items()), len(meta)))
    return meta


def _event(text: str | None, ids: list[int] | None, meta: dict[str, Any], rng: random.Random) -> bytes:
    ev: dict[str, Any] = {"text": text}
    if ids is not None:
        ev["output_ids"] = ids
    ev["meta_info"] = meta
    if rng.random() < 0.2:
        ev = dict(reversed(list(ev.items())))
    return _dump(ev, rng)


# -- one payload: the scan reads what the parser reads ----------------------------------
def _check_payload(payload: bytes) -> bool:
    got = fastpath.classify(payload, fastpath.API_SGLANG)
    if got is None:
        return False
    cum, prompt, cached, rid, text, n_ids, timing = got
    stripped, want_ids = _drop_output_ids(payload)
    try:
        obj = orjson.loads(stripped)
        event = SGLangStreamParser(incremental=True).parse(payload)  # (deltas: the text as sent)
    except Exception:
        raise AssertionError(f"scan took a payload the parser refuses: {payload!r}") from None
    meta = obj["meta_info"]
    assert event is not None and event.kind in (EventKind.CONTENT, EventKind.EMPTY), payload
    assert event.finish_reason is None and event.error_type is None and event.completion_tokens is None, payload
    assert (cum, prompt, cached, rid) == (event.cumulative, event.prompt_tokens, event.cached_tokens,
                                          event.server_request_id), payload
    assert text == (obj.get("text") or "") == event.text and n_ids == want_ids, payload
    assert timing == _timings(meta) == event.server_timing, payload
    if timing is not None:
        assert [type(v) for v in timing.values()] == [float] * len(timing), payload
    return True


TRICKY = [
    b'{"text":"a","meta_info":{"completion_tokens":1}}',
    b'{"text":null,"meta_info":{"completion_tokens":1,"finish_reason":null}}',
    b'{"meta_info":{"completion_tokens":0}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"finish_reason":{"type":"length"}}}',
    b'{"text":"a","meta_info":{"completion_tokens":null}}',
    b'{"text":"a","meta_info":{"completion_tokens":1.0}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"completion_tokens":2}}',
    b'{"text":"a","meta_info":null}',
    b'{"text":1,"meta_info":{"completion_tokens":1}}',
    b'{"text":"a","meta_info":{"completion_tokens":1},"error":"x"}',
    b'{"text":"a","meta_info":{"completion_tokens":1},"object":"error"}',
    b'{"text":"a\\u00e9\\ud83d\\ude00\\n","meta_info":{"completion_tokens":1}}',
    b'{"text":"a","output_ids":[1,2,3],"meta_info":{"completion_tokens":3}}',
    b'{"text":"a","output_ids":[],"meta_info":{"completion_tokens":3}}',
    b'{"text":"a","output_ids": [ 1 , 2 ],"meta_info":{"completion_tokens":3}}',
    b'{"text":"a","output_ids" :[1,2],"meta_info":{"completion_tokens":3}}',
    b'{"text":"a","output_ids":null,"meta_info":{"completion_tokens":3}}',
    b'{"text":"a","output_ids":[1,[2]],"meta_info":{"completion_tokens":3}}',
    b'{"text":"a","output_ids":["1,2"],"meta_info":{"completion_tokens":3}}',
    b'{"text":"a","output_ids":[01],"meta_info":{"completion_tokens":3}}',
    b'{"text":"a","output_ids":[1,],"meta_info":{"completion_tokens":3}}',
    b'{"text":"a","output_ids":[,1],"meta_info":{"completion_tokens":3}}',
    b'{"text":"a","output_ids":[-1,2],"meta_info":{"completion_tokens":3}}',
    b'{"text":"a","output_ids":[1.5,2e3,0],"meta_info":{"completion_tokens":3}}',
    b'{"text":"a","output_ids":[0,1234567890123456789012],"meta_info":{"completion_tokens":3}}',
    b'{"text":"a","output_ids":[1,2',
    b'{"text":"a","meta_info":{"completion_tokens":3,"output_ids":[1]},"output_ids":[1,2]}',
    b'{"text":"a","output_ids":[1,2],"meta_info":{"completion_tokens":3,"output_ids":[1]}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"queue_time":1,"kv_transfer_time":2.5e-1}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"queue_time":null}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"queue_time":null,"prefill_launch_delay":0.5}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"prefill_launch_delay":0.5}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"queue_time":true}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"queue_time":"0.5"}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"queue_time":-0}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"queue_time":123456789012345678901}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"queue_time":1e400}}',
    # SGLang 0.5.10 and 0.5.23 name their timings otherwise (adapters/sglang.py TIMING_KEYS)
    b'{"text":"a","meta_info":{"completion_tokens":1,"forward_entry_time":1765000000.25,'
    b'"prefill_finished_time":1765000000.5,"queue_time":0.01,"prefill_waiting_latency":0.002}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"forward_entry_time":1765000000.25}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"first_token_latency":0.08,"prefill_finished_time":null}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"id":7}}',
    b'{"text":"a","meta_info":{"completion_tokens":1,"id":"r\\u0031"}}',
    b'{"text":"a","meta_info":{"completion_tokens":1}} x',
    b'{"text":"a","meta_info":{"completion_tokens":1}}\n',
    b'[DONE]',
]


@pytest.mark.parametrize("payload", TRICKY)
def test_tricky_sglang_payloads(payload: bytes) -> None:
    _check_payload(payload)


def test_the_regular_sglang_event_is_recognised() -> None:
    regular = [
        b'{"text":"a","meta_info":{"completion_tokens":1}}',
        b'{"text":null,"meta_info":{"completion_tokens":1,"finish_reason":null}}',
        b'{"meta_info":{"completion_tokens":0}}',
        b'{"text":"a\\u00e9\\ud83d\\ude00\\n","meta_info":{"completion_tokens":1}}',
        b'{"text":"a","output_ids":[1,2,3],"meta_info":{"completion_tokens":3}}',
        b'{"text":"a","output_ids":[],"meta_info":{"completion_tokens":3}}',
        b'{"text":"a","output_ids": [ 1 , 2 ],"meta_info":{"completion_tokens":3}}',
        b'{"text":"a","output_ids":[-1,2],"meta_info":{"completion_tokens":3}}',
        b'{"text":"a","output_ids":[1.5,2e3,0],"meta_info":{"completion_tokens":3}}',
        b'{"text":"a","meta_info":{"completion_tokens":1,"queue_time":1,"kv_transfer_time":2.5e-1}}',
        b'{"text":"a","meta_info":{"completion_tokens":1,"queue_time":null}}',
        b'{"text":"a","meta_info":{"completion_tokens":1,"queue_time":null,"prefill_launch_delay":0.5}}',
    ]
    assert set(regular) <= set(TRICKY)
    for payload in regular:
        assert _check_payload(payload), payload


def test_random_and_mutated_sglang_payloads_agree_with_the_parser() -> None:
    rng = random.Random(4)
    regular = 0
    for i in range(3000):
        cum = rng.randint(0, 50)
        ids = None if rng.random() < 0.3 else list(range(rng.choice([cum, 1, 0])))
        timing = dict(rng.sample(list(TIMING.items()), rng.randint(0, 3))) or None
        payload = _event(rng.choice([*TEXTS, "", None]), ids, _meta(rng, f"r{i}", cum, timing=timing), rng)
        b = bytearray(payload)
        if rng.random() < 0.5:  # byte-level damage: every verdict must still agree
            for _ in range(rng.randint(1, 3)):
                pos = rng.randrange(len(b))
                b.insert(pos, rng.choice(b'{}[]",:\\ 0123456789aeuntrl\x00\x80\xff'))
        regular += _check_payload(bytes(b))
    assert regular > 1200


# -- whole streams ----------------------------------------------------------------------
MODES: dict[str, dict[str, Any]] = {  # (what the server sends, the parser's settings)
    "cumulative": {"incremental": None, "text_follows_ids": True},
    "cumulative_no_ids": {"incremental": None, "text_follows_ids": True},
    "incremental": {"incremental": None, "text_follows_ids": True},
    "incremental_known": {"incremental": True, "text_follows_ids": True},
    "ids_delta_text_cumulative": {"incremental": None, "text_follows_ids": False},  # --stream-output up to 0.5.9
}


def _sglang_stream(rng: random.Random, mode: str, n: int | None = None) -> bytes:
    """A random /generate stream in ``mode``, with the odd surprise: tokens that do not grow,
    a revised detokenisation, changing timings, an abort, an error, malformed JSON, no [DONE]."""
    n = rng.randint(0, 30) if n is None else n
    rid = f"req-{rng.randint(0, 99)}"
    text, cum, events = "", 0, []
    timing: dict[str, Any] | None = None
    for i in range(n):
        piece = rng.choice([*TEXTS, ""]) if rng.random() < 0.15 else rng.choice(TEXTS)
        cum += rng.random() > 0.08
        if i and rng.random() < 0.1:
            timing = {**TIMING, "queue_time": rng.random()}
        final = i == n - 1 and rng.random() < 0.9
        finish = None
        if final:
            finish = rng.choice([{"type": "length", "length": cum}, {"type": "stop", "matched": 2}, "stop",
                                 {"type": "abort", "message": "gone"}])
        if mode.startswith("incremental"):
            sent = piece
            ids: list[int] | None = [7] * (cum > 0) if rng.random() < 0.9 else None
        else:
            if text and rng.random() < 0.05:
                text = text[:-1] + "~"  # a revised detokenisation: not a prefix of what came
            text += piece
            sent = text
            ids = list(range(cum)) if mode == "cumulative" else [7] if mode == "ids_delta_text_cumulative" else None
        events.append(_event(sent if sent or rng.random() < 0.7 else None, ids, _meta(rng, rid, cum, finish, timing), rng))
    r = rng.random()
    if r < 0.04 and events:
        events.insert(rng.randrange(len(events)), b'{"error":{"message":"bad","type":"invalid_request_error"}}')
    elif r < 0.08 and events:
        events.insert(rng.randrange(len(events)), events[0][:-2])  # malformed JSON
    if rng.random() < 0.9:
        events.append(b"[DONE]")
    body = b"".join((b"data:" if rng.random() < 0.8 else b"data: ") + e + b"\n\n" for e in events)
    if rng.random() < 0.03:
        body += b'data:{"text":'  # ends inside an event
    return body


def _spy() -> tuple[list[bytes], Any]:
    calls: list[bytes] = []
    orig = RequestRecorder.fast_special

    def spy(self: RequestRecorder, ts: int, payload: bytes) -> tuple[int, Any]:
        calls.append(payload)
        return orig(self, ts, payload)

    return calls, spy


def _both(pieces: list[bytes], settings: dict[str, Any], calls: list[bytes], spy: Any) -> tuple[Any, Any]:
    py, py_reads, py_kept = _run(pieces, compiled=False, chat=False, close_at_end=True,
                                 parser=SGLangStreamParser(**settings), requires_done=True)
    calls.clear()
    orig = RequestRecorder.fast_special
    RequestRecorder.fast_special = spy  # type: ignore[method-assign]
    try:
        c, c_reads, c_kept = _run(pieces, compiled=True, chat=False, close_at_end=True,
                                  parser=SGLangStreamParser(**settings), requires_done=True)
    finally:
        RequestRecorder.fast_special = orig  # type: ignore[method-assign]
    assert (c_reads, c_kept) == (py_reads, py_kept)
    return py, c


@pytest.mark.parametrize("mode", sorted(MODES))
def test_random_sglang_streams_give_the_same_records(mode: str) -> None:
    rng = random.Random(mode)
    calls, spy = _spy()
    taken = 0
    for i in range(150):
        body = _sglang_stream(rng, mode)
        data, _complete = _http(rng, body)
        pieces = _split(rng, data)
        py, c = _both(pieces, MODES[mode], calls, spy)
        ctx = f"{mode} stream {i}:\n{data!r}"
        assert _comparable(c) == _comparable(py), ctx
        if py.ok and py.output_tokens >= 10:
            taken += 1
            assert len(calls) <= 6, (ctx, calls)  # the final event, the odd empty or revised one
    assert taken > 40, taken


def test_a_regular_sglang_stream_is_read_in_c() -> None:
    """Cumulative text and output_ids (SGLang's default), timings on every event: only the
    final event goes to the parser, and the record has the server's timings."""
    rng = random.Random(5)
    text, events = "", []
    for i in range(1, 41):
        text += rng.choice(TEXTS)
        finish = {"type": "length", "length": 40} if i == 40 else None
        meta = {"id": "rq", "finish_reason": finish, "prompt_tokens": 8, "completion_tokens": i, "cached_tokens": 0, **TIMING}
        events.append(json.dumps({"text": text, "output_ids": list(range(i)), "meta_info": meta}).encode())
    body = b"".join(b"data: " + e + b"\n\n" for e in [*events, b"[DONE]"])
    calls, spy = _spy()
    for seed in range(5):
        r = random.Random(seed)
        data, _ = _http(r, body)
        if not data.endswith(b"0\r\n\r\n"):
            data += b"0\r\n\r\n"
        py, c = _both(_split(r, data), MODES["cumulative"], calls, spy)
        assert _comparable(c) == _comparable(py)
        assert c.ok and c.output_tokens == 40 and c.finish_reason == "length" and c.server_request_id == "rq", c
        assert len(calls) == 1, calls


def test_the_simulated_sglang_wire_gives_the_same_records() -> None:
    """The bytes the embedded engine sends as SGLang (sim/wire.py, after SGLang 0.5.x's
    tokenizer_manager): no recorded SGLang transcript is in ../shared/transcripts."""
    from bench_llm.sim.wire import SGLangWire

    rng = random.Random(9)
    calls, spy = _spy()
    for _ in range(10):
        wire = SGLangWire("sim-1", 8, 0)
        body = b""
        n = rng.randint(5, 60)
        for i in range(1, n + 1):
            if i == 2:
                wire.timing = dict(TIMING)
            body += wire.tokens(rng.choice(TEXTS), i, "length" if i == n else None)
        body += wire.closing(n, False)
        data, _ = _http(rng, body)
        if not data.endswith(b"0\r\n\r\n"):
            data += b"0\r\n\r\n"
        py, c = _both(_split(rng, data), MODES["cumulative"], calls, spy)
        assert _comparable(c) == _comparable(py)
        assert py.ok and py.output_tokens == n, py
        assert len(calls) == 1, calls  # the final event only
