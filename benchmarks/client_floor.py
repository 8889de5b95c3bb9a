"""The CPU floor of a Python streaming client on this machine (issue 8).

``benchmarks/instrument.py`` reports bench's client CPU per received token. This script
says how much of that any Python client pays, by running two stripped-down clients
against the same lean batch-stepping engine, closed loop, client and engine pinned to
different cores, and measuring their CPU (user and kernel, from ``getrusage``) over a
steady window:

  bare    uvloop, one kept-alive socket per stream, a readiness callback that does
          ``recv``, one ``perf_counter_ns()`` and two list appends: the least a Python
          client can do per read and still have a timestamp. No framing, no parsing.
  parse   ``bare`` plus SSE splitting and ``orjson.loads`` of every payload: the least
          a client must do to read token counts from the server's usage fields.
  bench   ``bench run`` itself (figures from the instrument's analysis of its run).

The kernel part (``sys``) is the price of a ``recv`` on loopback TCP: the client's CPU
also processes the ACKs its reads cause, on the engine's socket. No user-space change
removes it; what is left for a client's own work is the rest.

Example:
  python benchmarks/client_floor.py --concurrency 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import instrument  # noqa: E402  (the lean engine, pinning and the bench-run analysis)


def client_main(args: argparse.Namespace) -> None:
    """One stripped-down client: runs, measures its steady window, prints one JSON line."""
    import orjson

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    now = time.perf_counter_ns
    body = orjson.dumps(
        {"model": args.model, "prompt": "x" * 128, "max_tokens": args.tokens, "stream": True,
         "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    )
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{args.port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    parse = args.mode == "parse"
    loads = orjson.loads
    stamps: list[int] = []
    reads: list[bytes] = []

    class Stream:
        def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
            self.sock = socket.create_connection(("127.0.0.1", args.port))
            self.sock.setblocking(False)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            loop.add_reader(self.sock.fileno(), self.readable)
            self.sock.send(request)

        def readable(self) -> None:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            stamps.append(now())
            reads.append(data)
            if parse:
                for part in data.split(b"data: ")[1:]:
                    payload = part[: part.find(b"\n\n")]
                    if payload != b"[DONE]":
                        loads(payload)
            if data.endswith(b"0\r\n\r\n"):  # the response's last chunk: the slot sends again
                self.sock.send(request)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        streams = [Stream(loop) for _ in range(args.concurrency)]
        await asyncio.sleep(args.warmup)
        r0, i0, t0 = resource.getrusage(resource.RUSAGE_SELF), len(reads), now()
        await asyncio.sleep(args.seconds)
        r1, i1, t1 = resource.getrusage(resource.RUSAGE_SELF), len(reads), now()
        tokens = sum(r.count(b'"text":') for r in reads[i0:i1])
        print(json.dumps({
            "mode": args.mode, "streams": len(streams), "tok_s": tokens / ((t1 - t0) / 1e9),
            "reads_per_token": (i1 - i0) / tokens if tokens else float("nan"),
            "user_us_tok": (r1.ru_utime - r0.ru_utime) / tokens * 1e6 if tokens else float("nan"),
            "sys_us_tok": (r1.ru_stime - r0.ru_stime) / tokens * 1e6 if tokens else float("nan"),
        }), flush=True)
        os._exit(0)  # the sockets are mid-stream: no orderly close needed

    asyncio.run(run())


def _floor(args: argparse.Namespace, mode: str, port: int) -> dict[str, float | str]:
    argv = [sys.executable, __file__, "client", "--mode", mode, "--port", str(port), "--concurrency",
            str(args.concurrency), "--tokens", str(args.tokens), "--model", args.model,
            "--warmup", str(args.warmup), "--seconds", str(args.seconds)]
    cpus = instrument._cpuset(args.client_cpus)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=args.warmup + args.seconds + 60,
                         preexec_fn=(lambda: instrument._pin(cpus)) if cpus else None)
    if out.returncode != 0:
        raise SystemExit(f"{mode} client failed: {out.stderr[-1000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    cl = sub.add_parser("client", help="(internal) one stripped-down client")
    cl.add_argument("--mode", choices=["bare", "parse"], required=True)
    cl.add_argument("--port", type=int, required=True)
    for p in (ap, cl):
        p.add_argument("--concurrency", type=int, default=256, help="streams in flight (closed loop)")
        p.add_argument("--tokens", type=int, default=256, help="output tokens per request")
        p.add_argument("--model", default="sim-model")
        p.add_argument("--warmup", type=float, default=3.0, help="seconds before the measured window")
        p.add_argument("--seconds", type=float, default=8.0, help="length of the measured window")
    ap.add_argument("--client-cpus", default="0", help="cores for the client ('' = no pinning)")
    ap.add_argument("--server-cpus", default="1", help="cores for the engine")
    ap.add_argument("--skip-bench", action="store_true", help="only the two stripped-down clients")
    args = ap.parse_args()
    if args.cmd == "client":
        client_main(args)
        return

    from launch.process import free_port

    # the instrument's engine and analysis read these
    args.server, args.ttft_ms, args.itl_ms = "lean", 50.0, 10.0
    args.rounds, args.workers, args.transport, args.clock = 3, 1, None, None
    tmp = Path(tempfile.mkdtemp(prefix="bench-floor-"))
    print(f"# {args.concurrency} streams x {args.tokens} tokens, client cpus {args.client_cpus or 'any'}, "
          f"engine cpus {args.server_cpus or 'any'}; loadavg before {os.getloadavg()[0]:.2f}")
    print(f"{'client':8} {'tok/s':>8} {'user':>7} {'kernel':>7} {'total':>7}  (CPU us per token)")
    port = free_port()
    proc, _ = instrument._start_engine(args, port, tmp / "emission-floor.parquet", tmp / "engine-floor.log")
    try:
        for mode in ("bare", "parse"):
            r = _floor(args, mode, port)
            user, kern = float(r["user_us_tok"]), float(r["sys_us_tok"])
            print(f"{mode:8} {float(r['tok_s']):8.0f} {user:7.1f} {kern:7.1f} {user + kern:7.1f}")
    finally:
        instrument._stop(proc)
    if not args.skip_bench:
        port = free_port()
        log = tmp / "emission-bench.parquet"
        proc, has_log = instrument._start_engine(args, port, log, tmp / "engine-bench.log")
        try:
            instrument._client(args, f"http://127.0.0.1:{port}", args.concurrency, tmp / "run-bench")
        finally:
            instrument._stop(proc)
        res = instrument.analyse(tmp / "run-bench", log if has_log else None, args, args.concurrency)
        print(f"{'bench':8} {float(res['tok_s']):8.0f} {'-':>7} {'-':>7} {float(res['cpu_us_tok']):7.1f}")
    print(f"# loadavg after {os.getloadavg()[0]:.2f}")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
