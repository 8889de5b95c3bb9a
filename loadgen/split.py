"""Splitting one precomputed schedule across load-generating processes.

The schedule is computed once; each worker gets a share chosen by intended send time:
the measured units (single requests, or whole sessions keyed by their first turn) in
time order go round-robin, unit ``i`` to worker ``i mod n``. Neighbours in time land on
different workers, so a burst is spread over every process. Closed-loop concurrency is
divided as evenly as possible (the first ``c mod n`` workers get one more slot); when
there are fewer slots than workers, only the first ``c`` workers get requests. Warm-up
requests all go to worker 0.
"""

from __future__ import annotations

from collections import defaultdict

from bench_llm.workloads.spec import RequestSpec, Schedule


def _units(measured: tuple[RequestSpec, ...]) -> list[list[RequestSpec]]:
    """Measured requests grouped into units that must stay on one worker (sessions)."""
    sessions: dict[str, list[RequestSpec]] = defaultdict(list)
    units: list[list[RequestSpec]] = []
    for spec in measured:
        if spec.session_id is None:
            units.append([spec])
        else:
            if spec.session_id not in sessions:
                units.append(sessions[spec.session_id])
            sessions[spec.session_id].append(spec)
    for unit in units:
        unit.sort(key=lambda s: s.turn)
    return units


def split_concurrency(concurrency: int, n: int) -> list[int]:
    """``concurrency`` slots over ``n`` workers, as evenly as possible."""
    base, extra = divmod(concurrency, n)
    return [base + (1 if w < extra else 0) for w in range(n)]


def split_schedule(schedule: Schedule, n: int) -> list[Schedule]:
    """``n`` schedules whose union is ``schedule`` (see the module docstring)."""
    if n < 1:
        raise ValueError("the number of workers must be at least 1")
    if n == 1:
        return [schedule]
    units = _units(schedule.measured)
    if schedule.mode == "open":
        # Stable sort: equal offsets (and sessions without one) keep their schedule order.
        units.sort(key=lambda u: u[0].send_offset_ns or 0)
        slots = [1] * n
        receivers = n
    else:
        slots = split_concurrency(schedule.concurrency or 1, n)
        receivers = sum(1 for s in slots if s > 0)
    shares: list[list[RequestSpec]] = [[] for _ in range(n)]
    for i, unit in enumerate(units):
        shares[i % receivers].extend(unit)
    measured_total = max(1, sum(len(s) for s in shares))
    measured_share = [len(s) for s in shares]
    shares[0][:0] = list(schedule.warmup)
    out = []
    for w in range(n):
        out.append(
            Schedule(
                name=schedule.name,
                seed=schedule.seed,
                mode=schedule.mode,
                requests=tuple(shares[w]),
                concurrency=max(1, slots[w]) if schedule.mode == "closed" else schedule.concurrency,
                rate=None if schedule.rate is None else schedule.rate * measured_share[w] / measured_total,
                arrival=schedule.arrival,
                duration_s=schedule.duration_s,
                description={**schedule.description, "worker": w, "workers": n},
            )
        )
    return out
