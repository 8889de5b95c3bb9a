"""A virtual-time sweep's cells in several processes (``bench sweep --jobs``).

In virtual time a cell is pure computation on the simulated engine's model: no server, no
client, no wall clock, nothing shared with the other cells but the sweep folder, where each
cell writes only its own ``cell=...`` folder. So the cells can run side by side, one process
each, and give byte-identical files: each process runs ``CellRunner.run`` exactly as the
one-process sweep does. The parent keeps what must stay in one place: ``cells.parquet``
(each cell's row is stored the moment its process reports, so a finished cell survives the
death of another or of the sweep), and the printed lines, shown in the plan's order (a
cell's lines wait until the cells before it have printed theirs).

A cell's process is a fork of the sweep's own process when that is as safe as forking a fork
server (``fork_point``): the sweep imported what its cells need (``PRELOAD``) before it read
any Parquet, and has started no thread since. Such a fork starts in milliseconds with bench
already imported, and costs no second copy of the imports (about 1 s of CPU on the README's
sweep, which matters most when the host is busy). Otherwise (a resumed sweep has read Parquet,
so Arrow's I/O and CPU pools run, and a lock held by one of their threads would stay held in
the child forever) the processes are forks of a fork server that imported ``PRELOAD`` once,
started before the sweep announces its plan. Either way the child holds the same threads
(numpy's BLAS and jemalloc's, both with fork handlers) and nothing more. Linux only: elsewhere
the fork server (or spawn, where there is none).

Real-time sweeps never come here: each cell's engine shares the host's cores with bench's
client, and two cells at once would measure each other.
"""

from __future__ import annotations

import gc
import importlib
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench_llm.core.errors import SettingError

if TYPE_CHECKING:  # imported where used: the sweep command imports this module before the heavy ones
    from bench_llm.bench.sweep.cell_outcome import CellOutcome
    from bench_llm.bench.sweep.spec import SweepSpec
    from bench_llm.launch.config import ParallelConfig
    from bench_llm.results.sweep_rows import PointRow

Echo = Callable[[str], None]

#: What the fork server imports once, so a cell's process starts with them loaded (the
#: modules a virtual-time cell imports, including those its functions import when called).
PRELOAD = [
    "bench_llm.bench.sweep.cell",
    "bench_llm.bench.sweep.engines",
    "bench_llm.bench.execute",
    "bench_llm.bench.virtual",
    "bench_llm.sim.serve_args",
    "bench_llm.launch.launcher",
    "bench_llm.adapters.openai",
    "bench_llm.adapters.sglang",
    "bench_llm.adapters.tgi",
    "bench_llm.adapters.generic",
    "bench_llm.core.eventloop",
    "uvloop",  # core.eventloop's, when installed (a missing module is skipped)
    "bench_llm.sim.backend",
    "bench_llm.sim.config",
    "bench_llm.analysis.load",
    "bench_llm.analysis.recommend",
    "bench_llm.workloads.synthetic",
    "bench_llm.results.reader",
    # pyarrow imports it the first time a cell turns a time-zoned timestamp into Python; done in
    # a cell's process it failed once in CI ("The zoneinfo module or pytz package must be
    # installed", a fork-server child mid-import): imported once here instead
    "zoneinfo",
]
#: How the cells' processes start: "auto" (the module's docstring); "forkserver", "spawn" and
#: "fork" force one (to measure one against another).
START_METHOD = "auto"
#: The sweep's threads at ``fork_point`` (None: not called, or not on Linux).
_threads_at_fork_point: frozenset[str] | None = None
#: After Ctrl-C, how long the cells' processes get to stop on their own before they are killed.
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CellTask:
    """One cell to run: its plan position (``index``, "[i/n]"), and for a re-judged cell its
    points (``orchestrate.rejudged_points``)."""

    position: int
    cell_id: str
    config: ParallelConfig
    index: str
    prior: list[PointRow] | None = None


@dataclass(frozen=True)
class SweepContext:
    """What every cell's process needs to run a cell as the one-process sweep would."""

    spec: SweepSpec
    sweep_dir: Path
    sweep_id: str
    progress: bool | None
    #: The cells' launcher (None: the simulated engine in virtual time); a cluster's runs real
    #: cells side by side, each its own job (``bench.sweep.cluster``).
    launcher: Any = None
    #: the sweep's ``jobs`` (None: one per CPU): how many repeat searches a cell runs at once
    #: (bench/sweep/repeat_workers.py)
    jobs: int | None = None


