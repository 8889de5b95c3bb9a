"""bench's own HTTP/1.1 transport: framing, failures, keep-alive and both clocks."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.analysis.load import load_run
from bench_llm.bench.execute import RunConfig, execute_run
from bench_llm.loadgen.rawhttp import RawHttpTransport
from bench_llm.loadgen.runner import RunOptions
from bench_llm.loadgen.socket_clock import kernel_timestamps_supported
from bench_llm.loadgen.transport import Timeouts
from bench_llm.sim.server import ServerConfig, create_app, serve_in_process
from bench_llm.sim.timing import FixedTiming
from bench_llm.workloads.spec import RequestSpec, Schedule


class _Sink:
    def __init__(self) -> None:
        self.sent_ns: int | None = None
        self.status: int | None = None
        self.body = b""
        self.reads: list[int] = []

    def sent(self, ts: int) -> None:
        self.sent_ns = ts

    def headers(self, ts: int, status: int, content_type: str = "") -> None:
        self.status = status

    def data(self, ts: int, data: bytes) -> None:
        self.reads.append(ts)
        self.body += data


def _chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_dechunking_copes_with_every_split_point() -> None:
    from bench_llm.loadgen.http1_response import _CHUNK_SIZE, _DONE, Exchange

    parts = [b"data: {\"a\":1}\n\n", b"x" * 300, b"data: [DONE]\n\n"]
    wire = _chunked(parts)
    for cut in range(1, len(wire)):
        for pieces in ([wire[:cut], wire[cut:]], [wire[i : i + 1] for i in range(0, len(wire))] if cut == 1 else []):
            if not pieces:
                continue
            ex = Exchange.__new__(Exchange)
            ex.state, ex.buf, ex.remaining, ex.keep_alive = _CHUNK_SIZE, b"", 0, True
            out = b""
            for p in pieces:
                out += ex._dechunk(ex.buf + p if ex.state != _CHUNK_SIZE or ex.buf else p)
            assert out == b"".join(parts), cut
            assert ex.state == _DONE and ex.keep_alive


async def _one(url: str, transport: RawHttpTransport, path: str = "/v1/completions") -> _Sink:
    adapter = OpenAIAdapter(model="sim-model")
    spec = RequestSpec("r", 4, 5, prompt="hello there")
    sink = _Sink()
    call = adapter.build(spec)
    await transport.send(type(call)(call.method, path, call.body, call.headers), sink)
    return sink


@pytest.mark.parametrize("clock", ["user", "kernel"])
def test_streams_from_the_sim_reuse_the_connection_and_stamp_in_order(clock: str) -> None:
    async def main() -> tuple[list[_Sink], RawHttpTransport, int, int]:
        cfg = ServerConfig(timing=FixedTiming(0.02, 0.005))
        async with serve_in_process(create_app(cfg)) as url:
            t = RawHttpTransport(url, Timeouts(stall=5.0), clock=clock)  # type: ignore[arg-type]
            before = time.perf_counter_ns()
            sinks = [await _one(url, t) for _ in range(3)]
            after = time.perf_counter_ns()
            await t.close()
            return sinks, t, before, after

    sinks, t, before, after = asyncio.run(main())
    for s in sinks:
        assert s.status == 200 and s.body.endswith(b"data: [DONE]\n\n")
        assert s.body.count(b"data: ") == 5 + 2  # five tokens, usage frame, [DONE]
        assert s.sent_ns is not None and before < s.sent_ns < s.reads[0] <= after
        assert s.reads == sorted(s.reads)
        # TTFT of 20 ms is seen as such (generous upper bound: shared CPU)
        assert 15e6 < s.reads[0] - s.sent_ns < 500e6
    assert t.connections_opened == 1  # keep-alive reuse
    expected = "kernel" if clock == "kernel" and kernel_timestamps_supported() else "user"
    assert t.clock == expected and t.describe()["clock"] == expected


def test_connection_refused_and_https_are_clear() -> None:
    from bench_llm.launch.process import free_port
    from bench_llm.loadgen.transport import StreamError

    async def main() -> None:
        t = RawHttpTransport(f"http://127.0.0.1:{free_port()}", Timeouts(connect=2.0))
        with pytest.raises(StreamError) as info:
            await _one("", t)
        assert info.value.error_type == "connect"

    asyncio.run(main())
    with pytest.raises(ValueError, match="plain http"):
        RawHttpTransport("https://example.invalid")


def test_closed_loop_run_over_raw_transport(tmp_path: Path) -> None:
    specs = tuple(RequestSpec(f"r{i}", 4, 8, prompt="p") for i in range(12))
    sched = Schedule("c", 0, "closed", specs, concurrency=4)

    async def main() -> Path:
        cfg_s = ServerConfig(timing=FixedTiming(0.01, 0.002))
        async with serve_in_process(create_app(cfg_s)) as url:
            cfg = RunConfig(out=tmp_path / "run", url=url, engine="sim", model="sim-model", schedule=sched,
                            options=RunOptions(progress=False))
            transport = _CountingTransport(url, cfg.timeouts)
            res = await execute_run(cfg, OpenAIAdapter(model="sim-model"), transport=transport, install_signals=False)
            await transport.close()
            # the four slots' connections were opened before t0, and only those were used
            assert transport.preconnected == [(4, 4)]
            assert transport.connections_opened == 4
            return res.run_dir

    run = load_run(asyncio.run(main()))
    rows = run.requests.to_pylist()
    assert len(rows) == 12 and all(r["ok"] and r["output_tokens"] == 8 for r in rows)
    t0 = run.meta["notes"]["t0_ns"]
    assert _CountingTransport.preconnect_done_ns < t0 <= min(r["send_ns"] for r in rows)


class _CountingTransport(RawHttpTransport):
    preconnect_done_ns = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.preconnected: list[tuple[int, int]] = []

    async def preconnect(self, count: int, parallel: int = 64) -> int:
        opened = await super().preconnect(count, parallel)
        self.preconnected.append((count, opened))
        type(self).preconnect_done_ns = time.perf_counter_ns()
        return opened


def test_preconnect_fills_the_pool_and_sends_reuse_it() -> None:
    async def main() -> None:
        async with serve_in_process(create_app(ServerConfig(timing=FixedTiming(0.001, 0.001)))) as url:
            transport = RawHttpTransport(url)
            assert await transport.preconnect(3) == 3
            assert await transport.preconnect(3) == 0  # already there
            sinks = await asyncio.gather(*(_one(url, transport) for _ in range(3)))
            assert all(s.status == 200 for s in sinks)
            assert transport.connections_opened == 3
            await transport.close()

    asyncio.run(main())
    refused = RawHttpTransport("http://127.0.0.1:9", Timeouts(connect=2.0))
    assert asyncio.run(refused.preconnect(2)) == 0  # left for the requests to meet and record


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) on this machine")
@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_an_ipv6_url_is_measured(tmp_path: Path, transport: str) -> None:
    """``http://[::1]:port``: the engine on IPv6 loopback, both transports."""
    specs = tuple(RequestSpec(f"r{i}", 4, 6, prompt="p") for i in range(6))

    async def main() -> Path:
        async with serve_in_process(create_app(ServerConfig(timing=FixedTiming(0.005, 0.001))), host="::1") as url:
            assert url.startswith("http://[::1]:")
            cfg = RunConfig(out=tmp_path / "run", url=url, engine="sim", model="sim-model",
                            schedule=Schedule("c", 0, "closed", specs, concurrency=2),
                            options=RunOptions(progress=False), transport=transport)
            res = await execute_run(cfg, OpenAIAdapter(model="sim-model"), install_signals=False)
            return res.run_dir

    rows = load_run(asyncio.run(main())).requests.to_pylist()
    assert len(rows) == 6 and all(r["ok"] and r["output_tokens"] == 6 for r in rows)


