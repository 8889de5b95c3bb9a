"""Engine API adapters: build the HTTP call, parse stream payloads into events.

Adapters do no I/O. Transport, timing and recording live in loadgen and are written
once for every engine.
"""

from bench_llm.adapters.base import Adapter, EventKind, HttpCall, StreamEvent, StreamParser, get_adapter

__all__ = ["Adapter", "EventKind", "HttpCall", "StreamEvent", "StreamParser", "get_adapter"]
