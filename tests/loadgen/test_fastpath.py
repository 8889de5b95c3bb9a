"""The compiled read path (loadgen/_fastpath.c) must give exactly the records of the
Python path: it only recognises the regular token event and leaves everything else to
the adapter's parser. Checked payload by payload (the scan against the parser, on
valid, tricky and mutated payloads) and stream by stream (random OpenAI streams, random
HTTP chunking and read splits, CRLF framing, errors, truncation), through the real
transport code on a socket pair."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import socket
from typing import Any

import pytest

from bench_llm.adapters.base import EventKind
from bench_llm.adapters.openai import OpenAIStreamParser
from bench_llm.loadgen import rawhttp
from bench_llm.loadgen.http1_response import Connection, Exchange
from bench_llm.loadgen.recorder import RequestRecorder
from bench_llm.loadgen.transport import StreamError
from bench_llm.results.record import RequestRecord
from bench_llm.workloads.spec import RequestSpec

fastpath = pytest.importorskip("bench_llm.loadgen._fastpath", reason="the compiled read path is not built here (no C compiler?)")

SPEC = RequestSpec("r0", input_tokens=8, max_output_tokens=64, prompt="hello")
TEXTS = ["a", " b", "ü", "日本", "😀", 'q"uote', "back\\slash", "nl\n", '"finish_reason":"stop"', '\\"x', "\t", "\u2028"]


# -- one payload: the scan agrees with the parser ---------------------------------------
def _parse(payload: bytes, chat: bool) -> Any:
    try:
        return OpenAIStreamParser(chat).parse(payload)
    except Exception:
        return "error"


def _check_payload(payload: bytes, chat: bool) -> bool:
    """Asserts the scan's verdict is one the parser agrees with; True if regular."""
    got = fastpath.classify(payload, 2 if chat else 1)
    if got is None:
        return False
    kind, cum, prompt, cached, rid = got
    ev = _parse(payload, chat)
    assert ev != "error", f"scan took a payload the parser refuses: {payload!r}"
    assert ev is not None
    want_kind = EventKind.CONTENT if kind == fastpath.KIND_CONTENT else EventKind.REASONING
    assert ev.kind == want_kind and ev.text, payload
    assert (ev.cumulative, ev.prompt_tokens, ev.cached_tokens, ev.server_request_id) == (cum, prompt, cached, rid), payload
    assert ev.tokens is None and ev.finish_reason is None and ev.completion_tokens is None, payload
    assert ev.error_type is None, payload
    return True


def _token_event(rng: random.Random, chat: bool, cum: int, *, usage: bool = True) -> dict[str, Any]:
    text = rng.choice(TEXTS)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": None}
    if chat:
        key = rng.choice(["content", "content", "reasoning_content", "reasoning"])
        choice["delta"] = {key: text}
        if rng.random() < 0.2:
            choice["logprobs"] = {"content": [{"token": text, "logprob": -0.5, "bytes": [1, 2]}]}
    else:
        choice["text"] = text
        if rng.random() < 0.2:
            choice["logprobs"] = {"tokens": [text], "text_offset": [0], "token_logprobs": [-1.25e-3]}
    obj: dict[str, Any] = {"id": f"cmpl-{rng.randint(0, 99)}", "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": 1, "model": "m", "choices": [choice]}
    if usage:
        u: dict[str, Any] = {"prompt_tokens": 8, "total_tokens": 8 + cum, "completion_tokens": cum}
        if rng.random() < 0.3:
            u["prompt_tokens_details"] = {"cached_tokens": rng.choice([0, 4, None])}
        obj["usage"] = u
    return obj


