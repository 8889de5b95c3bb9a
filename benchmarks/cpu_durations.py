"""A pytest plugin: the slowest tests by CPU seconds, which a loaded host does not inflate.

``--durations`` reports wall time, and on a shared 2-core machine a test's wall time is mostly
how long it waited for a core. This plugin reports, per test (setup, call and teardown
together), the CPU seconds of the pytest process and of the children it waited for (bench
subprocesses, servers it stopped), beside the wall time.

    PYTHONPATH=benchmarks python -m pytest tests/bench -q -p cpu_durations --cpu-durations=25
"""

from __future__ import annotations

import resource
import time
from collections.abc import Generator

import pytest

_TIMES: dict[str, tuple[float, float]] = {}


def _cpu_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-durations", type=int, default=20, help="how many of the slowest tests to list")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    cpu, wall = _cpu_s(), time.monotonic()
    try:
        return (yield)
    finally:
        _TIMES[item.nodeid] = (_cpu_s() - cpu, time.monotonic() - wall)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    n = int(config.getoption("--cpu-durations"))
    rows = sorted(_TIMES.items(), key=lambda kv: -kv[1][0])[:n]
    total_cpu = sum(c for c, _ in _TIMES.values())
    terminalreporter.write_sep("=", f"slowest {len(rows)} by CPU s (self + waited-for children)")
    for nodeid, (cpu, wall) in rows:
        terminalreporter.write_line(f"{cpu:8.2f} cpu s {wall:8.2f} wall s  {nodeid}")
    terminalreporter.write_line(f"total: {total_cpu:.1f} cpu s over {len(_TIMES)} tests")
