"""The repeat capacity searches of a virtual-time cell in worker processes, side by side
(bench/sweep/cell_repeats.py).

A repeat search is the cell's whole capacity search again on fresh seeds: pure computation on
the simulated engine's model, writing only its own run folders and points file. So the
repeats of a cell can run at once, one process each, and give the same files and capacities
as one after the other (tests/bench/test_repeat_workers.py).

The workers are started before the cell runs, where forking is safe (``parallel.start_method``: a
fork of the sweep before it read any Parquet, or of a cell's process as it starts; otherwise
from the fork server): by the time the main search has found its capacity, Arrow's thread
pools run in the cell's process, and a lock held by one of their threads would stay held in a
fork. Each worker takes one search at a time over its pipe and answers with what the cell
needs of it (``Found``); at most ``count`` of them exist, for as long as the sweep or the cell.

Ctrl-C: the workers ignore SIGINT and the process that owns them decides; when it stops (an
interrupt, an error), it kills them, as the sweep's ``--resume`` reruns the cell anyway.
Real-time sweeps never come here: a repeat measures a live engine, and two at once would
measure each other.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from bench_llm.bench.sweep.spec import SweepSpec

#: How long a worker gets to end on its own when the pool closes, before it is killed.
CLOSE_TIMEOUT_S = 2.0


class Search(Protocol):
    """A repeat search as ``cell_repeats.run_repeats`` builds it (``WorkloadLoads.repeat``)."""

    def capacity_search(self) -> bool: ...


@dataclass(frozen=True)
class Found:
    """What a repeat search gives its cell: whether the engine lived, the outcome's status,
    reason and log tail when it did not, and the capacity it found (None: none)."""

    ok: bool
    status: str
    reason: str | None
    log_tail: str | None
    capacity_rps: float | None


def run_search(sub: Any, tag: str) -> Found:
    """One repeat search, in whatever process calls it: ``sub`` is a ``WorkloadLoads``."""
    ok = sub.capacity_search()
    found = sub.out.capacity.get(tag)
    cap = found.capacity_rps if found is not None else None
    return Found(ok, sub.out.status, sub.out.reason, sub.out.log_tail, cap)


def one_by_one(subs: Sequence[Search], tag: str) -> list[Found]:
    """The repeat searches in this process, one after the other, stopping at the first whose
    engine died (what ``RepeatWorkers.run`` gives when there are no workers)."""
    found: list[Found] = []
    for sub in subs:
        found.append(run_search(sub, tag))
        if not found[-1].ok:
            break
    return found


def worker_count(spec: SweepSpec, jobs: int | None) -> int:
    """Repeat searches at once for one cell: ``loads.capacity_repeats``, at most ``jobs`` (None:
    the CPUs); 0 where they run in the cell's own process (real time, one CPU, no repeats,
    ``--jobs 1``)."""
    loads = spec.loads
    if not spec.virtual or not loads.capacity or not spec.slo or spec.cluster is not None:
        return 0
    n = min(loads.capacity_repeats, jobs if jobs is not None else (os.cpu_count() or 1))
    return n if n >= 2 else 0


def _serve(conn: Connection) -> None:
    """A worker: searches in, ``("found", Found)`` or ``("raised", exception)`` out, until the
    pipe closes."""
    import gc

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the pool's owner decides (the module's docstring)
    gc.freeze()  # bench's modules, imported before the fork: the collector need not rescan them
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        sub, tag = msg
        try:
            reply: tuple[str, Any] = ("found", run_search(sub, tag))
        except BaseException as exc:  # noqa: BLE001  # the search raised: its cell raises it, as in one process
            reply = ("raised", picklable(exc))
        try:
            conn.send(reply)
        except OSError:  # the owner is gone
            return


class RepeatWorkers:
    """``count`` worker processes, started now (``method``: a multiprocessing start method)."""

    def __init__(self, count: int, method: str) -> None:
        mp: Any = multiprocessing.get_context(method)  # its Process and Pipe (typeshed's context lacks them)
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        for i in range(count):
            parent, child = mp.Pipe(duplex=True)
            proc = mp.Process(target=_serve, args=(child,), name=f"bench-repeat-{i + 1}", daemon=True)
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)

    @property
    def count(self) -> int:
        return len(self.procs)

    def run(self, subs: Sequence[Search], tag: str) -> list[Found]:
        """Every search in ``subs`` on the workers, at most one per worker at a time; their
        answers in ``subs``' order. Re-raises what a search raised (the first in order); a
        worker that died gives a failed search. Kills the workers on any exception here."""
        try:
            return self._run(subs, tag)
        except BaseException:
            self.kill()
            raise

    def _run(self, subs: Sequence[Search], tag: str) -> list[Found]:
        answers: dict[int, tuple[str, Any]] = {}
        waiting = list(enumerate(subs))
        busy: dict[int, int] = {}  # worker -> the search it runs
        while waiting or busy:
            for w in range(self.count):
                if waiting and w not in busy and self.procs[w].is_alive():
                    k, sub = waiting.pop(0)
                    self.conns[w].send((sub, tag))
                    busy[w] = k
            if not busy:  # every worker died before it took a search
                for k, _ in waiting:
                    answers[k] = ("found", _died(None))
                break
            ready = set(wait([self.conns[w] for w in busy] + [self.procs[w].sentinel for w in busy]))
            for w in list(busy):
                conn = self.conns[w]
                if conn not in ready and self.procs[w].sentinel not in ready:
                    continue
                k = busy.pop(w)
                try:
                    answers[k] = conn.recv()
                except (EOFError, OSError):  # it died mid-search
                    self.procs[w].join()
                    answers[k] = ("found", _died(self.procs[w].exitcode))
        out: list[Found] = []
        for k in range(len(subs)):
            kind, value = answers.get(k, ("found", _died(None)))
            if kind == "raised":
                raise value
            out.append(value)
        return out

    def close(self) -> None:
        """Tell the workers to end; kill those still there after ``CLOSE_TIMEOUT_S``."""
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self.procs:
            proc.join(CLOSE_TIMEOUT_S)
        self.kill()

    def kill(self) -> None:
        """End the workers now (idempotent)."""
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
            proc.join()
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []


def picklable(exc: BaseException, trace: str | None = None) -> BaseException:
    """``exc`` if it crosses a process boundary intact, else a RuntimeError with its text."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001  # whatever fails to pickle travels as its text
        return RuntimeError(f"{type(exc).__name__}: {exc}" + (f"\n{trace}" if trace else ""))


def _died(code: int | None) -> Found:
    how = f"exit code {code}" if code is not None and code >= 0 else f"signal {-code}" if code is not None else "unknown"
    return Found(False, "failed", f"a repeat search's process died ({how}) before the search finished", None, None)


#: This process's workers, while ``repeat_workers`` holds them (None: repeats run in-process).
_current: RepeatWorkers | None = None


def current() -> RepeatWorkers | None:
    return _current


@contextlib.contextmanager
def repeat_workers(spec: SweepSpec, jobs: int | None, start_method: Callable[[], str]) -> Iterator[RepeatWorkers | None]:
    """The repeat searches' workers for a sweep's own process (cells one at a time) or a
    cell's process (``parallel.run_cell``), started here, where forking is safe, and ended on
    leaving. ``start_method``: how they start (``parallel.child_start_method``, asked only when
    there are workers to start). Yields None when the repeats run in-process (``worker_count``)."""
    global _current
    count = worker_count(spec, jobs)
    if count < 2 or _current is not None:
        yield None
        return
    pool = RepeatWorkers(count, start_method())
    _current = pool
    try:
        yield pool
    except BaseException:
        pool.kill()  # an interrupt or an error: nothing is left for them to do
        raise
    finally:
        _current = None
        pool.close()
