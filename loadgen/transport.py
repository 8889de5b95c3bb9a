"""The transport contract: what the runner may ask of a transport, and nothing else.

``await transport.send(call, sink)`` sends one call and feeds ``sink`` (``sent(ts)``,
``headers(ts, status, content_type)``, ``data(ts, bytes)``, and optionally ``progress_ns()``
for the stall timeout); timestamps are ``perf_counter_ns``. A failure raises ``StreamError``
with a classified type. A transport that can send a closed-loop slot's next request from
inside the read that freed the slot is an ``EagerTransport``; one that can open its
connections ahead of t0 is ``Preconnecting``. The runner learns which, once, from these
protocols.

Implementations: ``loadgen/rawhttp.py`` (bench's own), ``loadgen/aiohttp_transport.py``;
``loadgen/transports.py`` picks one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, cast, get_args, runtime_checkable

from bench_llm.adapters.base import HttpCall
from bench_llm.core.errors import BenchError


class StreamError(BenchError):
    """A stream that went wrong in a way the protocol makes visible."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


class Sink(Protocol):
    def sent(self, ts_ns: int) -> None: ...
    def headers(self, ts_ns: int, status: int, content_type: str = "") -> None: ...
    def data(self, ts_ns: int, data: bytes) -> None: ...


@runtime_checkable
class FastSink(Sink, Protocol):
    """A sink that can take a response through the compiled read path
    (``loadgen/_fastpath.c``, which the raw transport uses when ``fast_api`` is not 0):
    the compiled reader feeds ``use_fast``'s object itself, hands it the payloads it
    does not recognise (``fast_special``), and reports the last body bytes
    (``last_data_ns``). ``loadgen.recorder.RequestRecorder`` is one."""

    last_data_ns: int | None
    max_event_bytes: int

    @property
    def fast_api(self) -> int: ...
    def use_fast(self, fast: Any) -> None: ...
    def fast_special(self, ts_ns: int, payload: bytes) -> tuple[int, Any]: ...


#: Whether a sink class is a FastSink, decided once per class (``fast_sink``).
_FAST_SINK_CLASSES: dict[type, bool] = {}


def fast_sink(sink: Sink) -> FastSink | None:
    """``sink`` as a FastSink, or None. A runtime Protocol ``isinstance`` probes every member
    (about 40 µs here): once per response that is 40 ms of event loop while 1024 first tokens
    arrive together, which showed as +10-20 ms TTFT error (issue 19's instrument check). Every
    instance of a sink class has the same members, so the answer is kept per class."""
    cls = type(sink)
    fast = _FAST_SINK_CLASSES.get(cls)
    if fast is None:
        fast = _FAST_SINK_CLASSES[cls] = isinstance(sink, FastSink)
    return cast(FastSink, sink) if fast else None


class Transport(Protocol):
    async def send(self, call: HttpCall, sink: Sink) -> None: ...
    async def close(self) -> None: ...
    def describe(self) -> dict[str, object]: ...


ExchangeT = TypeVar("ExchangeT")


@runtime_checkable
class EagerTransport(Protocol[ExchangeT]):
    """A transport that sends a closed-loop slot's next request from inside the read that
    completed the slot's previous one (``on_complete``), instead of after the slot's task
    wakes. ``start`` sends at once where an idle connection takes it (None: it cannot);
    ``complete`` awaits a request ``start`` sent; ``abort`` drops one nobody will await."""

    async def send(self, call: HttpCall, sink: Sink, on_complete: Callable[[], None] | None = None) -> None: ...
    async def close(self) -> None: ...
    def describe(self) -> dict[str, object]: ...
    def start(self, call: HttpCall, sink: Sink, on_complete: Callable[[], None] | None = None) -> ExchangeT | None: ...
    async def complete(self, exchange: ExchangeT, call: HttpCall, sink: Sink) -> None: ...
    def abort(self, exchange: ExchangeT) -> None: ...


@runtime_checkable
class Preconnecting(Protocol):
    """A transport that can open ``count`` connections before t0 (a closed loop's slots all send at t0)."""

    async def preconnect(self, count: int) -> int: ...


#: Seconds a kept-alive connection may stay idle and still be reused (both transports).
#: Servers close idle connections after their own keep-alive timeout (uvicorn's, behind
#: vLLM and SGLang, is 5 s); a request sent as the server closes is lost, never resent.
KEEPALIVE_IDLE_S = 2.0

#: Default total deadline of one request (``--request-timeout``), seconds: far above any
#: sane generation (32k tokens at 20 ms each take 11 min), short of hanging a run forever.
DEFAULT_TOTAL_S = 1800.0


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds. ``stall`` bounds the time without data: since the request was sent, since
    the response head, or since the last SSE data payload (comments and keep-alives do not
    count); ``total`` bounds the whole request (None: unbounded)."""

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


def redirect_error(status: int, location: str) -> StreamError | None:
    """The failure of a 3xx answer (never followed: the run would measure another server than
    the one named, silently), naming its target; None for any other status (304 is not a
    redirect)."""
    if not 300 <= status < 400 or status == 304:
        return None
    from bench_llm.core.redact import redact

    target = redact(location) if location else "no Location given"
    return StreamError("redirect", f"HTTP {status} redirect to {target}: not followed (give the url of the server that answers)")


#: Chunk-timestamp clocks (docs/instrument.md, Clocks): ``kernel`` is the kernel's receive
#: time (raw transport, Linux), ``user`` the time a read returned, ``auto`` the kernel's where
#: the platform has it and the user one elsewhere.
Clock = Literal["auto", "user", "kernel"]
CLOCKS: tuple[str, ...] = get_args(Clock)


def check_base_url(url: str) -> str:
    """``url`` when it is an engine's base URL (scheme, host, no API path), else a
    ``SettingError`` (a ValueError naming the ``url`` setting) that says how to write it."""
    from urllib.parse import urlsplit

    from bench_llm.core.errors import SettingError

    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        guess = "http://" + url.split("://", 1)[-1]
        raise SettingError(f"$url {url!r}: give the scheme and host, e.g. {guess}")
    path = parts.path.rstrip("/")
    if path.lower().endswith("/v1"):
        root = url[: url.lower().rstrip("/").rfind("/v1")]
        raise SettingError(
            f"$url {url!r}: give the server's root ({root}); bench adds the API path "
            "(/v1/completions, /v1/chat/completions, ...) itself"
        )
    return url

