"""Repeat capacity searches with fresh workload seeds (``loads.capacity_repeats``): the
capacity's interval is their prediction interval (analysis/capacity_repeats.py,
docs/sweeps.md: Capacity and its interval).

Each repeat is the cell's whole capacity search again (the one-at-a-time baseline reused),
its loads seeded apart from the main search's and from any other seed's (``SEQ_STRIDE``), its
run folders prefixed ``seed<k>-`` and its points kept in ``repeat-<k>-points.parquet``, so the
cell's own points, verdicts and table are the main search's alone.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bench_llm.analysis.capacity import CapacityResult
from bench_llm.analysis.capacity_repeats import RepeatInterval, with_repeats
from bench_llm.bench.sweep.cell_echo import Echo
from bench_llm.bench.sweep.cell_outcome import CellOutcome
from bench_llm.results.sweep_rows import CapacityRepeats, ClientLimit

if TYPE_CHECKING:
    from collections.abc import Callable

    from bench_llm.bench.sweep.spec import SweepSpec, WorkloadSpec
    from bench_llm.bench.virtual import VirtualEngine
    from bench_llm.launch.config import ParallelConfig
    from bench_llm.loadgen.otlp import OtlpReceiver

#: A repeat's loads number from k × SEQ_STRIDE (a load's seed is the workload seed + 1000 ×
#: its number, bench/sweep/loads.py): no repeat shares prompts or arrivals with the main
#: search, another repeat, or another workload seed's search.
SEQ_STRIDE = 1000


class _Runner(Protocol):
    """What a repeat reads of the cell that runs it (``bench.sweep.cell_loads.CellContext``)."""

    spec: SweepSpec
    sweep_dir: Path
    sweep_id: str
    echo: Echo
    otlp: OtlpReceiver | None
    virtual: VirtualEngine | None
    remote: Any


class _Repeatable(Protocol):
    """A workload's capacity search (``bench.sweep.cell_loads.WorkloadLoads``)."""

    out: CellOutcome
    index: str
    cell_id: str
    w: WorkloadSpec

    @property
    def spec(self) -> SweepSpec: ...

    @property
    def runner(self) -> _Runner: ...

    def repeat(self, k: int, runner: _QuietRunner) -> _Repeatable: ...

    def capacity_search(self) -> bool: ...


class _QuietRunner:
    """The cell as a repeat search sees it: its lines are not printed (one summary is)."""

    def __init__(self, runner: _Runner) -> None:
        self.spec: SweepSpec = runner.spec
        self.sweep_dir: Path = runner.sweep_dir
        self.sweep_id: str = runner.sweep_id
        self.progress: bool | None = False
        self.otlp: OtlpReceiver | None = runner.otlp
        self.virtual: VirtualEngine | None = runner.virtual
        self.remote: Any = runner.remote  # a cluster's load Jobs (bench/sweep/cluster_kube.py)
        self.capacity_hint: Callable[[ParallelConfig, str], float | None] | None = None
        self.echo: Echo = _silent


def _silent(line: str) -> None:
    del line


def run_repeats(loads: _Repeatable, result: CapacityResult) -> bool:
    """Run ``loads.capacity_repeats`` repeat searches after the main one found ``result``; set
    the capacity's interval from them (in ``loads.out.capacity``). False: the engine died."""
    spec, runner, w = loads.spec, loads.runner, loads.w
    cap = loads.out.capacity[w.tag]
    count = spec.loads.capacity_repeats
    if count < 1:
        return True
    from bench_llm.bench.sweep.repeat_workers import current as current_workers
    from bench_llm.bench.sweep.repeat_workers import one_by_one

    quiet = _QuietRunner(runner)
    subs = [loads.repeat(k, quiet) for k in range(1, count + 1)]
    workers = current_workers() if runner.virtual is not None and runner.remote is None else None
    # side by side in worker processes (bench/sweep/repeat_workers.py), else one after the other
    found = workers.run(subs, w.tag) if workers is not None else one_by_one(subs, w.tag)
    caps: list[float | None] = []
    for one in found:
        if not one.ok:
            loads.out.status, loads.out.reason, loads.out.log_tail = one.status, one.reason, one.log_tail
            return False
        caps.append(one.capacity_rps)
    low, high, got = with_repeats(result.capacity_rps, result.interval_low_rps, result.interval_high_rps, caps,
                                  spec.loads.capacity_precision)  # fmt: skip
    loads.out.capacity[w.tag] = cap.with_extra(interval_low_rps=low, interval_high_rps=high, repeats=_repeats(caps, got))
    if got is not None:
        runner.echo(f"{loads.index} {loads.cell_id}: {got.text()}")
    else:
        runner.echo(f"{loads.index} {loads.cell_id}: the repeat searches found no capacity ({caps}): "
                    "the interval is the one search's")  # fmt: skip
    return True


def _repeats(caps: list[float | None], got: RepeatInterval | None) -> CapacityRepeats:
    if got is None:
        return CapacityRepeats(tuple(caps))
    return CapacityRepeats(tuple(caps), got.level, got.low, got.high, got.resolution)


def host_load(limit: ClientLimit) -> tuple[ClientLimit, str]:
    """The host's load average when a capacity was found client-limited (the limit with it
    kept, and what to print): a client starved by other work on a shared host looks saturated
    too, and more client processes do not help it."""
    import os

    try:
        load = os.getloadavg()[0]
    except OSError:
        return limit, ""
    cpus = os.cpu_count() or 1
    busy = f": the host is busy (more runnable processes than its {cpus} CPUs), the client may be starved" if load > cpus else ""
    return replace(limit, host_load_average=round(load, 2)), f" (host load average {load:.1f} on {cpus} CPUs{busy})"
