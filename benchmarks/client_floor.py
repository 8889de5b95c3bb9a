"""The CPU floor of a streaming client on this machine (issues 8 and 20).

``benchmarks/instrument.py`` reports bench's client CPU per received token. This script
says how much of that any client pays, by running stripped-down clients against the same
lean batch-stepping engine, closed loop, client and engine pinned to different cores, and
measuring their CPU (user and kernel) over a steady window:

  c       ``benchmarks/client_floor.c``, compiled at run time with ``cc -O2`` (skipped,
          saying so, where there is no compiler): epoll, one non-blocking kept-alive socket
          per stream, per read one ``recv`` and one ``clock_gettime``, just enough framing
          to count tokens and see a response's end. The host's floor.
  bare    uvloop, one kept-alive socket per stream, a readiness callback that does
          ``recv``, one ``perf_counter_ns()`` and two list appends: the least a Python
          client can do per read and still have a timestamp. No framing, no parsing.
  parse   ``bare`` plus SSE splitting and ``orjson.loads`` of every payload: the least
          a client must do to read token counts from the server's usage fields.
  bench   ``bench run`` itself. Its user/kernel split comes from ``/proc/PID/stat`` over a
          steady window (tokens counted from its own chunk stamps in that window); "instr"
          is the instrument's whole-run figure (the client monitor's CPU samples).

The kernel part is mostly the price of a ``recv`` on loopback TCP and of sleeping in and
waking from ``epoll_wait``; see docs/instrument.md ("Where a client's kernel time goes").

``--syscalls`` attaches ``perf stat`` (syscall tracepoints, context switches) to each
client over its steady window and prints syscalls per token; ``--c-variants`` runs the C
client once more per flag set (the socket-option experiments, e.g. ``--c-variants="-q;-r 4194304"``).

``delayed-ack`` shows why bench does not delay its ACKs (docs/instrument.md).

Example:
  python benchmarks/client_floor.py --concurrency 256
  python benchmarks/client_floor.py delayed-ack
  python benchmarks/client_floor.py --concurrency 1024 --shape end --syscalls
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
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


#: Syscalls counted per token by ``--syscalls`` (tracepoints; clock reads are vDSO calls).
SYSCALLS = ("epoll_wait", "epoll_pwait", "epoll_ctl", "recvfrom", "recvmsg", "sendto", "setsockopt", "getsockopt",
            "futex", "write", "read", "mmap", "munmap", "getrusage")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_cpu(pid: int) -> tuple[float, float, int, int]:
    """(user s, kernel s, voluntary, involuntary context switches) of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    vol = invol = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    invol += int(line.split()[1])
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK, vol, invol


