"""How often does this host take a core away? (the noise floor under benchmarks/instrument.py)

A process pinned to one core reads the clock in a tight loop; any gap between two reads
longer than ``--threshold-us`` is time the core ran something else (another task, the
kernel, or, in a VM, the hypervisor). One such process runs on each core at once, as the
client and the engine do in ``benchmarks/instrument.py``.

No timestamp taken in user space can be truer than this: a pause of 3 ms on the engine's
core delays that step's tokens by 3 ms, and one on the client's core delays its user-clock
stamps by as much (``--clock kernel`` stamps are taken by the kernel on receipt, so the
client's pauses do not move them). When ``instrument.py`` shows an ITL p99 above its
target, compare the engine's own gaps (in brackets) and this floor before blaming the
client.

Printed per core: pauses per second above the threshold and above 1 ms, the longest, and
the share of the time lost.

Example:
  python benchmarks/host_noise.py --seconds 10
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time


def _spin(core: int, seconds: float, threshold_ns: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    now = time.perf_counter_ns
    end = now() + int(seconds * 1e9)
    last = now()
    gaps: list[int] = []
    while last < end:
        t = now()
        if t - last > threshold_ns:
            gaps.append(t - last)
        last = t
    out.put((core, gaps))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--threshold-us", type=float, default=50.0)
    ap.add_argument("--cores", default=None, help="comma-separated cores (default: every core this process may use)")
    args = ap.parse_args()
    cores = ([int(c) for c in args.cores.split(",")] if args.cores
             else sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0])
    out: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    procs = [mp.Process(target=_spin, args=(c, args.seconds, int(args.threshold_us * 1000), out)) for c in cores]
    load = os.getloadavg()[0]
    for p in procs:
        p.start()
    results = dict(out.get() for _ in procs)
    for p in procs:
        p.join()
    print(f"# {args.seconds:g} s of a clock-reading loop pinned to each core; pauses > {args.threshold_us:g} us; "
          f"loadavg before {load:.2f}")
    for core in cores:
        gaps = results[core]
        over_1ms = sum(g > 1_000_000 for g in gaps)
        longest = max(gaps, default=0) / 1e6
        lost = 100 * sum(gaps) / (args.seconds * 1e9)
        print(f"core {core}: {len(gaps) / args.seconds:7.1f} pauses/s, {over_1ms / args.seconds:5.1f}/s over 1 ms, "
              f"longest {longest:6.2f} ms, {lost:4.1f} % of the time lost")


if __name__ == "__main__":
    main()