def _dump(obj: Any, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return json.dumps(obj, ensure_ascii=rng.random() < 0.5).encode()
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


TRICKY = [
    b'{"choices":[{"text":"a","finish_reason":null}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"te\\u0078t":"a","finish_reason":null}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"a","finish_re\\u0061son":"stop"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"a","finish_reason":null,"finish_reason":"stop"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1,"completion_tokens":2}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1}} x',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1}}\n',
    b'  {"choices":[{"text":"a"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1.0}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1e2}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":-1}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":01}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":99999999999999999999}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":true}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":null}}',
    b'{"choices":[{"text":"a"}],"usage":{}}',
    b'{"choices":[{"text":"a"}],"usage":null}',
    b'{"choices":[{"text":""}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":5}],"usage":{"completion_tokens":1}}',
    b'{"choices":[],"usage":{"completion_tokens":1}}',
    b'{"choices":{"text":"a"},"usage":{"completion_tokens":1}}',
    b'{"choices":["a"],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"a"},{"text":"b","finish_reason":"stop"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"a"},],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1},}',
    b'{"error":{"message":"x"},"choices":[{"text":"a"}],"usage":{"completion_tokens":1}}',
    b'{"object":"error","choices":[{"text":"a"}],"usage":{"completion_tokens":1}}',
    b'{"object":"err\\u006fr","choices":[{"text":"a"}],"usage":{"completion_tokens":1}}',
    b'{"id":7,"choices":[{"text":"a"}],"usage":{"completion_tokens":1}}',
    b'{"id":"a\\"b","choices":[{"text":"a"}],"usage":{"completion_tokens":1}}',
    b'{"id":null,"choices":[{"text":"a"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"\\ud83d\\ude00"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"\\ud800"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"\\udc00\\ud800"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"\\ud800\\u0041"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"\\ud800\\"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"\\uDBFF\\uDFFF"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"\xff"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"\xed\xa0\x80"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"a\x01"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1},"x":' + b"[" * 200 + b"]" * 200 + b"}",
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1},"x":1e400}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1},"x":[1e308,2e308]}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1},"x":[-1.5e-07,1E+5,0e0,1e-400]}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1},"x":1e}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1},"x":1e+}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1},"x":NaN}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1,"prompt_tokens":"8"}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1,"prompt_tokens_details":[]}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1,"prompt_tokens_details":{}}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":"3"}}}',
    b'[{"choices":[{"text":"a"}],"usage":{"completion_tokens":1}}]',
    b'[DONE]',
    b'',
]

TRICKY_CHAT = [
    b'{"choices":[{"delta":{"content":"a"}}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"delta":{"role":"assistant","content":""}}],"usage":{"completion_tokens":0}}',
    b'{"choices":[{"delta":{"role":"assistant","content":"a"}}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"delta":{"content":null,"reasoning_content":"r"}}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"delta":{"content":"","reasoning":"r"}}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"delta":{"reasoning_content":"","reasoning":"r"}}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"delta":{"tool_calls":[{"id":"t"}]}}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"delta":{"content":"a","tool_calls":[]}}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"delta":{"content":["a"]}}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"delta":null}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"delta":"a"}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"delta":{}}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"delta":{"content":"a"},"logprobs":{"content":[{"token":"a"}]}}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"delta":{"content":"a","content":""}}],"usage":{"completion_tokens":1}}',
    b'{"choices":[{"text":"a"}],"usage":{"completion_tokens":1}}',
]


@pytest.mark.parametrize("payload", TRICKY)
def test_tricky_completions_payloads(payload: bytes) -> None:
    _check_payload(payload, chat=False)


@pytest.mark.parametrize("payload", TRICKY_CHAT)
def test_tricky_chat_payloads(payload: bytes) -> None:
    _check_payload(payload, chat=True)


def test_the_regular_event_is_recognised() -> None:
    assert _check_payload(TRICKY[0], chat=False)
    assert _check_payload(TRICKY_CHAT[0], chat=True)
    assert _check_payload(TRICKY_CHAT[3], chat=True)  # reasoning


def test_random_and_mutated_payloads_agree_with_the_parser() -> None:
    rng = random.Random(8)
    regular = 0
    for i in range(6000):
        chat = bool(i % 2)
        payload = _dump(_token_event(rng, chat, rng.randint(0, 300), usage=rng.random() < 0.9), rng)
        regular += _check_payload(payload, chat)
        b = bytearray(payload)
        for _ in range(rng.randint(1, 3)):  # byte-level damage: every verdict must still agree
            op = rng.random()
            pos = rng.randrange(len(b) + 1)
            if op < 0.4 and len(b) > 1:
                del b[min(pos, len(b) - 1)]
            elif op < 0.8:
                b.insert(pos, rng.choice(b'{}[]",:\\ 0123456789aeuntrl\x00\x1f\x80\xc3\xff'))
            elif len(b) > 1:
                b[min(pos, len(b) - 1)] = rng.randrange(256)
        _check_payload(bytes(b), chat)
    assert regular > 3000  # the scan does take the common event