def _tcp_counts(port: int) -> dict[str, int]:
    """Segments over the client's sockets to the engine's ``port`` so far (``ss -ti``):
    pure ACKs sent (``segs_out - data_segs_out``) and data segments received."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( dport = :{port} )"], capture_output=True,
                         text=True, check=False).stdout
    counts = {"acks_out": 0, "data_segs_in": 0}
    for line in out.split():
        name, _, value = line.partition(":")
        if name in ("segs_out", "data_segs_out", "data_segs_in") and value.isdigit():
            if name == "data_segs_in":
                counts["data_segs_in"] += int(value)
            else:
                counts["acks_out"] += int(value) if name == "segs_out" else -int(value)
    return counts


class _Probe:
    """The parent's look at one client over a window: CPU and context switches from
    /proc, ACKs sent and data segments received from ``ss``, and syscall counts from
    ``perf stat`` when ``syscalls`` (and perf) are there."""

    def __init__(self, pid: int, syscalls: bool, port: int) -> None:
        self.pid = pid
        self.port = port
        self.tcp0 = _tcp_counts(port) if shutil.which("ss") else None
        self.perf: subprocess.Popen[str] | None = None
        if syscalls and shutil.which("perf"):
            events = ["raw_syscalls:sys_enter"] + [f"syscalls:sys_enter_{n}" for n in SYSCALLS]
            self.perf = subprocess.Popen(["perf", "stat", "-x,", "-e", ",".join(events), "-p", str(pid)],
                                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.t0 = time.perf_counter_ns()
        self.cpu0 = _proc_cpu(pid)

    def stop(self) -> dict[str, float]:
        cpu1 = _proc_cpu(self.pid)
        t1 = time.perf_counter_ns()
        out: dict[str, float] = {"t0": self.t0, "t1": t1, "seconds": (t1 - self.t0) / 1e9,
                                 "user_s": cpu1[0] - self.cpu0[0], "sys_s": cpu1[1] - self.cpu0[1],
                                 "vcsw": cpu1[2] - self.cpu0[2], "ivcsw": cpu1[3] - self.cpu0[3]}
        if self.tcp0 is not None:
            tcp1 = _tcp_counts(self.port)
            out.update({f"sc_{k}": tcp1[k] - self.tcp0[k] for k in tcp1})
        if self.perf is not None:
            self.perf.send_signal(signal.SIGINT)
            _, err = self.perf.communicate(timeout=30)
            for line in err.splitlines():
                parts = line.split(",")
                if len(parts) > 2 and parts[0].strip().isdigit():
                    name = parts[2].split(":")[-1].replace("sys_enter_", "")
                    out["sc_" + ("all" if name == "sys_enter" else name)] = int(parts[0])
        return out


def _per_token(probe: dict[str, float], tokens: float) -> dict[str, float]:
    return {k[3:]: v / tokens for k, v in probe.items() if k.startswith("sc_")} | {
        "vcsw": probe["vcsw"] / tokens, "ivcsw": probe["ivcsw"] / tokens}


def _c_binary(tmp: Path) -> Path | None:
    """benchmarks/client_floor.c compiled with ``cc -O2`` into ``tmp``; None (said) without a compiler."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        print("# c: skipped, no C compiler (cc, gcc or clang) on PATH")
        return None
    exe = tmp / "client_floor"
    out = subprocess.run([cc, "-O2", "-o", str(exe), str(HERE / "client_floor.c")], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"# c: skipped, {cc} failed: {out.stderr.strip()[-500:]}")
        return None
    return exe


def _floor(args: argparse.Namespace, mode: str, port: int, exe: Path | None = None,
           flags: str = "") -> dict[str, float | str]:
    """One stripped-down client (``c`` runs ``exe`` with ``flags``); its JSON line, plus
    the parent's syscall counts per token over the middle of its window."""
    if mode == "c":
        assert exe is not None
        argv = [str(exe), str(port), str(args.concurrency), str(args.tokens), args.model, str(args.warmup),
                str(args.seconds), *flags.split()]
    else:
        argv = [sys.executable, __file__, "client", "--mode", mode, "--port", str(port), "--concurrency",
                str(args.concurrency), "--tokens", str(args.tokens), "--model", args.model,
                "--warmup", str(args.warmup), "--seconds", str(args.seconds)]
    cpus = instrument._cpuset(args.client_cpus)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=(lambda: instrument._pin(cpus)) if cpus else None)
    probe = None
    try:
        time.sleep(args.warmup + 0.5)  # inside the child's own window (it starts at warmup)
        if proc.poll() is None:
            p = _Probe(proc.pid, args.syscalls, port)
            time.sleep(max(0.5, args.seconds - 1.5))
            probe = p.stop()
        stdout, stderr = proc.communicate(timeout=args.warmup + args.seconds + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"{mode} client failed: {stderr[-1000:]}")
    r: dict[str, float | str] = json.loads(stdout.strip().splitlines()[-1])
    if probe is not None:
        r.update({f"pt_{k}": v for k, v in _per_token(probe, float(r["tok_s"]) * probe["seconds"]).items()})
    return r


