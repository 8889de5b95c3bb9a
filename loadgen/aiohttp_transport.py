"""The aiohttp transport: for https, and as a reference for bench's own raw transport.

Implements ``loadgen.transport.Transport``; errors become ``StreamError`` with their class.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import aiohttp

from adapters.base import HttpCall
from loadgen.transport import Sink, StreamError, Timeouts

_now = time.perf_counter_ns


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
