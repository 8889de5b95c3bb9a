"""Servers that misbehave: every request ends, recorded with its cause, in bounded time and
memory, the same through every transport (raw compiled, raw pure Python, aiohttp)."""

from __future__ import annotations

import time

import pytest

from bench_llm.loadgen.transport import Timeouts
from tests.hostile_server import hostile, make, record_one, run

KINDS = ("raw", "python", "aiohttp")


@pytest.mark.parametrize("kind", KINDS)
def test_sse_comments_alone_do_not_keep_a_request_alive(kind: str) -> None:
    """A server that trickles `: keep-alive` and never data: the stall timeout ends it."""
    with hostile("comments") as server:
        t0 = time.monotonic()
        r = run(record_one(make(kind, server.url, Timeouts(stall=1.0, total=60.0))))
    assert not r.ok and r.error_type == "timeout", (r.error_type, r.error_message)
    assert "only SSE comments" in (r.error_message or "")
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_has_a_total_deadline(kind: str) -> None:
    """Data every 50 ms but never the end: the total deadline ends it."""
    with hostile("slow_data") as server:
        t0 = time.monotonic()
        r = run(record_one(make(kind, server.url, Timeouts(stall=1.0, total=1.5))))
    assert not r.ok and r.error_type == "timeout" and "total deadline of 1.5 s" in (r.error_message or "")
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("kind", KINDS)
def test_a_line_without_end_fails_as_line_too_long(kind: str) -> None:
    with hostile("long_line") as server:
        t0 = time.monotonic()
        r = run(record_one(make(kind, server.url, Timeouts(stall=2.0, total=20.0)), max_event_bytes=1 << 20))
    assert not r.ok and r.error_type == "line_too_long", (r.error_type, r.error_message)
    assert r.error_message == f"an SSE event or line longer than {1 << 20} bytes"
    assert time.monotonic() - t0 < 15


@pytest.mark.parametrize("kind", KINDS)
def test_a_200_that_is_not_an_event_stream_says_so(kind: str) -> None:
    with hostile("html") as server:
        r = run(record_one(make(kind, server.url, Timeouts(stall=5.0))))
    assert not r.ok and r.error_type == "not_event_stream"
    assert (r.error_message or "").startswith("not an event stream (text/html): <html><body>Please log in")


@pytest.mark.parametrize("kind", KINDS)
def test_a_post_is_never_sent_twice(kind: str) -> None:
    """The server reads the request on a pre-opened connection and closes it before any
    byte of the answer: the request is recorded as failed, and the server saw it once."""
    with hostile("close") as server:
        transport = make(kind, server.url, Timeouts(stall=5.0))
        r = run(record_one(transport, preconnect=kind != "aiohttp"))
        time.sleep(0.2)
        assert server.requests == 1
    assert not r.ok and r.error_type in ("closed_before_response", "stream_reset"), (r.error_type, r.error_message)


def test_idle_connections_are_not_reused_past_the_keepalive_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pre-opened connection idle for longer than KEEPALIVE_IDLE_S is closed, not used:
    servers close idle ones themselves (uvicorn after 5 s) and a request sent as they do is lost."""
    import asyncio

    import bench_llm.loadgen.rawhttp as rawhttp

    monkeypatch.setattr(rawhttp, "KEEPALIVE_IDLE_S", 0.05)

    async def main() -> tuple[int, int]:
        with hostile("html") as server:
            t = make("python", server.url, Timeouts(stall=5.0))
            await t.preconnect(2)  # type: ignore[attr-defined]
            await asyncio.sleep(0.2)
            conn = t._take_idle()  # type: ignore[attr-defined]
            opened = t.connections_opened  # type: ignore[attr-defined]
            await t.close()
            return (0 if conn is None else 1), opened

    reused, opened = asyncio.run(main())
    assert opened == 2 and reused == 0
