"""Distributed (locust master + N workers on loopback) vs single-process accuracy.

Runs the same Poisson workload against one simulated engine three times: single process,
distributed, single process again. The single-vs-single difference is the run-to-run
noise floor; the distributed-vs-single difference should sit within it.

    python benchmarks/distributed_accuracy.py [--requests 200] [--rate 20] [--workers 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_llm.analysis.load import load_run
from bench_llm.analysis.summary import summarize
from bench_llm.bench.distributed.loopback import run_loopback
from bench_llm.bench.embedded import embedded_engine
from bench_llm.results.reader import read_run_meta

ROWS = [
    ("requests ok", lambda s: s.requests.ok),
    ("achieved req/s", lambda s: s.throughput.requests_per_s),
    ("output tok/s", lambda s: s.throughput.output_tokens_per_s),
    *[(f"TTFT p{p} ms", lambda s, p=p: s.latency["ttft_ms"][f"p{p}"]) for p in (50, 90, 99)],
    *[(f"ITL p{p} ms", lambda s, p=p: s.latency["itl_ms"][f"p{p}"]) for p in (50, 90, 99)],
    *[(f"send lag p{p} ms", lambda s, p=p: s.latency["schedule_lag_ms"][f"p{p}"]) for p in (50, 99)],
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()
    workload = ["--rate", str(args.rate), "--arrival", "poisson", "--requests", str(args.requests),
                "--input-tokens", "128", "--output-tokens", "64", "--seed", str(args.seed)]  # fmt: skip
    base = Path(tempfile.mkdtemp(prefix="bench-dist-acc-"))
    with embedded_engine(base / "engine.log", ["--ttft-ms", "50", "--itl-ms", "10"]) as url:

        def single(name: str) -> Path:
            out = base / name
            argv = [sys.executable, "-m", "bench_llm.bench", "run", "--url", url, "--out", str(out), "--no-progress", *workload]
            subprocess.run(argv, check=True, capture_output=True)
            return out

        a = single("single_a")
        dist = run_loopback(url, base / "dist", workload, workers=args.workers)
        if dist.returncode != 0:
            sys.exit(f"distributed run failed:\n{dist.master_stderr}")
        b = single("single_b")
    sa, sd, sb = (summarize(load_run(p).requests) for p in (a, base / "dist", b))
    print(f"workload: Poisson {args.rate:g} req/s, {args.requests} requests, 128 in / 64 out tokens; "
          f"engine: sim fixed 50 ms TTFT, 10 ms ITL; distributed: {args.workers} workers on 127.0.0.1")  # fmt: skip
    print(f"{'metric':<18}{'single A':>11}{'distrib.':>11}{'single B':>11}{'|D-A|':>9}{'|B-A|':>9}")
    for label, get in ROWS:
        va, vd, vb = get(sa), get(sd), get(sb)
        print(f"{label:<18}{va:>11.2f}{vd:>11.2f}{vb:>11.2f}{abs(vd - va):>9.2f}{abs(vb - va):>9.2f}")
    for w in read_run_meta(base / "dist")["extra"]["distributed"]["workers"]:
        cs = w["clock_start"]
        print(f"worker {w['worker_id']}: {w['recorded']}/{w['scheduled']} recorded, same clock {w['same_clock']}, "
              f"measured offset {cs['offset_ns'] / 1e3:.1f} us (+-{cs['error_bound_ns'] / 1e3:.1f} us), "
              f"drift {(w['drift_ns'] or 0) / 1e3:.1f} us")  # fmt: skip
    print(f"runs kept in {base}")


if __name__ == "__main__":
    main()