def worker_count(jobs: int | None, cells: int, virtual: bool, side_by_side: bool = False) -> int:
    """How many cells run at once: ``jobs`` (None: as many as there are CPUs) in virtual
    time, never more than ``cells``; 1 in real time (``SettingError`` when more were asked),
    unless the cells run ``side_by_side`` on a cluster's nodes (``jobs``, None: 1)."""
    if side_by_side and not virtual:
        if jobs is not None and jobs < 1:
            raise SettingError(f"$jobs {jobs}: give 1 or more")
        return max(1, min(jobs or 1, cells))
    if not virtual:
        if jobs is not None and jobs > 1:
            raise SettingError(
                f"$jobs {jobs}: a sweep in real time runs one cell at a time (each cell's engine shares "
                "the host's cores with bench's client; cells side by side would measure each other)"
            )
        return 1
    if jobs is not None and jobs < 1:
        raise SettingError(f"$jobs {jobs}: give 1 or more")
    want = jobs if jobs is not None else (os.cpu_count() or 1)
    return max(1, min(want, cells))


def fork_point(spec: SweepSpec, jobs: int | None) -> None:
    """Called by a new sweep once it has imported its own modules and before it reads or
    starts anything, when its cells will run in several processes: imports ``PRELOAD`` here,
    so that the cells' processes, forked from this one, start with them, and notes the threads
    those imports left (``start_method``)."""
    global _threads_at_fork_point
    if not sys.platform.startswith("linux") or not spec.virtual or (jobs is not None and jobs < 2):
        return
    from bench_llm.bench.sweep.matrix import expand
    from bench_llm.bench.sweep.repeat_workers import worker_count as repeat_worker_count

    cells = worker_count(jobs, sum(1 for c in expand(spec) if not c.skip_reason), True)
    if cells < 2 and repeat_worker_count(spec, jobs) < 2:  # nothing will be forked from this process
        return
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional one (uvloop)
            pass
    _threads_at_fork_point = _threads()


def _threads() -> frozenset[str] | None:
    """This process's threads as the kernel lists them (Python's ``threading`` does not see
    those started by C libraries); None where /proc cannot tell."""
    try:
        return frozenset(os.listdir("/proc/self/task"))
    except OSError:
        return None


def prestart() -> None:
    """Start the fork server, when the cells' processes will come from it: it imports bench
    (``PRELOAD``) while the sweep announces its plan, so the cells start at once when asked."""
    if start_method() == "forkserver":
        multiprocessing.set_forkserver_preload(PRELOAD)
        from multiprocessing import forkserver

        forkserver.ensure_running()


def start_method() -> str:
    """How a process forked from this one starts now: "fork" when no thread has started since
    the fork point, else the fork server (spawn where there is none)."""
    if START_METHOD != "auto":
        return START_METHOD if START_METHOD in multiprocessing.get_all_start_methods() else "spawn"
    # fewer is fine (numpy's BLAS stops its threads at each fork and starts new ones when next
    # used); any thread not there at the fork point (Arrow's pools, BLAS's restarted) is not
    now = _threads()
    if now is not None and _threads_at_fork_point is not None and now <= _threads_at_fork_point:
        return "fork"
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def child_start_method() -> str:
    """``start_method``, with the fork server running (and importing ``PRELOAD``) when it is the
    one: for processes this one starts (cells, the repeat searches' workers)."""
    method = start_method()
    if method == "forkserver":
        prestart()
    return method


class _ParentGone(Exception):
    pass


