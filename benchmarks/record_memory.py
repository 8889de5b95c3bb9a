"""Does the client's memory stay flat over a long recording? (issue 8: rows flushed as they go)

Runs ``bench run`` (the real CLI path) closed loop against the lean batch-stepping engine of
``benchmarks/instrument.py`` (client and engine pinned to different cores, as there) for
``--requests`` requests and samples the client's resident memory (VmRSS of the client and
any worker processes it starts, from /proc, every ``--interval`` s) together with the rows
already written to the run folder. A recording of 1M requests at 25k tokens/s would take
hours; what matters is the slope: memory that grows with the requests done would, over 1M
requests, grow 25x further than over 40k.

With ``--seconds S`` the run is time-bound instead (``bench run --duration S``, requests
enough for S seconds at the engine's nominal pace), and the percentages below refer to the
rows the run wrote in the end.

Printed: RSS when 10 %, 50 % and 100 % of the requests were written (100 %: all but the
last part file, so the sample precedes the closing summary), the least-squares
slope of RSS against requests written between 10 % and 100 % (MB per 10k requests), the
peak of the samples and the client's own high-water mark (``ru_maxrss`` of the reaped
``bench run`` process, i.e. its VmHWM: both include the closing part-file merge and
summary), wall time, and the load average before/after (the machine may be shared).

Example:
  python benchmarks/record_memory.py --requests 40000 --concurrency 512
  python benchmarks/record_memory.py --seconds 60 --concurrency 1024 --shape end   # issue 20's target
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import instrument  # noqa: E402  (the lean engine and its launcher)

from bench_llm.launch.process import free_port  # noqa: E402


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class RowsWritten:
    """Rows in the run folder's request part files so far (each new file's footer read once)."""

    def __init__(self, run_dir: Path) -> None:
        self.folder = run_dir / "requests"
        self.seen: dict[str, int] = {}

    def count(self) -> int:
        import pyarrow.parquet as pq

        if self.folder.is_dir():
            for name in os.listdir(self.folder):
                if name.endswith(".parquet") and not name.startswith(".") and name not in self.seen:
                    try:
                        self.seen[name] = pq.ParquetFile(self.folder / name).metadata.num_rows
                    except OSError:
                        continue
        return sum(self.seen.values())


def sample(proc: subprocess.Popen[bytes], run_dir: Path, interval: float, out: list[tuple[float, int, int]]) -> None:
    rows = RowsWritten(run_dir)
    t0 = time.monotonic()
    while proc.poll() is None:
        rss = sum(_rss_kib(p) for p in _tree(proc.pid))
        out.append((time.monotonic() - t0, rss, rows.count()))
        time.sleep(interval)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--seconds", type=float, default=None,
                    help="time-bound run (bench run --duration) instead of --requests")
    ap.add_argument("--concurrency", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between RSS samples")
    ap.add_argument("--client-cpus", default="0")
    ap.add_argument("--server-cpus", default="1")
    ap.add_argument("--keep", type=Path, help="keep the run folder here")
    ap.add_argument("--trace", type=Path, help="write the samples here (CSV: seconds, RSS KiB, rows written)")
    ap.add_argument("--shape", choices=instrument.SHAPES, default="every",
                    help="where the lean engine puts usage (instrument.py --shape)")
    args = ap.parse_args()
    engine_args = argparse.Namespace(server="lean", server_cpus=args.server_cpus, ttft_ms=args.ttft_ms,
                                     itl_ms=args.itl_ms, model="sim-model", no_log=True, shape=args.shape)
    tmp = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    run_dir = args.keep or tmp / "run"
    port = free_port()
    load0 = os.getloadavg()
    engine, _ = instrument._start_engine(engine_args, port, tmp / "emission.parquet", tmp / "engine.log")
    samples: list[tuple[float, int, int]] = []
    hwm_kib = 0
    t = time.perf_counter()
    requests = args.requests
    duration: list[str] = []
    if args.seconds is not None:  # enough requests for the nominal pace; --duration ends the run
        per_request_s = (args.ttft_ms + args.tokens * args.itl_ms) / 1000
        requests = args.concurrency * (int(args.seconds / per_request_s) + 2)
        duration = ["--duration", f"{args.seconds:g}"]
    try:
        argv = [sys.executable, "-m", "bench_llm.bench", "run", "--url", f"http://127.0.0.1:{port}", "--model", "sim-model",
                "--concurrency", str(args.concurrency), "--requests", str(requests), "--input-tokens", "32",
                "--output-tokens", str(args.tokens), "--out", str(run_dir), "--no-progress", "--json",
                "--stall-timeout", "60", *duration]
        cpus = instrument._cpuset(args.client_cpus)
        client = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO,
                                  env={**os.environ, "PYTHONPATH": str(REPO)},
                                  preexec_fn=(lambda: instrument._pin(cpus)) if cpus else None)
        sampler = threading.Thread(target=sample, args=(client, run_dir, args.interval, samples), daemon=True)
        sampler.start()
        _, stderr = client.communicate()
        # communicate() reaped it: the engine is still running (not reaped), so the largest
        # reaped child is the client
        import resource

        hwm_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        sampler.join()
        if client.returncode != 0:
            raise SystemExit(f"bench run failed ({client.returncode}): {stderr.decode()[-2000:]}")
    finally:
        instrument._stop(engine)
    wall = time.perf_counter() - t
    if args.trace:
        args.trace.write_text("".join(f"{ts:.3f},{rss},{rows}\n" for ts, rss, rows in samples))
    report(samples, args, wall, load0, hwm_kib, RowsWritten(run_dir).count())
    if args.keep is None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def report(
    samples: list[tuple[float, int, int]], args: argparse.Namespace, wall: float, load0: tuple[float, ...], hwm_kib: int,
    rows_final: int,
) -> None:
    a = np.array(samples, dtype=np.float64).reshape(-1, 3)
    ts, rss_mb, rows = a[:, 0], a[:, 1] / 1024, a[:, 2]
    n = args.requests if args.seconds is None else rows_final
    bound = f"{n} requests" if args.seconds is None else f"{args.seconds:g} s ({n} requests)"
    print(f"# bench run: {bound} x {args.tokens} tokens, usage shape {args.shape}, closed loop {args.concurrency} in flight, lean engine "
          f"(TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms); client cpus {args.client_cpus or 'any'}, engine cpus "
          f"{args.server_cpus or 'any'}; {len(a)} samples every {args.interval:g} s")
    for frac in (0.1, 0.5, 1.0):
        k = np.flatnonzero(rows >= min(frac * n, n - 256))  # 100 %: all but the last part (<= 256 rows)
        if len(k):
            i = k[0]
            print(f"RSS at {100 * frac:3.0f} % written ({int(rows[i]):>8} rows, t={ts[i]:6.1f} s): {rss_mb[i]:7.1f} MB")
        else:
            print(f"RSS at {100 * frac:3.0f} %: not reached (last sample {int(rows[-1]) if len(rows) else 0} rows)")
    # from 10 % to the 100 % sample: the closing summary (after the last part) is not recording
    end = np.flatnonzero(rows >= n - 256)
    window = (rows >= 0.1 * n) & (np.arange(len(rows)) <= (end[0] if len(end) else len(rows) - 1))
    if window.sum() >= 3 and np.ptp(rows[window]) > 0:
        slope = np.polyfit(rows[window], rss_mb[window], 1)[0] * 10_000
        print(f"slope 10-100 %: {slope:+.2f} MB per 10k requests (x100 for 1M requests: {100 * slope:+.0f} MB)")
    if len(a):
        print(f"peak RSS {rss_mb.max():.1f} MB (includes the closing summary); rows written {int(rows[-1])}")
    print(f"client VmHWM {hwm_kib / 1024:.1f} MB (ru_maxrss of bench run: recording, part-file merge, summary)")
    print(f"wall {wall:.1f} s; loadavg before {load0[0]:.2f}, after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
