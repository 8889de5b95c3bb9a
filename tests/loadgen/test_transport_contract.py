"""The transport contract (loadgen/transport.py) is explicit: the runner asks a transport only
what the protocols declare, and each implementation says which protocols it meets."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from loadgen.aiohttp_transport import AiohttpTransport
from loadgen.rawhttp import RawHttpTransport
from loadgen.transport import EagerTransport, Preconnecting, StreamError, Transport

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


@pytest.mark.parametrize("module", ["runner.py", "dispatch.py", "recording.py", "monitoring.py", "workers.py", "rawhttp.py"])
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
