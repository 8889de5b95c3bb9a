"""The aiohttp transport: for https, and as a reference for bench's own raw transport.

Implements ``loadgen.transport.Transport``; errors become ``StreamError`` with their class.
Its stall and total deadlines follow the same rule as the raw transport's (``overdue``).
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import aiohttp

from bench_llm.adapters.base import HttpCall
from bench_llm.loadgen.transport import (
    KEEPALIVE_IDLE_S,
    Sink,
    StreamError,
    Timeouts,
    overdue,
    progress_ns,
    redirect_error,
)

_now = time.perf_counter_ns


async def _on_sent(session: object, ctx: SimpleNamespace, params: object) -> None:
    sink = ctx.trace_request_ctx
    if sink is not None:
        sink.sent(_now())


class _InFlight:
    """One aiohttp request, as its watchdog sees it."""

    __slots__ = ("sink", "task", "sent_ns", "last_read_ns", "progress_ns", "error")

    def __init__(self, sink: Sink, task: asyncio.Task[object] | None) -> None:
        self.sink = sink
        self.task = task
        self.sent_ns = self.last_read_ns = self.progress_ns = _now()
        self.error: StreamError | None = None


class AiohttpTransport:
    """aiohttp with an unlimited connection pool (never a silent concurrency cap)."""

    def __init__(self, base_url: str, timeouts: Timeouts = Timeouts(), read_bufsize: int = 1 << 20) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts
        self.read_bufsize = read_bufsize
        self._session: aiohttp.ClientSession | None = None
        self._in_flight: set[_InFlight] = set()
        self._watchdog: asyncio.TimerHandle | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(_on_sent)
            trace.on_request_chunk_sent.append(_on_sent)
            connector = aiohttp.TCPConnector(
                limit=0, limit_per_host=0, ttl_dns_cache=None, enable_cleanup_closed=True,
                keepalive_timeout=KEEPALIVE_IDLE_S,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                trace_configs=[trace],
                # the stall and total deadlines are the watchdog's (``overdue``), as in the
                # raw transport: SSE comments must not count as data
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeouts.connect, sock_read=None),
                read_bufsize=self.read_bufsize,
                auto_decompress=False,
                trust_env=False,  # an ambient http_proxy must not capture loopback traffic
            )
        return self._session

    async def send(self, call: HttpCall, sink: Sink) -> None:
        session = self._get_session()
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().call_later(1.0, self._check_stalls)
        entry = _InFlight(sink, asyncio.current_task())
        self._in_flight.add(entry)
        try:
            await self._send(session, call, sink, entry)
        except asyncio.CancelledError:
            if entry.error is None:
                raise
            task = entry.task
            if task is not None:
                task.uncancel()  # the watchdog's cancel, turned into the request's error
            raise entry.error from None
        finally:
            self._in_flight.discard(entry)

    def _check_stalls(self) -> None:
        """Once a second: cancel requests without data for the stall timeout (SSE comments
        do not count) or past their total deadline; the same rule as the raw transport."""
        self._watchdog = None
        if self._session is None:
            return
        now = _now()
        stall = self.timeouts.stall * 1e9
        total = self.timeouts.total * 1e9 if self.timeouts.total is not None else None
        for entry in list(self._in_flight):
            if entry.error is not None or (
                now - entry.progress_ns <= stall and (total is None or now - entry.sent_ns <= total)
            ):
                continue
            entry.progress_ns = max(entry.progress_ns, progress_ns(entry.sink, entry.last_read_ns))
            err = overdue(now, entry.sent_ns, entry.progress_ns, entry.last_read_ns, self.timeouts)
            if err is not None and entry.task is not None:
                entry.error = err
                entry.task.cancel()
        self._watchdog = asyncio.get_running_loop().call_later(1.0, self._check_stalls)

    async def _send(self, session: aiohttp.ClientSession, call: HttpCall, sink: Sink, entry: _InFlight) -> None:
        try:
            async with session.request(
                call.method,
                self.base_url + call.path,
                data=call.body or None,
                headers=dict(call.headers),
                trace_request_ctx=sink,
                allow_redirects=False,  # a 3xx is a recorded failure (``redirect_error``)
            ) as resp:
                entry.last_read_ns = now = _now()
                sink.headers(now, resp.status, resp.headers.get("Content-Type", ""))
                redirect = redirect_error(resp.status, resp.headers.get("Location", ""))
                if redirect is not None:
                    raise redirect
                content = resp.content
                while True:
                    chunk = await content.readany()
                    if not chunk:
                        break
                    entry.last_read_ns = now = _now()
                    sink.data(now, chunk)
        except asyncio.TimeoutError as exc:
            raise StreamError("timeout", f"no data for {self.timeouts.stall:g} s (or connect/total timeout)") from exc
        except aiohttp.ClientConnectorError as exc:
            raise StreamError("connect", f"cannot connect to {self.base_url}: {exc.os_error}") from exc
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionResetError) as exc:
            raise StreamError("stream_reset", f"connection closed mid-response: {exc}") from exc
        except aiohttp.ClientResponseError as exc:
            raise StreamError("http_protocol", f"bad HTTP response: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise StreamError("client_error", f"{type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def describe(self) -> dict[str, object]:
        return {
            "transport": "aiohttp",
            "clock": "user",
            "aiohttp_version": aiohttp.__version__,
            "pool_limit": "unlimited",
            "timeouts": {"connect": self.timeouts.connect, "stall": self.timeouts.stall, "total": self.timeouts.total},
        }