def test_the_clock_is_perf_counter_ns() -> None:
    import time

    a = time.perf_counter_ns()
    b = fastpath.monotonic_ns()
    c = time.perf_counter_ns()
    assert a <= b <= c


# -- whole streams: the compiled and the Python path give the same record ---------------
class _FakeLoop:
    """Stands in for the event loop's reader registry: the test calls the reader."""

    def __init__(self) -> None:
        self.readers: dict[int, Any] = {}

    def add_reader(self, fd: int, cb: Any) -> None:
        self.readers[fd] = cb

    def remove_reader(self, fd: int) -> bool:
        return self.readers.pop(fd, None) is not None


def _run(
    pieces: list[bytes], compiled: bool, chat: bool, close_at_end: bool, parser: Any = None,
    requires_done: bool | None = None,
) -> tuple[RequestRecord, list[int], bool]:
    """Feeds ``pieces`` (one read each) through RawHttpTransport's exchange; returns the
    record, the read index of each chunk stamp, and whether the connection was kept
    (``parser``: another adapter's parser than OpenAI's)."""
    t = rawhttp.RawHttpTransport("http://127.0.0.1:9", compiled=compiled)
    fake = _FakeLoop()
    t.loop = fake  # type: ignore[assignment]
    a, b = socket.socketpair()
    a.setblocking(False)
    conn = Connection(a, t)
    fake.add_reader(conn.fd, conn.readable)
    aloop = asyncio.new_event_loop()
    try:
        fut = aloop.create_future()
        rec = RequestRecorder(SPEC, parser if parser is not None else OpenAIStreamParser(chat), 0, 0)
        ex = Exchange(t, conn, rec, fut, False)
        conn.exchange = ex
        t._active.add(ex)
        stamps: list[int] = []
        for piece in pieces:
            if fut.done():
                break
            b.sendall(piece)
            reader = fake.readers[conn.fd]
            reader()
            stamps.append(ex.fast.last_read_ns if ex.fast is not None and ex.fast.reads else ex.last_read_ns)
        if not fut.done() and close_at_end:
            b.close()
            fake.readers[conn.fd]()
        error: StreamError | None = None
        if not fut.done():
            error = StreamError("timeout", "no data")
        elif fut.exception() is not None:
            exc = fut.exception()
            assert isinstance(exc, StreamError), exc
            error = exc
        # (TGI has no [DONE])
        record = rec.finish(rawhttp._now(), error, requires_done=parser is None if requires_done is None else requires_done)
        assert compiled == (ex.fast is not None) or not compiled
        # each chunk stamp -> the index of the read that stamped it (exact: one read per piece)
        index = {ts: i for i, ts in enumerate(stamps)}
        reads = [index.get(ts, -1) for ts in record.chunk_ns]
        kept = conn in t._idle
        return record, reads, kept
    finally:
        aloop.close()
        a.close()
        b.close()


