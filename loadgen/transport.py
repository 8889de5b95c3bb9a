"""HTTP transports. A transport sends one call and feeds a recorder; nothing else.

The seam: ``await transport.send(call, sink)`` where ``sink`` has ``sent(ts)``,
``headers(ts, status)`` and ``data(ts, bytes)``. Timestamps are ``perf_counter_ns``.
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
    def headers(self, ts_ns: int, status: int) -> None: ...
    def data(self, ts_ns: int, data: bytes) -> None: ...


class Transport(Protocol):
    async def send(self, call: HttpCall, sink: Sink) -> None: ...
    async def close(self) -> None: ...
    def describe(self) -> dict[str, object]: ...


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds. ``stall`` bounds the silence between two reads (and before the first)."""

    connect: float = 10.0
    stall: float = 120.0
    total: float | None = None


async def _on_sent(session: object, ctx: SimpleNamespace, params: object) -> None:
    sink = ctx.trace_request_ctx
    if sink is not None:
        sink.sent(_now())


class AiohttpTransport:
    """aiohttp with an unlimited connection pool (never a silent concurrency cap)."""

    def __init__(self, base_url: str, timeouts: Timeouts = Timeouts(), read_bufsize: int = 1 << 20) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts
        self.read_bufsize = read_bufsize
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(_on_sent)
            trace.on_request_chunk_sent.append(_on_sent)
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=None, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(
                connector=connector,
                trace_configs=[trace],
                timeout=aiohttp.ClientTimeout(
                    total=self.timeouts.total, sock_connect=self.timeouts.connect, sock_read=self.timeouts.stall
                ),
                read_bufsize=self.read_bufsize,
                auto_decompress=False,
                trust_env=False,  # an ambient http_proxy must not capture loopback traffic
            )
        return self._session

    async def send(self, call: HttpCall, sink: Sink) -> None:
        session = self._get_session()
        try:
            async with session.request(
                call.method,
                self.base_url + call.path,
                data=call.body or None,
                headers=dict(call.headers),
                trace_request_ctx=sink,
            ) as resp:
                sink.headers(_now(), resp.status)
                content = resp.content
                while True:
                    chunk = await content.readany()
                    if not chunk:
                        break
                    sink.data(_now(), chunk)
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