def run_cell(conn: Connection, ctx: SweepContext, task: CellTask) -> None:
    """A cell's process: run the cell, send its printed lines and its outcome to the sweep
    (("line", text), then ("done", outcome) | ("interrupted",) | ("raised", exception))."""
    from bench_llm.bench.sweep.cell import CellRunner
    from bench_llm.bench.sweep.cell_outcome import SweepInterrupted
    from bench_llm.bench.sweep.engines import VirtualLauncher
    from bench_llm.bench.sweep.repeat_workers import picklable, repeat_workers

    gc.freeze()  # as the sweep's own process does: the collector need not rescan bench's modules
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def send(msg: tuple[Any, ...]) -> None:
        try:
            conn.send(msg)
        except OSError:  # the sweep is gone: stop at the next line instead of computing on
            raise _ParentGone from None

    launcher = ctx.launcher if ctx.launcher is not None else VirtualLauncher()
    runner = CellRunner(ctx.spec, ctx.sweep_dir, ctx.sweep_id, launcher, lambda line: send(("line", line)),
                        ctx.progress)  # fmt: skip
    global _threads_at_fork_point
    _threads_at_fork_point = _threads()  # just forked: the repeat searches' workers fork from here
    # the sweep still ends this process with it (its own copy of the flag); unflagged here, it
    # may start those workers, daemonic themselves: they end with it (bench/sweep/repeat_workers.py)
    multiprocessing.current_process().daemon = False
    try:
        with repeat_workers(ctx.spec, ctx.jobs, child_start_method):
            outcome = runner.run(task.config, task.cell_id, task.index, task.prior)
    except _ParentGone:
        return
    except (SweepInterrupted, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C (the sweep passes it on) is moot
        _try_send(conn, ("interrupted",))
        return
    except BaseException as exc:  # noqa: BLE001  # the cell's code raised: the sweep raises it, as in one process
        # the cell has ended: the sweep stopping the others (SIGINT) must not cut this report
        # short (a full disk printed a KeyboardInterrupt traceback from here, 1 time in 3)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _try_send(conn, ("raised", picklable(exc, traceback.format_exc())))
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ended: a Ctrl-C now is moot, the outcome goes to the sweep
    _try_send(conn, ("done", outcome))


def _try_send(conn: Connection, msg: tuple[Any, ...]) -> None:
    try:
        conn.send(msg)
    except OSError:
        pass


#: The function a cell's process runs (tests put one in that dies).
WORKER: Callable[[Connection, SweepContext, CellTask], None] = run_cell


@dataclass
class _Running:
    task: CellTask
    process: Any  # multiprocessing's BaseProcess
    conn: Connection
    lines: list[str] = field(default_factory=list)
    ended: tuple[Any, ...] | None = None


class _PlanOrder:
    """Printed lines in the plan's order: the first unfinished cell's lines go out as they
    come, a later cell's wait until every cell before it has finished."""

    def __init__(self, echo: Echo, positions: Sequence[int]) -> None:
        self.echo = echo
        self.order = list(positions)
        self.head = 0
        self.held: dict[int, list[str]] = {p: [] for p in positions}
        self.closed: set[int] = set()

    def line(self, position: int, text: str) -> None:
        if self.head < len(self.order) and position == self.order[self.head]:
            self.echo(text)
        else:
            self.held[position].append(text)

    def close(self, position: int) -> None:
        self.closed.add(position)
        while self.head < len(self.order) and self.order[self.head] in self.closed:
            self.head += 1
            if self.head < len(self.order):
                for text in self.held.pop(self.order[self.head], []):
                    self.echo(text)

    def flush(self) -> None:
        """Everything still held, in order (the sweep stops)."""
        for p in self.order[self.head :]:
            for text in self.held.pop(p, []):
                self.echo(text)


class _Pool:
    """The running cells' processes and what they reported."""

    def __init__(self, ctx: SweepContext, order: _PlanOrder,
                 finished: Callable[[CellTask, CellOutcome, Echo], None]) -> None:  # fmt: skip
        self.ctx = ctx
        self.order = order
        self.finished = finished
        self.running: dict[int, _Running] = {}
        #: cells cut short (interrupted, raised, or killed while the sweep stopped)
        self.cut: list[CellTask] = []
        self.raised: list[tuple[CellTask, BaseException]] = []
        self.interrupted = False

    def start(self, task: CellTask) -> None:
        # chosen at each start: a thread started since the last one makes forking this process unsafe
        method = child_start_method()
        mp: Any = multiprocessing.get_context(method)  # its Process and Pipe (typeshed's context lacks them)
        parent, child = mp.Pipe(duplex=False)
        proc = mp.Process(target=WORKER, args=(child, self.ctx, task), name=f"bench-cell-{task.cell_id}", daemon=True)
        proc.start()
        child.close()
        self.running[task.position] = _Running(task, proc, parent)

    def poll(self, timeout: float | None, stopping: bool = False) -> None:
        """Wait up to ``timeout`` for a report; settle every cell whose process ended."""
        rs = list(self.running.values())
        ready = set(wait([r.conn for r in rs] + [r.process.sentinel for r in rs], timeout))
        for r in rs:
            if r.conn not in ready and r.process.sentinel not in ready:
                continue
            self._read(r)
            if r.ended is None and r.process.is_alive():
                continue
            r.process.join()
            self._read(r)  # what it sent before it ended
            self._settle(r, r.ended or ("died",), stopping)

    def _read(self, r: _Running) -> None:
        try:
            while r.ended is None and r.conn.poll():
                msg = r.conn.recv()
                if msg[0] == "line":
                    r.lines.append(msg[1])
                    self.order.line(r.task.position, msg[1])
                else:
                    r.ended = msg
        except (EOFError, OSError):
            pass

    def _settle(self, r: _Running, end: tuple[Any, ...], stopping: bool) -> None:
        pos = r.task.position
        del self.running[pos]
        r.process.join()
        r.conn.close()
        kind = end[0]
        if kind == "done" or (kind == "died" and not stopping):
            outcome = end[1] if kind == "done" else _died(r)
            self.finished(r.task, outcome, lambda text: self.order.line(pos, text))
            self.order.close(pos)
            return
        self.cut.append(r.task)
        if kind == "raised":
            self.raised.append((r.task, end[1]))
        elif kind == "interrupted" and not stopping:  # Ctrl-C reached the cell first (not passed on by stop)
            self.interrupted = True

    def stop(self) -> None:
        """Ctrl-C passed on to the running cells, up to STOP_TIMEOUT_S for them to stop, then
        killed; a cell that finishes meanwhile is kept, the rest are cut short."""
        for r in self.running.values():
            if r.process.is_alive() and r.process.pid is not None:
                try:
                    os.kill(r.process.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_TIMEOUT_S
        try:
            while self.running and time.monotonic() < deadline:
                self.poll(max(0.0, deadline - time.monotonic()), stopping=True)
        except KeyboardInterrupt:  # Ctrl-C again: stop waiting
            pass
        for r in list(self.running.values()):
            if r.process.is_alive():
                r.process.kill()
            self._settle(r, ("killed",), stopping=True)


def run_cells(
    tasks: Sequence[CellTask],
    ctx: SweepContext,
    jobs: int,
    echo: Echo,
    started: Callable[[CellTask], CellTask],
    finished: Callable[[CellTask, CellOutcome, Echo], None],
    stopped: Callable[[CellTask], None],
) -> bool:
    """Run ``tasks`` in up to ``jobs`` processes; True when interrupted (Ctrl-C). ``started``:
    before a cell's process starts (returns the task to run); ``finished``: with the cell's
    outcome, and an echo that prints in plan order, as soon as it ends (a process that died: a
    failed cell); ``stopped``: for each cell cut short by Ctrl-C or by another cell raising.
    Re-raises what a cell raised, as the one-process sweep would, once the others stopped."""
    order = _PlanOrder(echo, [t.position for t in tasks])
    pool = _Pool(ctx, order, finished)
    waiting = list(tasks)
    try:
        while (waiting or pool.running) and not (pool.raised or pool.interrupted):
            while waiting and len(pool.running) < jobs:
                pool.start(started(waiting.pop(0)))
            pool.poll(None)
    except KeyboardInterrupt:
        pool.interrupted = True
    if pool.running:
        pool.stop()
    raisers = {t.position for t, _ in pool.raised}  # left as an error leaves a cell: running
    for task in sorted(pool.cut, key=lambda t: t.position):
        if task.position not in raisers:
            stopped(task)
    order.flush()
    if pool.raised and not pool.interrupted:
        raise min(pool.raised, key=lambda x: x[0].position)[1]
    return pool.interrupted


def _died(r: _Running) -> CellOutcome:
    from bench_llm.bench.sweep.cell_outcome import CellOutcome

    code = r.process.exitcode
    how = f"exit code {code}"
    if code is not None and code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    tail = "\n".join(r.lines[-8:]) or None
    return CellOutcome("failed", f"the cell's process died ({how}) before the cell finished", tail)
