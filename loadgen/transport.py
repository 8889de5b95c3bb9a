"""The transport contract: what the runner may ask of a transport, and nothing else.

``await transport.send(call, sink)`` sends one call and feeds ``sink`` (``sent(ts)``,
``headers(ts, status)``, ``data(ts, bytes)``); timestamps are ``perf_counter_ns``. A
failure raises ``StreamError`` with a classified type. A transport that can send a
closed-loop slot's next request from inside the read that freed the slot is an
``EagerTransport``; one that can open its connections ahead of t0 is ``Preconnecting``.
The runner learns which, once, from these protocols.

Implementations: ``loadgen/rawhttp.py`` (bench's own), ``loadgen/aiohttp_transport.py``;
``loadgen/transports.py`` picks one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar, get_args, runtime_checkable

from adapters.base import HttpCall


class StreamError(Exception):
    """A stream that went wrong in a way the protocol makes visible."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


class Sink(Protocol):
    def sent(self, ts_ns: int) -> None: ...
    def headers(self, ts_ns: int, status: int) -> None: ...
    def data(self, ts_ns: int, data: bytes) -> None: ...


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


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds. ``stall`` bounds the silence between two reads (and before the first)."""

    connect: float = 10.0
    stall: float = 120.0
    total: float | None = None


#: Chunk-timestamp clocks (docs/instrument.md, Clocks): ``kernel`` is the kernel's receive
#: time (raw transport, Linux), ``user`` the time a read returned, ``auto`` the kernel's where
#: the platform has it and the user one elsewhere.
Clock = Literal["auto", "user", "kernel"]
CLOCKS: tuple[str, ...] = get_args(Clock)