def _stream(rng: random.Random, chat: bool) -> bytes:
    """A random SSE body of an OpenAI-style stream, with the odd surprise."""
    events: list[bytes] = []
    cum = 0
    if chat and rng.random() < 0.7:
        events.append(_dump({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, rng))
    continuous = rng.random() < 0.85
    for _ in range(rng.randint(0, 12)):
        cum += rng.choice([1, 1, 1, 2, 0])
        ev = _token_event(rng, chat, cum, usage=continuous or rng.random() < 0.5)
        events.append(_dump(ev, rng))
        r = rng.random()
        if r < 0.03:
            events.append(b'{"error":{"message":"boom","type":"server_error"}}')
        elif r < 0.06:
            events.append(_dump(ev, rng)[:-3])  # malformed JSON
        elif r < 0.08:
            events.append(b'{"choices":[{"text":"\xff"}],"usage":{"completion_tokens":1}}')
    if rng.random() < 0.9:
        fin: dict[str, Any] = {"id": "c1", "choices": [{"index": 0, "finish_reason": "length"}]}
        fin["choices"][0]["delta" if chat else "text"] = {} if chat else ""
        events.append(_dump(fin, rng))
        events.append(_dump({"id": "c1", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": cum}}, rng))
    if rng.random() < 0.9:
        events.append(b"[DONE]")
    crlf = rng.random() < 0.15
    sep = b"\r\n" if crlf else b"\n"
    body = b""
    for payload in events:
        r = rng.random()
        if r < 0.1 and b"\n" not in payload:
            half = len(payload) // 2
            block = b"data:" + payload[:half] + sep + b"data: " + payload[half:]  # multi-line data: joined with \n
        elif r < 0.15:
            block = b": keep-alive" + sep + b"data: " + payload
        elif r < 0.2:
            block = b"event: message" + sep + b"data:" + payload
        else:
            block = b"data: " + payload
        body += block + sep + sep
    if rng.random() < 0.05:
        body += b"data: {\"trunc"  # ends inside an event
    return body


def _http(rng: random.Random, body: bytes) -> tuple[bytes, bool]:
    """Head + chunked body (random chunk sizes, the odd extension and trailer); whether
    the response is complete."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    out = [head]
    pos = 0
    while pos < len(body):
        n = rng.choice([len(body) - pos, rng.randint(1, 40), rng.randint(1, 400)])
        n = max(1, min(n, len(body) - pos))
        ext = b";x=1" if rng.random() < 0.05 else b""
        size = b"%x" % n if rng.random() < 0.9 else b"%X" % n
        out.append(size + ext + b"\r\n" + body[pos : pos + n] + b"\r\n")
        pos += n
    complete = rng.random() < 0.92
    if complete:
        out.append(b"0\r\nX-Trailer: 1\r\n\r\n" if rng.random() < 0.1 else b"0\r\n\r\n")
    return b"".join(out), complete


def _split(rng: random.Random, data: bytes) -> list[bytes]:
    pieces = []
    pos = 0
    while pos < len(data):
        n = rng.choice([rng.randint(1, 8), rng.randint(1, 120), rng.randint(50, 2000)])
        pieces.append(data[pos : pos + n])
        pos += n
    return pieces


_TIMING = {"first_token_ns", "first_content_ns", "end_ns", "chunk_ns", "first_byte_ns", "send_ns", "intended_send_ns"}


def _comparable(record: RequestRecord) -> dict[str, Any]:
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if f.name not in _TIMING}


def test_random_streams_give_the_same_records() -> None:
    rng = random.Random(42)
    compiled_runs = 0
    for i in range(600):
        chat = bool(i % 2)
        data, _complete = _http(rng, _stream(rng, chat))
        pieces = _split(rng, data)
        py, py_reads, py_kept = _run(pieces, compiled=False, chat=chat, close_at_end=True)
        c, c_reads, c_kept = _run(pieces, compiled=True, chat=chat, close_at_end=True)
        ctx = f"stream {i} (chat={chat}):\n{data!r}\npieces={[len(p) for p in pieces]}"
        assert _comparable(c) == _comparable(py), ctx
        assert c_reads == py_reads, ctx
        assert c_kept == py_kept, ctx
        assert (c.first_token_ns is None) == (py.first_token_ns is None), ctx
        if c.first_token_ns is not None:
            assert c_reads[c.chunk_ns.index(c.first_token_ns)] == py_reads[py.chunk_ns.index(py.first_token_ns)], ctx
        compiled_runs += 1
    assert compiled_runs == 600


def test_a_regular_stream_is_read_in_c() -> None:
    """The common case takes the compiled path end to end (no event through Python but
    the final ones), and the record is complete."""
    rng = random.Random(1)
    body = b"".join(b"data: " + _dump(_token_event(rng, False, i + 1), rng) + b"\n\n" for i in range(20))
    body += b'data: {"id":"c","choices":[{"text":"","finish_reason":"length"}]}\n\ndata: [DONE]\n\n'
    data, _ = _http(random.Random(0), body)
    calls: list[bytes] = []
    orig = RequestRecorder.fast_special

    def spy(self: RequestRecorder, ts: int, payload: bytes) -> tuple[int, Any]:
        calls.append(payload)
        return orig(self, ts, payload)

    RequestRecorder.fast_special = spy  # type: ignore[method-assign]
    try:
        rec, _, kept = _run([data], compiled=True, chat=False, close_at_end=False)
    finally:
        RequestRecorder.fast_special = orig  # type: ignore[method-assign]
    assert rec.ok and rec.output_tokens == 20 and rec.finish_reason == "length" and kept
    assert len(calls) == 1  # only the final event went to the parser


def _shaped(rng: random.Random, chat: bool, shape: str, n: int) -> bytes:
    """An OpenAI stream of ``n`` token events with usage on every chunk, only in a final
    usage event, only in the last text chunk, or nowhere; its role and final events."""
    events: list[bytes] = []
    if chat:
        events.append(_dump({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, rng))
    for i in range(n):
        ev = _token_event(rng, chat, i + 1, usage=shape == "every")
        if shape == "last_text" and i == n - 1:
            ev["usage"] = {"prompt_tokens": 8, "completion_tokens": n}
        events.append(_dump(ev, rng))
    fin: dict[str, Any] = {"id": "c1", "choices": [{"index": 0, "finish_reason": "length"}]}
    fin["choices"][0]["delta" if chat else "text"] = {} if chat else ""
    events.append(_dump(fin, rng))
    if shape in ("every", "end"):
        events.append(_dump({"id": "c1", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n}}, rng))
    events.append(b"[DONE]")
    return b"".join(b"data: " + e + b"\n\n" for e in events)


@pytest.mark.parametrize("shape", ["every", "end", "last_text", "none"])
@pytest.mark.parametrize("chat", [False, True])
def test_every_openai_stream_shape_is_read_in_c_with_the_same_record(shape: str, chat: bool) -> None:
    """Usage per chunk (vLLM continuous usage), at the end only (stock OpenAI servers), in
    the last text chunk (transformers serve), or absent (llama-cpp-python): the compiled
    scan takes the token events itself (at most the first one and the final events go to
    the parser) and the record equals the Python path's, over random framings."""
    rng = random.Random(f"{shape}{chat}")
    calls: list[bytes] = []
    orig = RequestRecorder.fast_special

    def spy(self: RequestRecorder, ts: int, payload: bytes) -> tuple[int, Any]:
        calls.append(payload)
        return orig(self, ts, payload)

    for _ in range(40):
        data, _ = _http(rng, _shaped(rng, chat, shape, 30))
        if not data.endswith(b"0\r\n\r\n"):
            data += b"0\r\n\r\n"
        pieces = _split(rng, data)
        py, py_reads, py_kept = _run(pieces, compiled=False, chat=chat, close_at_end=True)
        calls.clear()
        RequestRecorder.fast_special = spy  # type: ignore[method-assign]
        try:
            c, c_reads, c_kept = _run(pieces, compiled=True, chat=chat, close_at_end=True)
        finally:
            RequestRecorder.fast_special = orig  # type: ignore[method-assign]
        assert _comparable(c) == _comparable(py), (shape, chat, data)
        assert (c_reads, c_kept) == (py_reads, py_kept), (shape, chat)
        assert py.ok and py.output_tokens == 30, py
        assert len(calls) <= 4, (shape, chat, calls)  # role, first token without usage, final, usage


# -- TGI /generate_stream: one token per event ------------------------------------------
def _tgi_event(rng: random.Random, i: int, final: bool = False) -> dict[str, Any]:
    special = rng.random() < 0.05
    token = {"id": rng.randint(0, 999), "text": "</s>" if special else rng.choice(TEXTS), "logprob": -0.25, "special": special}
    ev: dict[str, Any] = {"index": i, "token": token, "generated_text": None, "details": None}
    if rng.random() < 0.2:
        ev["top_tokens"] = [] if rng.random() < 0.5 else None
    if rng.random() < 0.2:
        del ev["details"]
    if final:
        ev["generated_text"] = "all of it"
        if rng.random() < 0.7:
            ev["details"] = {"finish_reason": "length", "generated_tokens": i, "seed": None, "input_length": 8}
    return ev


def test_tgi_payloads_agree_with_the_parser() -> None:
    from bench_llm.adapters.tgi import TGIStreamParser

    rng = random.Random(3)
    regular = 0
    for i in range(4000):
        payload = _dump(_tgi_event(rng, i, final=rng.random() < 0.1), rng)
        b = bytearray(payload)
        if rng.random() < 0.5:  # byte-level damage: every verdict must still agree
            for _ in range(rng.randint(1, 3)):
                pos = rng.randrange(len(b))
                b.insert(pos, rng.choice(b'{}[]",:\\ 0123456789aeuntrl\x00\x80\xff'))
        payload = bytes(b)
        got = fastpath.classify(payload, fastpath.API_TGI)
        if got is None:
            continue
        regular += 1
        try:
            ev = TGIStreamParser().parse(payload)
        except Exception:
            raise AssertionError(f"scan took a payload the parser refuses: {payload!r}") from None
        assert ev is not None and ev.kind == EventKind.CONTENT and ev.tokens == 1, payload
        assert (ev.cumulative, ev.finish_reason, ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens,
                ev.server_request_id, ev.error_type) == (None,) * 7, payload
        assert got == (fastpath.KIND_CONTENT, None, None, None, None)
    for payload in (b'{"token":{"id":1},"token":null}', b'{"token":null}', b'{"token":[1]}', b'{"error":"x","token":{}}',
                    b'{"token":{},"details":{}}', b'{"token":{},"generated_text":""}', b'{"tok\\u0065n":{}}', b"[DONE]"):
        assert fastpath.classify(payload, fastpath.API_TGI) is None, payload
    assert regular > 1500


def _tgi_stream(rng: random.Random) -> bytes:
    n = rng.randint(0, 40)
    events = [_dump(_tgi_event(rng, i + 1, final=i == n - 1 and rng.random() < 0.9), rng) for i in range(n)]
    r = rng.random()
    if r < 0.04 and events:
        events.insert(rng.randrange(len(events)), b'{"error":"Request failed during generation","error_type":"generation"}')
    elif r < 0.08 and events:
        events.insert(rng.randrange(len(events)), events[0][:-2])  # malformed JSON
    elif r < 0.1:
        events.append(b"[DONE]")  # not TGI's: the parser refuses it, so must the scan
    body = b"".join((b"data:" if rng.random() < 0.8 else b"data: ") + e + b"\n\n" for e in events)
    if rng.random() < 0.05:
        body += b'data:{"index":'  # ends inside an event
    return body


def test_random_tgi_streams_give_the_same_records() -> None:
    """TGI's token events are read in C (the final event, errors and anything odd go to the
    parser), and the records equal the Python path's over random framings."""
    from bench_llm.adapters.tgi import TGIStreamParser

    rng = random.Random(20)
    calls: list[bytes] = []
    orig = RequestRecorder.fast_special

    def spy(self: RequestRecorder, ts: int, payload: bytes) -> tuple[int, Any]:
        calls.append(payload)
        return orig(self, ts, payload)

    scanned_streams = 0
    for i in range(300):
        body = _tgi_stream(rng)
        data, _complete = _http(rng, body)
        pieces = _split(rng, data)
        py, py_reads, py_kept = _run(pieces, compiled=False, chat=False, close_at_end=True, parser=TGIStreamParser())
        calls.clear()
        RequestRecorder.fast_special = spy  # type: ignore[method-assign]
        try:
            c, c_reads, c_kept = _run(pieces, compiled=True, chat=False, close_at_end=True, parser=TGIStreamParser())
        finally:
            RequestRecorder.fast_special = orig  # type: ignore[method-assign]
        ctx = f"stream {i}:\n{data!r}"
        assert _comparable(c) == _comparable(py), ctx
        assert (c_reads, c_kept) == (py_reads, py_kept), ctx
        if py.ok and py.output_tokens >= 10:
            assert len(calls) <= 2, (ctx, calls)  # the final event (and maybe one odd one)
            scanned_streams += 1
    assert scanned_streams > 100


def test_bad_chunk_framing_is_a_protocol_error_on_both_paths() -> None:
    data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\ndata: x\r\n"
    for compiled in (False, True):
        rec, _, _ = _run([data], compiled=compiled, chat=False, close_at_end=False)
        assert rec.error_type == "http_protocol" and "bad chunk size line b'zz'" in (rec.error_message or "")


def test_pure_python_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_PURE_PYTHON", "1")
    assert rawhttp.RawHttpTransport("http://127.0.0.1:9").describe()["read_path"] == "python"
    monkeypatch.delenv("BENCH_PURE_PYTHON")
    assert rawhttp.RawHttpTransport("http://127.0.0.1:9").describe()["read_path"] == "compiled"


@pytest.mark.parametrize("clock", ["user", "kernel"])
def test_live_streams_through_the_compiled_reader(clock: str) -> None:
    """Against the simulated engine, both clocks: complete records, the tokens counted
    from the server's usage, stamps in order and after the send, the connection reused."""
    import time

    from bench_llm.adapters.openai import OpenAIAdapter
    from bench_llm.loadgen.transport import Timeouts
    from bench_llm.sim.server import ServerConfig, create_app, serve_in_process
    from bench_llm.sim.timing import FixedTiming

    async def main() -> tuple[list[tuple[RequestRecord, bool]], rawhttp.RawHttpTransport]:
        async with serve_in_process(create_app(ServerConfig(timing=FixedTiming(0.02, 0.005)))) as url:
            t = rawhttp.RawHttpTransport(url, Timeouts(stall=5.0), clock=clock, compiled=True)  # type: ignore[arg-type]
            adapter = OpenAIAdapter(model="sim-model")
            spec = RequestSpec("r", 4, 6, prompt="hello there")
            out = []
            for _ in range(3):
                rec = RequestRecorder(spec, adapter.parser(), 0, 0)
                await t.send(adapter.build(spec), rec)
                out.append((rec.finish(time.perf_counter_ns()), rec._fast is not None))
            await t.close()
            return out, t

    results, t = asyncio.run(main())
    for record, compiled in results:
        assert compiled
        assert record.ok and record.output_tokens == 6 and record.token_source == "server_cumulative", record
        assert record.chunk_ns == sorted(record.chunk_ns)
        assert record.send_ns is not None and record.first_token_ns is not None
        assert 15e6 < record.first_token_ns - record.send_ns < 500e6  # TTFT 20 ms, shared CPU
        assert record.end_ns >= record.chunk_ns[-1]
    assert t.connections_opened == 1 and t.describe()["read_path"] == "compiled"


def test_an_error_inside_the_read_fails_the_request_at_once() -> None:
    """A Python error raised in the parser's callback (not a parse error, which is the
    stream's own failure) is recorded as a client error, not left to the stall timeout."""
    body = b'data: {"choices":[],"usage":{"completion_tokens":1}}\n\n' * 40  # usage-only: all to the parser
    data, _ = _http(random.Random(0), body)
    orig = RequestRecorder.fast_special

    def broken(self: RequestRecorder, ts: int, payload: bytes) -> tuple[int, Any]:
        raise MemoryError("simulated")

    RequestRecorder.fast_special = broken  # type: ignore[method-assign]
    try:
        rec, _, kept = _run([data], compiled=True, chat=False, close_at_end=False)
    finally:
        RequestRecorder.fast_special = orig  # type: ignore[method-assign]
    assert rec.error_type == "client_error" and "MemoryError: simulated" in (rec.error_message or "") and not kept


TRANSCRIPTS = [
    "vllm_completions_stream.sse",
    "vllm_chat_stream.sse",
    "vllm_completions_stream_usage_only.sse",
    "llama_server_completions_stream.sse",
    "llama_server_chat_stream.sse",
    "tfserve_completions_stream.sse",
    "tfserve_chat_stream.sse",
    "llcpp_py_completions_stream.sse",
    "llcpp_py_chat_stream.sse",
    "tfserve_cb_chat_stream_no_usage_requested.sse",
]


@pytest.mark.parametrize("name", TRANSCRIPTS)
def test_recorded_engine_streams_give_the_same_records(name: str) -> None:
    """Streams recorded from real engines (../shared/transcripts), re-framed with random
    HTTP chunking and read splits: both paths give the same record."""
    from tests.conftest import shared_path

    body = shared_path("transcripts", name).read_bytes()
    chat = "chat" in name
    rng = random.Random(name)
    taken = 0
    for _ in range(20):
        data, _ = _http(rng, body)
        if not data.endswith(b"0\r\n\r\n"):
            data += b"0\r\n\r\n"
        pieces = _split(rng, data)
        py, py_reads, py_kept = _run(pieces, compiled=False, chat=chat, close_at_end=True)
        c, c_reads, c_kept = _run(pieces, compiled=True, chat=chat, close_at_end=True)
        assert _comparable(c) == _comparable(py), name
        assert (c_reads, c_kept) == (py_reads, py_kept), name
        if b"[DONE]" in body:  # (servers without the marker are judged by their adapter's settings)
            assert py.ok, py.error_message
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        if block.startswith(b"data: {"):
            taken += fastpath.classify(block[6:], 2 if chat else 1) is not None
    if name.startswith("vllm_") and "usage_only" not in name:
        assert taken > 0, "vLLM's continuous-usage token events should be read in C"
    assert taken > 0, "every OpenAI stream shape's token events (usage per chunk, at the end, none) are read in C"
