"""The cost of `bench trend` on a long history: time and peak memory (issue 38).

Usage::

    python benchmarks/trend_scale.py [--nights 1000] [--configs 1] [--keep DIR]

Builds a results store of ``--nights`` nightly commits × ``--configs`` configurations, each
entry with bench's default history metrics and the host's event-loop lag (12 series per
configuration), every metric a noisy level with a +10 % step every 100 nights that is fixed 30
nights later; then runs `bench trend STORE --html PAGE` (and with ``--last 100``) in a child
process and prints its wall time, its CPU time and its peak resident memory (the child's
``ru_maxrss``), and the change points it found.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench_llm.analysis.history import DEFAULT_HISTORY_METRICS, HOST_LAG_METRIC
from bench_llm.results.history import Partition, add_entry
from bench_llm.results.schema import HISTORY_SCHEMA


def build(store: Path, nights: int, configs: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    metrics = [*DEFAULT_HISTORY_METRICS, HOST_LAG_METRIC]
    level = np.ones(nights)
    for start in range(50, nights, 100):
        level[start : start + 30] *= 1.10
    day0 = _dt.date(2024, 1, 1)
    for c in range(configs):
        values = {m: 10.0 * level * (1 + 0.02 * rng.standard_normal(nights)) for m in metrics}
        values[HOST_LAG_METRIC] = 0.5 * (1 + 0.2 * rng.standard_normal(nights))
        for i in range(nights):
            day = day0 + _dt.timedelta(days=i)
            t = _dt.datetime(day.year, day.month, day.day, 2, tzinfo=_dt.timezone.utc)
            n = len(metrics)
            rows = pa.table(
                {"run_id": [f"r{c}-{i}"] * n, "config_key": [f"tp{c + 1}"] * n, "start_utc": [t] * n, "added_utc": [t] * n,
                 "engine": ["sim"] * n, "model": ["m"] * n, "bench_version": ["x"] * n, "runs": [1] * n, "requests": [200] * n,
                 "metric": metrics, "value": [float(values[m][i]) for m in metrics], "fingerprint": ['{"concurrency": 4}'] * n},
                schema=HISTORY_SCHEMA,
            )  # fmt: skip
            add_entry(store, Partition(day.isoformat(), f"c{i:05d}", f"tp{c + 1}"), f"r{c}-{i}", rows, [])
    return len(range(50, nights, 100))


_CHILD = """
import resource, subprocess, sys, time
t0 = time.perf_counter()
out = subprocess.run(sys.argv[1:], capture_output=True, text=True, check=False)
wall = time.perf_counter() - t0
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{out.returncode} {wall} {r.ru_utime + r.ru_stime} {r.ru_maxrss}")
sys.stdout.write(out.stdout)
sys.stderr.write(out.stderr)
"""


def measure(argv: list[str]) -> tuple[float, float, float, str]:
    """(wall s, CPU s, peak RSS MB, output) of one child process, measured by a process of its
    own (``RUSAGE_CHILDREN`` of a parent that started only it: its own peak, not the largest so far)."""
    out = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, check=False)
    head, _, rest = out.stdout.partition("\n")
    code, wall, cpu, rss_kb = head.split()
    if int(code) not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} exited {code}: {out.stderr}")
    return float(wall), float(cpu), int(rss_kb) / 1024, rest  # ru_maxrss: KB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nights", type=int, default=1000)
    ap.add_argument("--configs", type=int, default=1)
    ap.add_argument("--keep", type=Path, help="keep the store here")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="trend-scale-"))
    store = args.keep or root / "store"
    t0 = time.perf_counter()
    bumps = build(store, args.nights, args.configs)
    print(f"store: {args.nights} nights × {args.configs} configuration(s) × {len(DEFAULT_HISTORY_METRICS) + 1} metrics, "
          f"{bumps} reverted +10 % bumps per series ({2 * bumps} edges), built in {time.perf_counter() - t0:.1f} s")  # fmt: skip
    bench = [sys.executable, "-m", "bench_llm.bench"]
    for extra in ([], ["--last", "100"]):
        argv = [*bench, "trend", str(store), "--html", str(root / "trend.html"), "--min-change-pct", "5", *extra]
        wall, cpu, rss, out = measure(argv)
        found = [line for line in out.splitlines() if line.startswith(("REGRESSION", "IMPROVEMENT"))]
        print(f"bench trend {' '.join(extra) or '(whole history)'}: {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {rss:.0f} MB, "
              f"{len(found)} flagged change points; page {(root / 'trend.html').stat().st_size / 1e6:.1f} MB")  # fmt: skip
        print("  " + out.splitlines()[0])
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