def test_the_default_clock_is_the_kernel_one_where_the_platform_has_it() -> None:
    """``auto`` (the default of bench run and sweeps): kernel stamps on the raw transport
    where the platform offers them, user stamps elsewhere; an explicit request for the kernel
    clock on aiohttp (https) is an error, never a silent downgrade."""
    from bench_llm.loadgen.aiohttp_transport import AiohttpTransport
    from bench_llm.loadgen.transports import make_transport

    assert RunConfig.__dataclass_fields__["clock"].default == "auto"
    raw = make_transport("auto", "http://127.0.0.1:9")
    assert isinstance(raw, RawHttpTransport) and raw.requested_clock == "auto"
    assert raw.clock == ("kernel" if kernel_timestamps_supported() else "user")
    assert RawHttpTransport("http://127.0.0.1:9", clock="user").clock == "user"
    tls = make_transport("auto", "https://127.0.0.1:9")
    assert isinstance(tls, AiohttpTransport) and tls.describe()["clock"] == "user"
    with pytest.raises(ValueError, match="needs the raw transport"):
        make_transport("aiohttp", "http://127.0.0.1:9", clock="kernel")
    with pytest.raises(ValueError, match="unknown clock"):
        make_transport("auto", "http://127.0.0.1:9", clock="tsc")