def _bench(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, float | str], dict[str, float]]:
    """``bench run`` against its own engine: the instrument's analysis, and the parent's
    window (user/kernel split, syscalls per token) over ``--seconds`` of its steady part."""
    import numpy as np

    from bench_llm.launch.process import free_port
    from bench_llm.results.reader import read_requests

    # enough closed-loop rounds that the window ends well before the last wave winds down
    per_request = (args.ttft_ms + args.tokens * args.itl_ms) / 1e3
    args.rounds = int((args.warmup + args.seconds + 2) / per_request) + 3
    port = free_port()
    log = tmp / "emission-bench.parquet"
    run = tmp / "run-bench"
    proc, has_log = instrument._start_engine(args, port, log, tmp / "engine-bench.log")
    window: dict[str, float] = {}
    try:
        argv = instrument._bench_argv(args, f"http://127.0.0.1:{port}", args.concurrency, run)
        cpus = instrument._cpuset(args.client_cpus)
        env = {**os.environ, "PYTHONPATH": str(instrument.REPO)}
        client = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=instrument.REPO,
                                  preexec_fn=(lambda: instrument._pin(cpus)) if cpus else None)
        # the first requests written: the closed loop is full; measure after the warm-up
        deadline = time.monotonic() + 120
        while not any((run / "requests").glob("*.parquet")) and client.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(max(0.0, args.warmup - per_request))
        if client.poll() is None:
            p = _Probe(client.pid, args.syscalls, port)
            time.sleep(args.seconds)
            window = p.stop()
        _, err = client.communicate(timeout=600)
        if client.returncode != 0:
            raise SystemExit(f"bench run failed ({client.returncode}): {err.decode()[-2000:]}")
    finally:
        instrument._stop(proc)
    res = instrument.analyse(run, log if has_log else None, args, args.concurrency)
    if window:
        req = read_requests(run)
        lo, hi = int(window["t0"]), int(window["t1"])
        tokens = 0
        for ts, tk in zip(req["chunk_ns"].to_pylist(), req["chunk_tokens"].to_pylist()):
            a = np.asarray(ts or [], np.int64)
            tokens += int(np.asarray(tk or [], np.int64)[(a >= lo) & (a <= hi)].sum())
        if tokens:
            window.update(tokens=tokens, tok_s=tokens / window["seconds"], user_us_tok=window["user_s"] / tokens * 1e6,
                          sys_us_tok=window["sys_s"] / tokens * 1e6)
            window.update({f"pt_{k}": v for k, v in _per_token(window, tokens).items()})
    return res, window


def _row(name: str, tok_s: float, user: float, kern: float, extra: str = "") -> None:
    print(f"{name:14} {tok_s:8.0f} {user:7.1f} {kern:7.1f} {user + kern:7.1f}  {extra}")


def _syscall_note(r: Mapping[str, float | str]) -> str:
    keys = [k for k in r if k.startswith("pt_") and float(r[k]) >= 0.0005]
    return " ".join(f"{k[3:]}={float(r[k]):.3f}" for k in keys)


