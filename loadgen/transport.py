"""HTTP transports. A transport sends one call and feeds a recorder; nothing else.

The seam: ``await transport.send(call, sink)`` where ``sink`` has ``sent(ts)``,
``headers(ts, status, content_type)`` and ``data(ts, bytes)`` (and optionally
``progress_ns()``, for the stall timeout). Timestamps are ``perf_counter_ns``.
Errors raise ``StreamError`` with a classified type.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Literal, Protocol, get_args

import aiohttp

from adapters.base import HttpCall
from loadgen.recorder import StreamError

_now = time.perf_counter_ns


class Sink(Protocol):
    def sent(self, ts_ns: int) -> None: ...
    def headers(self, ts_ns: int, status: int, content_type: str = "") -> None: ...
    def data(self, ts_ns: int, data: bytes) -> None: ...


class Transport(Protocol):
    async def send(self, call: HttpCall, sink: Sink) -> None: ...
    async def close(self) -> None: ...
    def describe(self) -> dict[str, object]: ...


#: Seconds a kept-alive connection may stay idle and still be reused (both transports).
#: Servers close idle connections after their own keep-alive timeout (uvicorn's, behind
#: vLLM and SGLang, is 5 s); a request sent as the server closes is lost, never resent.
KEEPALIVE_IDLE_S = 2.0

#: Default total deadline of one request (``--request-timeout``), seconds: far above any
#: sane generation (32k tokens at 20 ms each take 11 min), short of hanging a run forever.
DEFAULT_TOTAL_S = 1800.0


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds. ``stall`` bounds the time without data: since the request was sent, or
    since the last SSE data payload (comments and keep-alives do not count); ``total``
    bounds the whole request (None: unbounded)."""

    connect: float = 10.0
    stall: float = 120.0
    total: float | None = DEFAULT_TOTAL_S


def progress_ns(sink: Sink, last_read_ns: int) -> int:
    """When ``sink``'s response last made progress (``RequestRecorder.progress_ns``), or
    its last read for a sink that does not say."""
    fn = getattr(sink, "progress_ns", None)
    return int(fn()) if fn is not None else last_read_ns


def overdue(now_ns: int, sent_ns: int, progress: int, last_read_ns: int, timeouts: Timeouts) -> StreamError | None:
    """The error of a request past its total deadline or without data for the stall timeout
    (the one rule of both transports' watchdogs), or None."""
    if timeouts.total is not None and now_ns - sent_ns > timeouts.total * 1e9:
        return StreamError("timeout", f"no complete response within the total deadline of {timeouts.total:g} s")
    if now_ns - progress > timeouts.stall * 1e9:
        only = " (only SSE comments or keep-alives)" if last_read_ns > progress else ""
        return StreamError("timeout", f"no data for {timeouts.stall:g} s{only}")
    return None


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
            ) as resp:
                entry.last_read_ns = now = _now()
                sink.headers(now, resp.status, resp.headers.get("Content-Type", ""))
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


#: Chunk-timestamp clocks (docs/instrument.md, Clocks): ``kernel`` is the kernel's receive
#: time (raw transport, Linux), ``user`` the time a read returned, ``auto`` the kernel's where
#: the platform has it and the user one elsewhere.
Clock = Literal["auto", "user", "kernel"]
CLOCKS: tuple[str, ...] = get_args(Clock)


def check_base_url(url: str) -> str:
    """``url`` when it is an engine's base URL (scheme, host, no API path), else a
    ValueError that says how to write it."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        guess = "http://" + url.split("://", 1)[-1]
        raise ValueError(f"--url {url!r}: give the scheme and host, e.g. {guess}")
    path = parts.path.rstrip("/")
    if path.lower().endswith("/v1"):
        root = url[: url.lower().rstrip("/").rfind("/v1")]
        raise ValueError(
            f"--url {url!r}: give the server's root ({root}); bench adds the API path "
            "(/v1/completions, /v1/chat/completions, ...) itself"
        )
    return url


def make_transport(kind: str, base_url: str, timeouts: Timeouts = Timeouts(), clock: str = "auto") -> Transport:
    """The transport for ``kind``: ``raw`` (bench's own), ``aiohttp``, or ``auto``.

    ``auto`` picks the raw transport for plain http and aiohttp for https (the raw one has
    no TLS). The kernel clock needs the raw transport; ``clock="auto"`` takes it wherever the
    raw transport runs on a platform that has it, and the user clock elsewhere.
    """
    if kind not in ("auto", "raw", "aiohttp"):
        raise ValueError(f"unknown transport {kind!r}: use auto, raw or aiohttp")
    if clock not in CLOCKS:
        raise ValueError(f"unknown clock {clock!r}: use {', '.join(CLOCKS)}")
    https = base_url.lower().startswith("https:")
    if kind == "auto":
        kind = "aiohttp" if https else "raw"
    if kind == "aiohttp":
        if clock == "kernel":
            raise ValueError("--clock kernel needs the raw transport (aiohttp cannot expose receive timestamps)")
        return AiohttpTransport(base_url, timeouts)
    from loadgen.rawhttp import RawHttpTransport

    return RawHttpTransport(base_url, timeouts, clock=clock)  # type: ignore[arg-type]
