"""A misbehaving HTTP server on 127.0.0.1 (a thread in the test process), and one request
sent to it through each transport and recorded as a run would record it."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from bench_llm.launch.profiles import adapter_for_engine
from bench_llm.loadgen.aiohttp_transport import AiohttpTransport
from bench_llm.loadgen.recorder import MAX_EVENT_BYTES, RequestRecorder, StreamError
from bench_llm.loadgen.transport import Timeouts, Transport
from bench_llm.results.record import RequestRecord
from bench_llm.workloads.spec import RequestSpec

_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _completion_event(text: str, finish: str | None, completion_tokens: int | None) -> bytes:
    """One vLLM completions SSE event (with cumulative ``usage`` when ``completion_tokens``)."""
    obj: dict[str, object] = {"id": "c", "object": "text_completion",
                              "choices": [{"index": 0, "text": text, "finish_reason": finish}]}  # fmt: skip
    if completion_tokens is not None:
        obj["usage"] = {"prompt_tokens": 4, "completion_tokens": completion_tokens, "total_tokens": 4 + completion_tokens}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class HostileServer:
    """Answers every request in the way ``mode`` names; counts the requests it read."""

    def __init__(self, mode: str, deadline_s: float = 30.0) -> None:
        self.mode = mode
        self.deadline_s = deadline_s
        self.requests = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while self._read_request(conn):
                    self.requests += 1
                    if not self._answer(conn):
                        return
            except OSError:
                return

    def _read_request(self, conn: socket.socket) -> bool:
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return False
            buf += data
        head, _, body = buf.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
        while len(body) < length:
            body += conn.recv(65536)
        return True

    def _answer(self, conn: socket.socket) -> bool:
        """Answer one request; False when the connection is done."""
        end = time.monotonic() + self.deadline_s
        if self.mode == "close":  # the request went out; the server closes without a byte
            return False
        if self.mode == "notfound":  # vLLM's answer to an unknown model
            body = b'{"object":"error","message":"The model `my-model` does not exist.","type":"NotFoundError","code":404}'
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            return True
        if self.mode == "redirect":  # to another port (issue 33: never followed silently)
            conn.sendall(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://u:secret@127.0.0.1:9/v1/completions\r\n"
                         b"Content-Length: 0\r\n\r\n")
            return True
        if self.mode == "html":
            body = b"<html><body>Please log in</body></html>"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            return True
        conn.sendall(_SSE_HEAD)
        if self.mode == "comments":  # keep-alive comments, never any data
            while time.monotonic() < end:
                conn.sendall(_chunk(b": keep-alive\n\n"))
                time.sleep(0.05)
        elif self.mode == "slow_data":  # data, but never the end of the stream
            event = b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n'
            while time.monotonic() < end:
                conn.sendall(_chunk(event))
                time.sleep(0.05)
        elif self.mode in ("backwards", "after_done"):  # a whole stream that breaks its protocol
            usage = (1, 2, 3, 8, 2, 2, 2, 2) if self.mode == "backwards" else ()
            for i in range(len(usage) or 4):
                conn.sendall(_chunk(_completion_event("x", None, usage[i] if usage else None)))
            conn.sendall(_chunk(_completion_event("", "length", 4 if usage else None)))
            conn.sendall(_chunk(b"data: [DONE]\n\n"))
            if self.mode == "after_done":  # events after the end-of-stream marker
                for _ in range(4):
                    conn.sendall(_chunk(_completion_event("y", None, None)))
            conn.sendall(b"0\r\n\r\n")
            return True
        elif self.mode == "long_line":  # one line without end
            conn.sendall(_chunk(b"data: "))
            while time.monotonic() < end:
                conn.sendall(_chunk(b"x" * 65536))
        return False


@contextmanager
def hostile(mode: str) -> Iterator[HostileServer]:
    server = HostileServer(mode)
    try:
        yield server
    finally:
        server.close()


def make(kind: str, url: str, timeouts: Timeouts) -> Transport:
    """``raw`` (compiled read path where built), ``python`` (raw, pure Python) or ``aiohttp``."""
    from bench_llm.loadgen.rawhttp import RawHttpTransport

    if kind == "aiohttp":
        return AiohttpTransport(url, timeouts)
    return RawHttpTransport(url, timeouts, clock="user", compiled=kind == "raw")


async def record_one(
    transport: Transport, max_event_bytes: int = MAX_EVENT_BYTES, preconnect: bool = False
) -> RequestRecord:
    """One completions request as the runner sends and records it."""
    adapter = adapter_for_engine("vllm", model="m")
    spec = RequestSpec(request_id="r0", input_tokens=4, max_output_tokens=4, prompt="hi")
    rec = RequestRecorder(spec, adapter.parser(), 0, time.perf_counter_ns(), max_event_bytes=max_event_bytes)
    if preconnect:
        await transport.preconnect(1)  # type: ignore[attr-defined]
    error = None
    try:
        await transport.send(adapter.build(spec), rec)
    except StreamError as exc:
        error = exc
    finally:
        await transport.close()
    return rec.finish(time.perf_counter_ns(), error)


def run(coro: object) -> RequestRecord:
    return asyncio.run(coro)  # type: ignore[arg-type]