def delayed_ack_main(frames: int = 300, gap_ms: float = 10.0) -> None:
    """Why bench does not delay its ACKs (TCP_QUICKACK 0 halves the client's ACKs and
    their kernel time): a server that leaves Nagle's algorithm on holds each small write
    until the previous one is acknowledged, so delayed ACKs delay the tokens themselves.
    One stream of ``frames`` 280-byte writes ``gap_ms`` apart; prints write-to-read delay."""
    import threading

    def one(server_nodelay: bool, delayed_acks: bool) -> None:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        sent: list[int] = []

        def serve() -> None:
            conn, _ = srv.accept()
            if server_nodelay:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.recv(16)
            t0 = time.perf_counter_ns()
            for i in range(frames):
                while time.perf_counter_ns() < t0 + i * int(gap_ms * 1e6):
                    time.sleep(0.0005)
                sent.append(time.perf_counter_ns())
                conn.send(b"x" * 280)
            conn.close()

        th = threading.Thread(target=serve)
        th.start()
        sock = socket.create_connection(srv.getsockname())
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.send(b"go")
        got: list[int] = []
        while data := sock.recv(65536):
            now = time.perf_counter_ns()
            if delayed_acks:  # Linux leaves this mode by itself: set again after every read
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
            got += [now] * (len(data) // 280)
        th.join()
        sock.close()
        srv.close()
        lat = sorted((g - w) / 1e6 for g, w in zip(got, sent))
        print(f"server TCP_NODELAY {'on ' if server_nodelay else 'off'}, client {'delayed' if delayed_acks else 'default'} "
              f"ACKs: write->read p50 {lat[len(lat) // 2]:.3f} ms, p99 {lat[int(len(lat) * 0.99)]:.3f} ms, max {lat[-1]:.3f} ms")

    for server_nodelay in (True, False):
        for delayed in (False, True):
            one(server_nodelay, delayed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    cl = sub.add_parser("client", help="(internal) one stripped-down client")
    sub.add_parser("delayed-ack", help="what delayed ACKs (TCP_QUICKACK 0) do to a Nagle server's tokens")
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
    ap.add_argument("--shape", choices=instrument.SHAPES, default="every",
                    help="lean engine: usage on every token event, only in a final usage event, or none")
    ap.add_argument("--rows", default="c,bare,parse,bench", help="which clients, in order (c, bare, parse, bench)")
    ap.add_argument("--c-variants", default="", help="';'-separated flag sets for extra c rows (see client_floor.c)")
    ap.add_argument("--clock", choices=["auto", "user", "kernel"], default=None, help="bench run's --clock")
    ap.add_argument("--syscalls", action="store_true", help="perf stat each client's syscalls per token")
    ap.add_argument("--skip-bench", action="store_true", help="only the stripped-down clients")
    args = ap.parse_args()
    if args.cmd == "client":
        client_main(args)
        return
    if args.cmd == "delayed-ack":
        delayed_ack_main()
        return

    from bench_llm.launch.process import free_port

    # the instrument's engine and analysis read these
    args.server, args.ttft_ms, args.itl_ms = "lean", 50.0, 10.0
    args.rounds, args.workers, args.transport = 3, 1, None
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if args.skip_bench and "bench" in rows:
        rows.remove("bench")
    tmp = Path(tempfile.mkdtemp(prefix="bench-floor-"))
    print(f"# {args.concurrency} streams x {args.tokens} tokens, shape {args.shape}, client cpus {args.client_cpus or 'any'}, "
          f"engine cpus {args.server_cpus or 'any'}; loadavg before {os.getloadavg()[0]:.2f}")
    print(f"{'client':14} {'tok/s':>8} {'user':>7} {'kernel':>7} {'total':>7}  (CPU us per token; then per token: "
          f"reads, context switches{', syscalls' if args.syscalls else ''})")
    exe = _c_binary(tmp) if "c" in rows or args.c_variants else None
    variants = [("c", "")] if "c" in rows else []
    variants += [(f"c {v.strip()}", v.strip()) for v in args.c_variants.split(";") if v.strip()]
    stripped = [(n, f) for n, f in variants if exe is not None] + [(m, "") for m in rows if m in ("bare", "parse")]
    if stripped:
        port = free_port()
        proc, _ = instrument._start_engine(args, port, tmp / "emission-floor.parquet", tmp / "engine-floor.log")
        try:
            for name, flags in stripped:
                r = _floor(args, "c" if name.startswith("c") else name, port, exe, flags)
                user, kern = float(r["user_us_tok"]), float(r["sys_us_tok"])
                _row(name, float(r["tok_s"]), user, kern, f"reads {float(r['reads_per_token']):.3f} " + _syscall_note(r))
        finally:
            instrument._stop(proc)
    if "bench" in rows:
        res, w = _bench(args, tmp)
        if "user_us_tok" in w:
            _row("bench", float(w["tok_s"]), float(w["user_us_tok"]), float(w["sys_us_tok"]), _syscall_note(w))
        print(f"{'bench (instr)':14} {float(res['tok_s']):8.0f} {'-':>7} {'-':>7} {float(res['cpu_us_tok']):7.1f}  "
              f"clock {res['clock']}, TTFT err p50/p99 {float(res.get('ttft_err_p50', float('nan'))):.2f}/"
              f"{float(res.get('ttft_err_p99', float('nan'))):.2f} ms, flags: {res['flags']}")
    print(f"# loadavg after {os.getloadavg()[0]:.2f}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
