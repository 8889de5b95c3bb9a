"""Helpers for adapter tests: feed a stream to a recorder the way a transport would."""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from bench_llm.adapters.base import Adapter
from bench_llm.loadgen.recorder import RequestRecorder
from bench_llm.results.record import RequestRecord
from bench_llm.workloads.spec import RequestSpec

SPEC = RequestSpec("r1", input_tokens=5, max_output_tokens=8, prompt="a b c d e")


def sse(*objs: object, done: bool = True, space: bool = True) -> bytes:
    """``data: <json>`` events (``data:<json>`` when ``space`` is False), then ``[DONE]``."""
    prefix = b"data: " if space else b"data:"
    out = b"".join(prefix + (o if isinstance(o, bytes) else orjson.dumps(o)) + b"\n\n" for o in objs)
    return out + (prefix + b"[DONE]\n\n" if done else b"")


def record(adapter: Adapter, data: bytes, split: Iterable[int] | None = None, t0: int = 1000,
           spec: RequestSpec = SPEC) -> RequestRecord:  # fmt: skip
    """One event per read 10 ns apart, or the raw bytes cut at the ``split`` offsets."""
    rec = RequestRecorder(spec, adapter.parser(), worker_id=0, intended_ns=t0, keep_text=True)
    rec.sent(t0)
    rec.headers(t0 + 1, 200)
    if split is None:
        pieces = [b + b"\n\n" for b in data.replace(b"\r\n", b"\n").split(b"\n\n") if b]
    else:
        cuts = [0, *sorted(split), len(data)]
        pieces = [data[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]
    t = t0
    for piece in pieces:
        t += 10
        rec.data(t, piece)
    return rec.finish(t + 5, requires_done=getattr(adapter, "requires_done", True), save_text=True)
