"""Reading one HTTP/1.1 response for the raw transport (``loadgen.rawhttp``): the connection
that routes its socket's reads, and the exchange that parses them.

Per read the work is: ``recv`` (``recvmsg`` for a kernel stamp, ``loadgen.socket_clock``), one
clock read, HTTP chunk de-framing, one call into the sink. Once a streamed body's parser offers
a scan, the compiled reader (``loadgen._fastpath``) takes the body over from the Python one.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from bench_llm.loadgen.socket_clock import ANC_SIZE, TIMESPEC
from bench_llm.loadgen.transport import FastSink, Sink, StreamError, fast_sink, redirect_error

try:  # the compiled per-chunk path (setup.py builds it where a C compiler is present)
    from bench_llm.loadgen import _fastpath
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _fastpath = None  # type: ignore[assignment]
#: Whether the compiled reader is built here (``RawHttpTransport(compiled=...)`` falls back to Python without it).
COMPILED_READER_BUILT = _fastpath is not None

_now = time.perf_counter_ns

#: Bytes asked of one recv. Python allocates this much per call before trimming: above
#: glibc's mmap threshold (128 KiB) every read would pay an mmap/munmap pair (measured
#: ~20 us per read against ~2.5 us at 64 KiB). Longer responses just take more reads.
_READ_SIZE = 1 << 16

#: The parser's states: the head, a chunked body's parts, a Content-Length body, a body read until close, done.
_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _CHUNK_TRAILER, _LENGTH, _UNTIL_CLOSE, _DONE = range(8)


class ConnectionPool(Protocol):
    """What a connection and its exchange need of the transport that owns them (``RawHttpTransport``)."""

    loop: asyncio.AbstractEventLoop | None
    kernel_clock: bool
    offset_ns: int
    user_fallback_reads: int
    use_fast: bool

    def release(self, conn: Connection) -> None: ...
    def discard(self, conn: Connection) -> None: ...
    def detach(self, ex: Exchange) -> None: ...
    def idle_readable(self, conn: Connection) -> None: ...


class Connection:
    """One kept-alive connection. Its reader stays registered for the connection's life
    (no epoll_ctl per request) and routes reads to the current exchange; a read on an
    idle connection means the server closed it."""

    __slots__ = ("sock", "fd", "reused", "exchange", "transport", "closed", "idle_since")

    def __init__(self, sock: socket.socket, transport: ConnectionPool) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.reused = False
        self.idle_since = _now()
        self.exchange: Exchange | None = None
        self.transport = transport
        self.closed = False

    def readable(self) -> None:
        ex = self.exchange
        if ex is not None:
            ex.on_readable()
        else:
            self.transport.idle_readable(self)


class Exchange:
    """One request/response on one connection: the readiness callback and its parser."""

    __slots__ = (
        "transport",
        "conn",
        "sink",
        "future",
        "state",
        "buf",
        "remaining",
        "keep_alive",
        "got_bytes",
        "last_read_ns",
        "sent_ns",
        "progress_ns",
        "head_only",
        "fast",
        "fast_sink",
        "on_complete",
    )

    def __init__(self, transport: ConnectionPool, conn: Connection, sink: Sink, future: asyncio.Future[None], head_only: bool) -> None:
        self.transport = transport
        self.conn = conn
        self.sink = sink
        self.future = future
        self.state = _HEAD
        self.buf = b""
        self.remaining = 0
        self.keep_alive = True
        self.got_bytes = False
        self.last_read_ns = self.sent_ns = self.progress_ns = _now()
        self.head_only = head_only
        #: The compiled reader of this response's body, once it took over (``_start_fast``).
        self.fast: Any = None
        #: The sink as the compiled reader sees it (the same object as ``sink``).
        self.fast_sink: FastSink | None = None
        #: Called once the response completed and its connection is idle again, before the
        #: sender wakes (a closed-loop slot sends its next request from here: ``start``).
        self.on_complete: Callable[[], None] | None = None

    # -- the hot path ------------------------------------------------------------------
    def on_readable(self) -> None:
        t = self.transport
        try:
            if t.kernel_clock:
                data, anc, _flags, _addr = self.conn.sock.recvmsg(_READ_SIZE, ANC_SIZE)
                now = _now()
                if anc:
                    ts = TIMESPEC.unpack_from(anc[0][2])
                    ts_ns = ts[0] * 1_000_000_000 + ts[1] - t.offset_ns
                    # never after the moment we read it (guards against offset noise)
                    if ts_ns > now:
                        ts_ns = now
                else:
                    ts_ns = now
                    t.user_fallback_reads += 1
            else:
                data = self.conn.sock.recv(_READ_SIZE)
                ts_ns = _now()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.fail(StreamError("stream_reset", f"connection error mid-response: {exc}"))
            return
        self.last_read_ns = ts_ns
        if not data:
            self._eof()
            return
        self.got_bytes = True
        state = self.state
        try:
            if state == _CHUNK_SIZE and not self.buf:
                # Fast path: the read is exactly one whole HTTP chunk (the usual case for SSE).
                nl = data.find(b"\r\n")
                try:
                    size = int(data[:nl], 16) if 0 < nl <= 8 else -1
                except ValueError:  # a chunk extension: the general path copes
                    size = -1
                if size > 0 and len(data) == nl + size + 4 and data[-2:] == b"\r\n":
                    out = data[nl + 2 : -2]
                else:
                    out = self._dechunk(data)
            elif state == _HEAD:
                self._head(ts_ns, data)
                return
            elif state == _LENGTH:
                out = data[: self.remaining]
                self.remaining -= len(out)
                if self.remaining <= 0:
                    self.state = _DONE
            elif state == _UNTIL_CLOSE:
                out = data
            else:
                out = self._dechunk(self.buf + data)
        except StreamError as exc:
            self.fail(exc)
            return
        if out:
            self.sink.data(ts_ns, out)
        if self.state == _DONE:
            self._complete()

    def _dechunk(self, data: bytes) -> bytes:
        """Strip HTTP/1.1 chunked framing; keeps any partial frame in ``buf``."""
        out: list[bytes] = []
        pos = 0
        end = len(data)
        state = self.state
        remaining = self.remaining
        while pos < end:
            if state == _CHUNK_SIZE:
                nl = data.find(b"\r\n", pos)
                if nl < 0:
                    if end - pos > 4096:  # a size line never ends (the compiled reader's bound too)
                        self.buf = b""
                        raise StreamError("http_protocol", f"bad chunk size line {data[pos:pos + 40]!r}")
                    break
                line = data[pos:nl]
                semi = line.find(b";")
                try:
                    size = int(line if semi < 0 else line[:semi], 16)
                except ValueError:
                    self.buf = b""
                    raise StreamError("http_protocol", f"bad chunk size line {line[:40]!r}") from None
                pos = nl + 2
                if size == 0:
                    state = _CHUNK_TRAILER
                    continue
                if end - pos >= size + 2:  # whole chunk present
                    out.append(data[pos : pos + size])
                    pos += size + 2
                    continue
                remaining = size
                state = _CHUNK_DATA
            elif state == _CHUNK_DATA:
                take = min(remaining, end - pos)
                out.append(data[pos : pos + take])
                pos += take
                remaining -= take
                if remaining:
                    break
                remaining = 2
                state = _CHUNK_CRLF
            elif state == _CHUNK_CRLF:  # the CRLF that closes a data chunk
                skip = min(remaining, end - pos)
                pos += skip
                remaining -= skip
                if remaining == 0:
                    state = _CHUNK_SIZE
            else:  # _CHUNK_TRAILER: optional trailer lines, then an empty line
                nl = data.find(b"\r\n", pos)
                if nl < 0:
                    break
                if nl == pos:
                    state = _DONE
                    pos = nl + 2
                    break
                pos = nl + 2
        self.state = state
        self.remaining = remaining
        self.buf = data[pos:] if pos < end and state != _DONE else b""
        if state == _DONE and pos < end:
            self.keep_alive = False  # bytes past the response: do not reuse
        if not out:
            return b""
        return out[0] if len(out) == 1 else b"".join(out)

    # -- the head, once per response ---------------------------------------------------
    def _head(self, ts_ns: int, data: bytes) -> None:
        """Parse the response head (status line and headers) once it has fully arrived.

        Kept as one function on purpose (over ~80 lines): it runs once per request on the
        path whose timing bench reports, and splitting it into steps would add calls there.
        """
        buf = self.buf + data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > 65536:
                self.fail(StreamError("http_protocol", "response head larger than 64 KiB"))
                return
            self.buf = buf
            return
        lines = buf[:end].split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        try:
            if not status_line[0].startswith(b"HTTP/1."):
                raise ValueError
            status = int(status_line[1])
        except (ValueError, IndexError):
            self.fail(StreamError("http_protocol", f"bad status line {lines[0][:60]!r}"))
            return
        if 100 <= status < 200:  # interim response (100 Continue): wait for the real one
            self.buf = buf[end + 4 :]
            if self.buf:
                self._head(ts_ns, b"")
            return
        length: int | None = None
        chunked = False
        content_type = ""
        location = ""
        keep_alive = status_line[0] == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    length = int(value.strip())
                except ValueError:
                    self.fail(StreamError("http_protocol", "bad Content-Length"))
                    return
            elif name == b"content-type":
                content_type = value.strip().decode("latin-1")
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                v = value.strip().lower()
                keep_alive = v == b"keep-alive" or (keep_alive and v != b"close")
            elif name == b"location":
                location = value.strip().decode("latin-1")
        self.keep_alive = keep_alive
        self.sink.headers(ts_ns, status, content_type)
        if 300 <= status < 400:
            redirect = redirect_error(status, location)
            if redirect is not None:
                self.keep_alive = False
                self.fail(redirect)
                return
        rest = buf[end + 4 :]
        self.buf = b""
        if self.head_only or status in (204, 304):
            self.state = _DONE
        elif chunked:
            self.state = _CHUNK_SIZE
        elif length is not None:
            self.state = _LENGTH
            self.remaining = length
            if length == 0:
                self.state = _DONE
        else:
            self.state = _UNTIL_CLOSE
            self.keep_alive = False
        sink = fast_sink(self.sink) if self.state == _CHUNK_SIZE and 200 <= status < 300 and self.transport.use_fast else None
        if sink is not None:
            api = sink.fast_api
            if api:
                self._start_fast(sink, api, ts_ns, rest)
                return
        if rest and self.state != _DONE:
            try:
                if self.state == _LENGTH:
                    out = rest[: self.remaining]
                    self.remaining -= len(out)
                    if self.remaining <= 0:
                        self.state = _DONE
                elif self.state == _UNTIL_CLOSE:
                    out = rest
                else:
                    out = self._dechunk(rest)
            except StreamError as exc:
                self.fail(exc)
                return
            if out:
                self.sink.data(ts_ns, out)
        if self.state == _DONE:
            self._complete()

    # -- the compiled path --------------------------------------------------------------
    def _start_fast(self, sink: FastSink, api: int, ts_ns: int, rest: bytes) -> None:
        """Hand the body to ``loadgen._fastpath``: its reader replaces the Python one for
        this response and calls ``_fast_end`` when the response ends, however it ends."""
        t = self.transport
        conn = self.conn
        fast = _fastpath.FastStream(conn.fd, t.kernel_clock, t.offset_ns, api, sink, self._fast_end, sink.max_event_bytes)
        self.fast = fast
        self.fast_sink = sink
        sink.use_fast(fast)
        if rest:
            fast.feed(ts_ns, rest)
        if not fast.ended:
            t.loop.add_reader(conn.fd, fast.readable)  # type: ignore[union-attr]

    def _fast_end(self, code: int, message: str | None, keep_alive: bool) -> None:
        fast = self.fast
        t = self.transport
        self.last_read_ns = fast.last_read_ns
        if fast.last_data_ns >= 0 and self.fast_sink is not None:
            self.fast_sink.last_data_ns = fast.last_data_ns
        t.user_fallback_reads += fast.fallback_reads
        if code == 0:
            self.keep_alive = self.keep_alive and keep_alive
            self.state = _DONE
            if self.keep_alive and not self.conn.closed:
                t.loop.add_reader(self.conn.fd, self.conn.readable)  # type: ignore[union-attr]
            self._complete()
        elif code == 1:
            self.fail(StreamError("stream_reset", "connection closed mid-response"))
        elif code == 2:
            self.fail(StreamError("stream_reset", f"connection error mid-response: {message}"))
        elif code == 3:
            self.fail(StreamError("http_protocol", message or "bad chunked framing"))
        elif code == 5:
            self.fail(StreamError("line_too_long", message or "an SSE event or line too long"))
        else:  # an error of the client's own while reading (recorded, never dropped)
            self.fail(StreamError("client_error", message or "error in the compiled reader"))

    # -- endings -----------------------------------------------------------------------
    def _eof(self) -> None:
        if self.state == _UNTIL_CLOSE:
            self.keep_alive = False
            self._complete()
        elif not self.got_bytes:
            # the request went out: the server may have acted on it, so it is not sent again
            self.fail(StreamError(
                "closed_before_response", "the server closed the connection before answering (request not retried)"
            ))
        else:
            self.fail(StreamError("stream_reset", "connection closed mid-response"))

    def _complete(self) -> None:
        if self.fast is not None:
            self.fast.close()
        t = self.transport
        t.detach(self)
        if self.keep_alive:
            t.release(self.conn)
        else:
            t.discard(self.conn)
        cb = self.on_complete
        if cb is not None:
            self.on_complete = None
            cb()
        if not self.future.done():
            self.future.set_result(None)

    def fail(self, exc: BaseException) -> None:
        if self.fast is not None:
            self.fast.close()
        t = self.transport
        t.detach(self)
        t.discard(self.conn)
        if not self.future.done():
            self.future.set_exception(exc)
