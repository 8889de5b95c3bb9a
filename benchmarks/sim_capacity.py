"""How many concurrent streams the simulated engine sustains on one core, and how late it emits.

Starts ``bench sim serve`` as a subprocess pinned to one CPU (``--cpu``), drives it with
bench's own client (closed loop, ``--streams`` in flight) from this process, then reads
the engine's emission log and prints streams, tokens/s and emission lateness
(``actual_ns - intended_ns``) p50/p99/max.

    python benchmarks/sim_capacity.py                      # 256 streams, fixed ITL 25.6 ms = 10k tok/s
    python benchmarks/sim_capacity.py --timing model       # llama-3.1-8b on H100, model timing
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_llm.adapters.openai import OpenAIAdapter  # noqa: E402
from bench_llm.bench.execute import RunConfig, execute_run  # noqa: E402
from bench_llm.launch.process import ManagedProcess, free_port  # noqa: E402
from bench_llm.loadgen.runner import RunOptions  # noqa: E402
from bench_llm.loadgen.transport import Timeouts  # noqa: E402
from bench_llm.workloads.synthetic import SyntheticWorkload  # noqa: E402


async def drain_clients(port: int, streams: int, duration: float, input_tokens: int, output_tokens: int) -> int:
    """Minimal keep-alive clients that send a streaming request and discard the bytes (so the
    client process is never the bottleneck); returns the number of finished requests."""
    import orjson

    body = orjson.dumps({"model": "sim-model", "prompt": " ".join(["w"] * input_tokens), "max_tokens": output_tokens,
                         "stream": True, "ignore_eos": True,
                         "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    stop = time.perf_counter() + duration
    done = 0

    async def one(k: int) -> None:
        nonlocal done
        await asyncio.sleep(k * duration / 4 / streams)  # stagger the starts over a quarter of the run
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < stop:
            writer.write(head + body)
            buf = b""
            while not buf.endswith(b"0\r\n\r\n"):
                chunk = await reader.read(65536)
                if not chunk:
                    return
                buf = buf[-16:] + chunk
            done += 1
        writer.close()

    await asyncio.gather(*(one(k) for k in range(streams)))
    return done


def _cpu_s(pid: int | None) -> float:
    """user+system CPU seconds of a process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--tokens-per-s", type=float, default=10_000.0, help="fixed timing: target total rate")
    ap.add_argument("--output-tokens", type=int, default=300)
    ap.add_argument("--input-tokens", type=int, default=64)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--timing", choices=["fixed", "model"], default="fixed")
    ap.add_argument("--fixed-grid", action="store_true")
    ap.add_argument("--cpu", type=int, default=0, help="CPU the engine is pinned to (-1: no pinning)")
    ap.add_argument("--nice", type=int, default=0,
                    help="run the engine at this niceness (e.g. -10 as root, so a shared, loaded host does not "
                         "preempt it)")
    ap.add_argument("--realtime", action="store_true",
                    help="run the engine under SCHED_FIFO (chrt -f 10) with --mlock (needs root) so other processes "
                         "and memory reclaim on a shared host cannot stall it: measures the engine, not the host")
    ap.add_argument("--spin-us", type=int, default=0, help="engine busy-waits this long before each deadline")
    ap.add_argument("--client", choices=["drain", "bench"], default="drain",
                    help="drain: minimal byte-discarding clients; bench: bench's own parsing client")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="sim-capacity-"))
    log = tmp / "emissions.parquet"
    port = free_port()
    # each stream spends TTFT (50 ms) + output·ITL per request: pick ITL so the streams deliver the target
    itl_ms = (args.streams * args.output_tokens / args.tokens_per_s - 0.050) / args.output_tokens * 1000
    argv = [sys.executable, "-m", "bench_llm.bench", "sim", "serve", "--port", str(port), "--emission-log", str(log)]
    if args.spin_us:
        argv += ["--spin-us", str(args.spin_us)]
    if args.realtime:
        argv += ["--mlock"]
    if args.timing == "fixed":
        argv += ["--ttft-ms", "50", "--itl-ms", f"{itl_ms:.3f}"] + (["--fixed-grid"] if args.fixed_grid else [])
    else:
        argv += ["--timing", "model", "--model-preset", "llama-3.1-8b", "--gpu", "h100", "--model", "sim-model"]
    if args.cpu >= 0 and hasattr(os, "sched_setaffinity"):
        argv = ["taskset", "-c", str(args.cpu), *argv]
    if args.nice:
        argv = ["nice", "-n", str(args.nice), *argv]
    if args.realtime:
        argv = ["chrt", "-f", "10", *argv]
    if args.cpu >= 0 and hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {c for c in range(os.cpu_count() or 2) if c != args.cpu})  # client elsewhere
    proc = ManagedProcess(argv, tmp / "engine.log")
    proc.start()
    try:
        proc.wait_ready(f"http://127.0.0.1:{port}/health", 30)
        cpu0 = _cpu_s(proc.pid)
        t0 = time.perf_counter()
        if args.client == "drain":
            asyncio.run(drain_clients(port, args.streams, args.duration, args.input_tokens, args.output_tokens))
            wall = time.perf_counter() - t0
            return_after = True
        else:
            return_after = False
        sched = SyntheticWorkload(requests=100_000, input_tokens=args.input_tokens, output_tokens=args.output_tokens,
                                  concurrency=args.streams).schedule()
        cfg = RunConfig(out=tmp / "run", url=f"http://127.0.0.1:{port}", engine="sim", model="sim-model",
                        schedule=sched, options=RunOptions(duration_s=args.duration, progress=False,
                                                           drain_timeout_s=0.0),
                        timeouts=Timeouts(stall=30.0))
        if not return_after:
            asyncio.run(execute_run(cfg, OpenAIAdapter(model="sim-model"), install_signals=False))
            wall = time.perf_counter() - t0
        engine_cpu = (_cpu_s(proc.pid) - cpu0) / wall
    finally:
        proc.stop()
    t = pq.read_table(log).to_pandas()
    # steady state: after the staggered starts, before the end
    lo = t.intended_ns.min() + args.duration / 4 * 1e9 + 1e9
    hi = t.intended_ns.min() + args.duration * 1e9  # clients stop starting requests here
    s = t[(t.intended_ns >= lo) & (t.intended_ns <= hi)]
    late = (s.actual_ns - s.intended_ns).to_numpy() / 1e6
    rate = len(s) / ((hi - lo) / 1e9)
    print(f"command: {' '.join(sys.argv)}")
    print(f"engine: {' '.join(argv[argv.index('serve') - 3:])}" + (f" (nice {args.nice})" if args.nice else "")
          + (" (SCHED_FIFO)" if args.realtime else ""))
    print(f"streams {args.streams}, timing {args.timing}{' (grid)' if args.fixed_grid else ''}, "
          f"engine pinned to CPU {args.cpu}, client {args.client} (other CPUs), run {wall:.1f} s")
    print(f"emitted tokens/s (steady state): {rate:,.0f}; engine CPU {engine_cpu:.0%} of one core "
          f"(~{engine_cpu * 1e6 / max(rate, 1):.0f} µs per token); host load average {os.getloadavg()[0]:.1f}")
    print(f"emission lateness ms: p50 {np.percentile(late, 50):.3f}  p99 {np.percentile(late, 99):.3f}  "
          f"max {late.max():.3f}  (n={len(late):,})")


if __name__ == "__main__":
    main()
