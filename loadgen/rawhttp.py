"""bench's own lean HTTP/1.1 client transport, built for timing.

Why not aiohttp: every read there passes through a protocol object, a flow-controlled
stream reader and a task wake-up before user code sees it, and the send time can only
be caught from a trace hook. Here the socket is read straight from the event loop's
readiness callback, so per read the work is: ``recv``, one clock read, HTTP chunk
de-framing, one call into the sink. The send time is stamped right before the request
bytes are handed to the kernel socket, so that no stamp of the reply (least of all the
kernel's receive stamp) can be earlier than it.

Clocks: ``user`` or ``kernel`` (``loadgen.socket_clock``). Reading a response: its
connection and exchange (``loadgen.http1_response``). This module: the transport itself,
its pool of kept-alive connections, building and sending the requests, the stall watchdog.

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
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from bench_llm.adapters.base import HttpCall
from bench_llm.loadgen.http1_response import COMPILED_READER_BUILT, Connection, Exchange
from bench_llm.loadgen.socket_clock import SO_TIMESTAMPNS, kernel_timestamps_supported, realtime_offset_ns
from bench_llm.loadgen.transport import (
    CLOCKS,
    KEEPALIVE_IDLE_S,
    Clock,
    Sink,
    StreamError,
    Timeouts,
    overdue,
    progress_ns,
)

_now = time.perf_counter_ns


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
        if compiled and not COMPILED_READER_BUILT:
            compiled = False
        self.use_fast = compiled
        self._idle: list[Connection] = []
        self._active: set[Exchange] = set()
        self._addr: tuple[Any, ...] | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def clock(self) -> str:
        """The clock actually used: ``kernel`` or ``user``."""
        return "kernel" if self.kernel_clock else "user"

    # -- connections -------------------------------------------------------------------
    async def _connect(self, loop: asyncio.AbstractEventLoop) -> Connection:
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
        conn = Connection(sock, self)
        loop.add_reader(conn.fd, conn.readable)
        return conn

    async def preconnect(self, count: int, parallel: int = 64) -> int:
        """Open connections until ``count`` are idle in the pool, before the measurement,
        so a closed loop's first wave of sends is not delayed by connection set-up
        (``parallel`` at a time). Returns how many were opened; a failure to connect is
        left for the requests themselves to meet and record."""
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        # connections left idle since a warm-up would be closed at the first send, not reused
        oldest = _now() - int(KEEPALIVE_IDLE_S * 1e9)
        for conn in [c for c in self._idle if c.idle_since < oldest]:
            self._idle.remove(conn)
            self.discard(conn)
        opened = 0
        while len(self._idle) < count:
            batch = min(parallel, count - len(self._idle))
            results = await asyncio.gather(*(self._connect(loop) for _ in range(batch)), return_exceptions=True)
            conns = [c for c in results if isinstance(c, Connection)]
            for conn in conns:
                conn.reused = True  # a kept-alive connection the server may close
                self._idle.append(conn)
            opened += len(conns)
            if len(conns) < batch:
                break
        return opened

    def release(self, conn: Connection) -> None:
        conn.exchange = None
        if self._closed:
            self.discard(conn)
            return
        conn.reused = True
        conn.idle_since = _now()
        self._idle.append(conn)

    def _take_idle(self) -> Connection | None:
        """An idle connection young enough to reuse (older ones are closed), or None."""
        idle = self._idle
        oldest = _now() - int(KEEPALIVE_IDLE_S * 1e9)
        while idle:
            conn = idle.pop()
            if conn.idle_since >= oldest:
                return conn
            self.discard(conn)
        return None

    def idle_readable(self, conn: Connection) -> None:
        """An idle connection became readable: the server closed it (or sent junk)."""
        try:
            self._idle.remove(conn)
        except ValueError:
            pass
        self.discard(conn)

    def discard(self, conn: Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        conn.exchange = None
        try:
            self.loop.remove_reader(conn.fd)  # type: ignore[union-attr]
        except (ValueError, OSError, AttributeError):
            pass
        try:
            conn.sock.close()
        except OSError:
            pass

    def detach(self, ex: Exchange) -> None:
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
    def start(self, call: HttpCall, sink: Sink, on_complete: Callable[[], None] | None = None) -> Exchange | None:
        """Sends ``call`` now, synchronously, on an idle kept-alive connection: a freed
        closed-loop slot sends its next request from inside the read that freed it, not a
        loop iteration later behind every other read. None when there is no idle
        connection or it does not take the whole request at once (nothing usable went
        out: the caller uses ``send``). ``complete`` awaits the response."""
        loop = self.loop
        if loop is None or self._closed or not self._idle:
            return None
        conn = self._take_idle()
        if conn is None:
            return None
        payload = self._request_bytes(call)
        ex = Exchange(self, conn, sink, loop.create_future(), call.method == "HEAD")
        now = _now()  # before the write: no reply can be stamped earlier (docs/metrics.md)
        try:
            sent = conn.sock.send(payload)
        except (BlockingIOError, InterruptedError):
            self._idle.append(conn)
            return None
        except OSError:
            self.discard(conn)
            return None
        if sent < len(payload):  # half a request on the wire: this connection is spent
            self.discard(conn)
            return None
        ex.on_complete = on_complete
        conn.exchange = ex
        self._active.add(ex)
        ex.last_read_ns = ex.sent_ns = ex.progress_ns = now
        sink.sent(now)
        return ex

    async def complete(self, ex: Exchange, call: HttpCall, sink: Sink) -> None:
        """Awaits the response to a request ``start`` sent. A kept-alive connection the
        server had closed is retried once on another, as ``send`` does."""
        try:
            await ex.future
        except _StaleConnection:
            await self.send(call, sink, ex.on_complete)
        except asyncio.CancelledError:
            self.abort(ex)
            raise

    def abort(self, ex: Exchange) -> None:
        """Drops a request nobody will await any more (cancelled, or sent by ``start`` for
        a slot whose run stopped): no callbacks after this, the events read so far stay."""
        ex.on_complete = None
        if ex.fast is not None:
            ex.fast.close()
        self.detach(ex)
        self.discard(ex.conn)

    async def send(self, call: HttpCall, sink: Sink, on_complete: Callable[[], None] | None = None) -> None:
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
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
        conn: Connection,
        payload: bytes,
        sink: Sink,
        head_only: bool,
        on_complete: Callable[[], None] | None = None,
    ) -> None:
        future: asyncio.Future[None] = loop.create_future()
        ex = Exchange(self, conn, sink, future, head_only)
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
            self.detach(ex)
            self.discard(conn)
            if conn.reused:
                raise _StaleConnection() from None
            raise StreamError("stream_reset", f"send failed: {exc}") from None
        if sent < len(payload):
            try:
                await loop.sock_sendall(sock, payload[sent:])
            except OSError as exc:
                self.detach(ex)
                self.discard(conn)
                if conn.reused:
                    raise _StaleConnection() from None
                raise StreamError("stream_reset", f"send failed: {exc}") from None
            except asyncio.CancelledError:
                self.detach(ex)
                self.discard(conn)
                raise
        ex.last_read_ns = ex.sent_ns = ex.progress_ns = now
        sink.sent(now)
        try:
            await future
        except asyncio.CancelledError:
            self.abort(ex)
            raise

    def _arm_watchdog(self) -> None:
        loop = self.loop
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
            ex.fail(err)
        self._arm_watchdog()

    async def close(self) -> None:
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for ex in list(self._active):
            ex.fail(StreamError("cancelled", "transport closed"))
        for conn in self._idle:
            self.discard(conn)
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
