"""bench's own lean HTTP/1.1 client transport, built for timing.

Why not aiohttp: every read there passes through a protocol object, a flow-controlled
stream reader and a task wake-up before user code sees it, and the send time can only
be caught from a trace hook. Here the socket is read straight from the event loop's
readiness callback, so per read the work is: ``recv``, one clock read, HTTP chunk
de-framing, one call into the sink. The send time is stamped right before the request
bytes are handed to the kernel socket, so that no stamp of the reply (least of all the
kernel's receive stamp) can be earlier than it.

Clocks:
``user``   ``perf_counter_ns()`` taken right after ``recv`` returned.
``kernel`` the kernel's receive timestamp of the data (``SO_TIMESTAMPNS`` read with
           ``recvmsg``): when the last packet of the read reached the socket, however
           late the client gets round to reading it. The kernel stamps CLOCK_REALTIME;
           it is converted to the monotonic ``perf_counter_ns`` timeline with an offset
           re-measured every second. Where the platform gives no timestamp for a read,
           that read falls back to the user stamp and is counted (``describe()``).

Connections are kept alive and reused (a freed closed-loop slot sends at once), but not
once idle for ``KEEPALIVE_IDLE_S``: servers close idle connections after their own
keep-alive timeout, and a request sent on a connection the server is closing is lost. A
request is never sent twice: one whose connection closes before the first response byte
is recorded as failed (``closed_before_response``); only a send the kernel refused (no
byte of the request left) goes out again on a fresh connection. One stall watchdog per transport (not one timer per
read) enforces the silence timeout.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from bench_llm.adapters.base import HttpCall
from bench_llm.loadgen.transport import (
    CLOCKS,
    KEEPALIVE_IDLE_S,
    Clock,
    FastSink,
    Sink,
    StreamError,
    Timeouts,
    fast_sink,
    overdue,
    progress_ns,
    redirect_error,
)

try:  # the compiled per-chunk path (setup.py builds it where a C compiler is present)
    from bench_llm.loadgen import _fastpath
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _fastpath = None  # type: ignore[assignment]

_now = time.perf_counter_ns

#: Linux values (not exported by Python's socket module).
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@qq")
#: Bytes asked of one recv. Python allocates this much per call before trimming: above
#: glibc's mmap threshold (128 KiB) every read would pay an mmap/munmap pair (measured
#: ~20 us per read against ~2.5 us at 64 KiB). Longer responses just take more reads.
_READ_SIZE = 1 << 16
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0

_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_CRLF, _CHUNK_TRAILER, _LENGTH, _UNTIL_CLOSE, _DONE = range(8)


def kernel_timestamps_supported() -> bool:
    """True when this platform can stamp received TCP data in the kernel."""
    if not sys.platform.startswith("linux") or not hasattr(socket.socket, "recvmsg"):
        return False
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return True
    except OSError:
        return False
    finally:
        s.close()


def realtime_offset_ns(samples: int = 5) -> int:
    """CLOCK_REALTIME minus the perf_counter clock, from the tightest of a few reads."""
    best_width = None
    offset = 0
    for _ in range(samples):
        a = _now()
        r = time.time_ns()
        b = _now()
        if best_width is None or b - a < best_width:
            best_width = b - a
            offset = r - (a + b) // 2
    return offset


class _Conn:
    """One kept-alive connection. Its reader stays registered for the connection's life
    (no epoll_ctl per request) and routes reads to the current exchange; a read on an
    idle connection means the server closed it."""

    __slots__ = ("sock", "fd", "reused", "exchange", "transport", "closed", "idle_since")

    def __init__(self, sock: socket.socket, transport: RawHttpTransport) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.reused = False
        self.idle_since = _now()
        self.exchange: _Exchange | None = None
        self.transport = transport
        self.closed = False

    def readable(self) -> None:
        ex = self.exchange
        if ex is not None:
            ex.on_readable()
        else:
            self.transport._idle_readable(self)


class _Exchange:
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

    def __init__(self, transport: RawHttpTransport, conn: _Conn, sink: Sink, future: asyncio.Future[None], head_only: bool) -> None:
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
                data, anc, _flags, _addr = self.conn.sock.recvmsg(_READ_SIZE, _ANC_SIZE)
                now = _now()
                if anc:
                    ts = _TIMESPEC.unpack_from(anc[0][2])
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
            self._fail(StreamError("stream_reset", f"connection error mid-response: {exc}"))
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
            self._fail(exc)
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
                self._fail(StreamError("http_protocol", "response head larger than 64 KiB"))
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
            self._fail(StreamError("http_protocol", f"bad status line {lines[0][:60]!r}"))
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
                    self._fail(StreamError("http_protocol", "bad Content-Length"))
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
                self._fail(redirect)
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
                self._fail(exc)
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
            t._loop.add_reader(conn.fd, fast.readable)  # type: ignore[union-attr]

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
                t._loop.add_reader(self.conn.fd, self.conn.readable)  # type: ignore[union-attr]
            self._complete()
        elif code == 1:
            self._fail(StreamError("stream_reset", "connection closed mid-response"))
        elif code == 2:
            self._fail(StreamError("stream_reset", f"connection error mid-response: {message}"))
        elif code == 3:
            self._fail(StreamError("http_protocol", message or "bad chunked framing"))
        elif code == 5:
            self._fail(StreamError("line_too_long", message or "an SSE event or line too long"))
        else:  # an error of the client's own while reading (recorded, never dropped)
            self._fail(StreamError("client_error", message or "error in the compiled reader"))

    # -- endings -----------------------------------------------------------------------
    def _eof(self) -> None:
        if self.state == _UNTIL_CLOSE:
            self.keep_alive = False
            self._complete()
        elif not self.got_bytes:
            # the request went out: the server may have acted on it, so it is not sent again
            self._fail(StreamError(
                "closed_before_response", "the server closed the connection before answering (request not retried)"
            ))
        else:
            self._fail(StreamError("stream_reset", "connection closed mid-response"))

    def _complete(self) -> None:
        if self.fast is not None:
            self.fast.close()
        t = self.transport
        t._detach(self)
        if self.keep_alive:
            t._release(self.conn)
        else:
            t._discard(self.conn)
        cb = self.on_complete
        if cb is not None:
            self.on_complete = None
            cb()
        if not self.future.done():
            self.future.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.fast is not None:
            self.fast.close()
        t = self.transport
        t._detach(self)
        t._discard(self.conn)
        if not self.future.done():
            self.future.set_exception(exc)


class _StaleConnection(Exception):
    """A kept-alive connection the server had already closed, found when sending on it: no
    byte of the request left, so it is sent on a fresh connection."""


def basic_auth_line(parts: SplitResult) -> bytes:
    """The ``Authorization: Basic`` header line of a URL with credentials (``http://u:p@h``), else b""."""
    if parts.username is None:
        return b""
    import base64

    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    return b"Authorization: Basic " + base64.b64encode(pair) + b"\r\n"


class RawHttpTransport:
    """The lean transport (see the module docstring). Plain HTTP only (no TLS)."""

    def __init__(
        self, base_url: str, timeouts: Timeouts = Timeouts(), clock: Clock = "user", compiled: bool | None = None
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http":
            raise ValueError(f"the raw transport speaks plain http only, not {parts.scheme!r} (use the aiohttp transport)")
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, not {clock!r}")
        self.base_url = base_url.rstrip("/")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        # credentials in the URL travel as HTTP Basic authentication (as aiohttp sends them),
        # never in the Host header
        host_header = parts.netloc.rpartition("@")[2]
        self._host_line = f"Host: {host_header}\r\n".encode() + basic_auth_line(parts)
        self.timeouts = timeouts
        self.requested_clock: Clock = clock
        # "auto" and "kernel" alike: kernel stamps where the platform has them, else user ones
        self.kernel_clock = clock != "user" and kernel_timestamps_supported()
        self.offset_ns = realtime_offset_ns() if self.kernel_clock else 0
        self.user_fallback_reads = 0
        self.connections_opened = 0
        #: Whether response bodies are read by ``loadgen._fastpath`` when the recorder's
        #: parser offers a scan (default: when built, unless BENCH_PURE_PYTHON is set).
        if compiled is None:
            compiled = not os.environ.get("BENCH_PURE_PYTHON")
        if compiled and _fastpath is None:
            compiled = False
        self.use_fast = compiled
        self._idle: list[_Conn] = []
        self._active: set[_Exchange] = set()
        self._addr: tuple[Any, ...] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def clock(self) -> str:
        """The clock actually used: ``kernel`` or ``user``."""
        return "kernel" if self.kernel_clock else "user"

    # -- connections -------------------------------------------------------------------
    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Conn:
        if self._addr is None:
            infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            if not infos:
                raise StreamError("connect", f"cannot resolve {self.host}")
            family, _, _, _, addr = infos[0]
            # the whole address: an IPv6 one carries flow info and the scope id a
            # link-local address (fe80::...%eth0) needs
            self._addr = tuple(addr)
            self._family = family
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.kernel_clock:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            await asyncio.wait_for(loop.sock_connect(sock, self._addr), self.timeouts.connect)
        except asyncio.TimeoutError:
            sock.close()
            raise StreamError("connect", f"cannot connect to {self.base_url}: timed out") from None
        except OSError as exc:
            sock.close()
            raise StreamError("connect", f"cannot connect to {self.base_url}: {exc}") from None
        except BaseException:
            sock.close()
            raise
        self.connections_opened += 1
        conn = _Conn(sock, self)
        loop.add_reader(conn.fd, conn.readable)
        return conn

    async def preconnect(self, count: int, parallel: int = 64) -> int:
        """Open connections until ``count`` are idle in the pool, before the measurement,
        so a closed loop's first wave of sends is not delayed by connection set-up
        (``parallel`` at a time). Returns how many were opened; a failure to connect is
        left for the requests themselves to meet and record."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        # connections left idle since a warm-up would be closed at the first send, not reused
        oldest = _now() - int(KEEPALIVE_IDLE_S * 1e9)
        for conn in [c for c in self._idle if c.idle_since < oldest]:
            self._idle.remove(conn)
            self._discard(conn)
        opened = 0
        while len(self._idle) < count:
            batch = min(parallel, count - len(self._idle))
            results = await asyncio.gather(*(self._connect(loop) for _ in range(batch)), return_exceptions=True)
            conns = [c for c in results if isinstance(c, _Conn)]
            for conn in conns:
                conn.reused = True  # a kept-alive connection the server may close
                self._idle.append(conn)
            opened += len(conns)
            if len(conns) < batch:
                break
        return opened

    def _release(self, conn: _Conn) -> None:
        conn.exchange = None
        if self._closed:
            self._discard(conn)
            return
        conn.reused = True
        conn.idle_since = _now()
        self._idle.append(conn)

    def _take_idle(self) -> _Conn | None:
        """An idle connection young enough to reuse (older ones are closed), or None."""
        idle = self._idle
        oldest = _now() - int(KEEPALIVE_IDLE_S * 1e9)
        while idle:
            conn = idle.pop()
            if conn.idle_since >= oldest:
                return conn
            self._discard(conn)
        return None

    def _idle_readable(self, conn: _Conn) -> None:
        """An idle connection became readable: the server closed it (or sent junk)."""
        try:
            self._idle.remove(conn)
        except ValueError:
            pass
        self._discard(conn)

    def _discard(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        conn.exchange = None
        try:
            self._loop.remove_reader(conn.fd)  # type: ignore[union-attr]
        except (ValueError, OSError, AttributeError):
            pass
        try:
            conn.sock.close()
        except OSError:
            pass

    def _detach(self, ex: _Exchange) -> None:
        self._active.discard(ex)
        if ex.conn.exchange is ex:
            ex.conn.exchange = None

    def _request_bytes(self, call: HttpCall) -> bytes:
        head = [f"{call.method} {self.prefix}{call.path} HTTP/1.1\r\n".encode(), self._host_line]
        for name, value in call.headers:
            head.append(f"{name}: {value}\r\n".encode())
        head.append(f"Content-Length: {len(call.body)}\r\nAccept: text/event-stream, */*\r\n\r\n".encode())
        return b"".join(head) + call.body

    # -- the seam ----------------------------------------------------------------------
    def start(self, call: HttpCall, sink: Sink, on_complete: Callable[[], None] | None = None) -> _Exchange | None:
        """Sends ``call`` now, synchronously, on an idle kept-alive connection: a freed
        closed-loop slot sends its next request from inside the read that freed it, not a
        loop iteration later behind every other read. None when there is no idle
        connection or it does not take the whole request at once (nothing usable went
        out: the caller uses ``send``). ``complete`` awaits the response."""
        loop = self._loop
        if loop is None or self._closed or not self._idle:
            return None
        conn = self._take_idle()
        if conn is None:
            return None
        payload = self._request_bytes(call)
        ex = _Exchange(self, conn, sink, loop.create_future(), call.method == "HEAD")
        now = _now()  # before the write: no reply can be stamped earlier (docs/metrics.md)
        try:
            sent = conn.sock.send(payload)
        except (BlockingIOError, InterruptedError):
            self._idle.append(conn)
            return None
        except OSError:
            self._discard(conn)
            return None
        if sent < len(payload):  # half a request on the wire: this connection is spent
            self._discard(conn)
            return None
        ex.on_complete = on_complete
        conn.exchange = ex
        self._active.add(ex)
        ex.last_read_ns = ex.sent_ns = ex.progress_ns = now
        sink.sent(now)
        return ex

    async def complete(self, ex: _Exchange, call: HttpCall, sink: Sink) -> None:
        """Awaits the response to a request ``start`` sent. A kept-alive connection the
        server had closed is retried once on another, as ``send`` does."""
        try:
            await ex.future
        except _StaleConnection:
            await self.send(call, sink, ex.on_complete)
        except asyncio.CancelledError:
            self.abort(ex)
            raise

    def abort(self, ex: _Exchange) -> None:
        """Drops a request nobody will await any more (cancelled, or sent by ``start`` for
        a slot whose run stopped): no callbacks after this, the events read so far stay."""
        ex.on_complete = None
        if ex.fast is not None:
            ex.fast.close()
        self._detach(ex)
        self._discard(ex.conn)

    async def send(self, call: HttpCall, sink: Sink, on_complete: Callable[[], None] | None = None) -> None:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        if self._watchdog is None:
            self._arm_watchdog()
        payload = self._request_bytes(call)
        for attempt in (0, 1):
            conn = self._take_idle() or await self._connect(loop)
            try:
                await self._exchange(loop, conn, payload, sink, call.method == "HEAD", on_complete)
                return
            except _StaleConnection:
                if attempt:
                    raise StreamError("stream_reset", "connection closed before any response byte") from None

    async def _exchange(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: _Conn,
        payload: bytes,
        sink: Sink,
        head_only: bool,
        on_complete: Callable[[], None] | None = None,
    ) -> None:
        future: asyncio.Future[None] = loop.create_future()
        ex = _Exchange(self, conn, sink, future, head_only)
        ex.on_complete = on_complete
        conn.exchange = ex
        self._active.add(ex)
        sock = conn.sock
        now = _now()  # before the write: no reply can be stamped earlier (docs/metrics.md)
        try:
            sent = sock.send(payload)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._detach(ex)
            self._discard(conn)
            if conn.reused:
                raise _StaleConnection() from None
            raise StreamError("stream_reset", f"send failed: {exc}") from None
        if sent < len(payload):
            try:
                await loop.sock_sendall(sock, payload[sent:])
            except OSError as exc:
                self._detach(ex)
                self._discard(conn)
                if conn.reused:
                    raise _StaleConnection() from None
                raise StreamError("stream_reset", f"send failed: {exc}") from None
            except asyncio.CancelledError:
                self._detach(ex)
                self._discard(conn)
                raise
        ex.last_read_ns = ex.sent_ns = ex.progress_ns = now
        sink.sent(now)
        try:
            await future
        except asyncio.CancelledError:
            self.abort(ex)
            raise

    def _arm_watchdog(self) -> None:
        loop = self._loop
        assert loop is not None
        self._watchdog = loop.call_later(1.0, self._check_stalls)

    def _check_stalls(self) -> None:
        """Once a second: fail exchanges without data for longer than the stall timeout
        (SSE comments do not count) or past their total deadline (``overdue``)."""
        if self._closed:
            return
        if self.kernel_clock:
            self.offset_ns = realtime_offset_ns()
        timeouts = self.timeouts
        limit = int(timeouts.stall * 1e9)
        total = int(timeouts.total * 1e9) if timeouts.total is not None else None
        now = _now()
        for e in self._active:
            if e.fast is not None:  # the compiled reader keeps its own stamps and offset
                e.last_read_ns = e.fast.last_read_ns
                e.fast.offset_ns = self.offset_ns
        failing = []
        for ex in self._active:
            if ex.future.done() or (now - ex.progress_ns <= limit and (total is None or now - ex.sent_ns <= total)):
                continue
            # quiet for the whole stall timeout as far as known: ask the sink (this digests
            # its reads), at most once a second per such exchange
            ex.progress_ns = max(ex.progress_ns, progress_ns(ex.sink, ex.last_read_ns))
            err = overdue(now, ex.sent_ns, ex.progress_ns, ex.last_read_ns, timeouts)
            if err is not None:
                failing.append((ex, err))
        for ex, err in failing:
            ex._fail(err)
        self._arm_watchdog()

    async def close(self) -> None:
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for ex in list(self._active):
            ex._fail(StreamError("cancelled", "transport closed"))
        for conn in self._idle:
            self._discard(conn)
        self._idle.clear()

    def describe(self) -> dict[str, object]:
        return {
            "transport": "raw",
            "clock": self.clock,
            "clock_requested": self.requested_clock,
            "read_path": "compiled" if self.use_fast else "python",
            "kernel_reads_without_timestamp": self.user_fallback_reads,
            "connections_opened": self.connections_opened,
            "pool_limit": "unlimited",
            "timeouts": {"connect": self.timeouts.connect, "stall": self.timeouts.stall, "total": self.timeouts.total},
        }
