"""Choosing a transport: ``make_transport`` returns the implementation for a kind and clock."""

from __future__ import annotations

from typing import cast

from bench_llm.loadgen.aiohttp_transport import AiohttpTransport
from bench_llm.loadgen.rawhttp import RawHttpTransport
from bench_llm.loadgen.transport import CLOCKS, Clock, Timeouts, Transport


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
            raise ValueError("the kernel clock needs the raw transport (aiohttp cannot expose receive timestamps)")
        return AiohttpTransport(base_url, timeouts)
    return RawHttpTransport(base_url, timeouts, clock=cast(Clock, clock))  # checked against CLOCKS above
