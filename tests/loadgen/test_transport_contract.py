"""The transport contract (loadgen/transport.py) is explicit: the runner asks a transport only
what the protocols declare, and each implementation says which protocols it meets."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from bench_llm.loadgen.aiohttp_transport import AiohttpTransport
from bench_llm.loadgen.rawhttp import RawHttpTransport
from bench_llm.loadgen.transport import EagerTransport, Preconnecting, StreamError

REPO = Path(__file__).resolve().parents[2]


def test_each_transport_declares_what_it_can_do() -> None:
    raw = RawHttpTransport("http://127.0.0.1:9")
    aio = AiohttpTransport("http://127.0.0.1:9")
    assert isinstance(raw, EagerTransport) and isinstance(raw, Preconnecting)
    assert not isinstance(aio, EagerTransport) and not isinstance(aio, Preconnecting)
    for t in (raw, aio):
        for name in ("send", "close", "describe"):
            assert callable(getattr(t, name)), (type(t).__name__, name)
    asyncio.run(raw.close())
    asyncio.run(aio.close())
    assert StreamError("timeout", "x").error_type == "timeout"


@pytest.mark.parametrize("module", ["runner.py", "dispatch.py", "recording.py", "monitoring.py", "workers.py", "rawhttp.py",
                                    "http1_response.py"])
def test_the_runner_uses_the_contract_only(module: str) -> None:
    """No duck-typed reach into a transport (or, from the transport, into its sink): no
    getattr on it, no ``type: ignore`` beside it."""
    source = (REPO / "loadgen" / module).read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            assert "transport" not in ast.unparse(node.args[0]), ast.unparse(node)
            assert "sink" not in ast.unparse(node.args[0]), ast.unparse(node)
    for line in source.splitlines():
        assert not (("transport" in line or "sink" in line) and "type: ignore" in line), line


def test_the_compiled_path_asks_each_sink_class_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime Protocol isinstance probes every member (tens of µs): once per response it
    delayed 1024 simultaneous first tokens by 10-20 ms, so the raw transport decides per class."""
    import bench_llm.loadgen.transport as transport
    from bench_llm.adapters.base import RequestSpec
    from bench_llm.adapters.openai import OpenAIAdapter
    from bench_llm.loadgen.recorder import RequestRecorder

    class PlainSink:
        def data(self, ts_ns: int, data: bytes) -> None: ...

    calls: list[type] = []
    real = isinstance

    def counting(obj: object, cls: object) -> bool:
        if cls is transport.FastSink:
            calls.append(type(obj))
        return real(obj, cls)  # type: ignore[arg-type]

    monkeypatch.setattr(transport, "_FAST_SINK_CLASSES", {})
    monkeypatch.setitem(transport.fast_sink.__globals__, "isinstance", counting)
    spec = RequestSpec(request_id="r", input_tokens=1, max_output_tokens=1, prompt="x")
    recorders = [RequestRecorder(spec, OpenAIAdapter().parser(), 0, 0) for _ in range(3)]
    assert all(transport.fast_sink(r) is r for r in recorders)
    assert transport.fast_sink(PlainSink()) is None  # type: ignore[arg-type]
    assert calls == [RequestRecorder, PlainSink]  # one check per class, not per response
