"""The summary says plainly, per window, when the client itself was the bottleneck."""

from __future__ import annotations

import pyarrow as pa

from bench_llm.analysis.summary import summarize
from bench_llm.results.schema import MONITOR_SCHEMA, REQUESTS_SCHEMA
from bench_llm.results.writer import _RECORD_FIELDS
from tests.helpers_records import MS, record


def _table(records: list) -> pa.Table:  # type: ignore[type-arg]
    cols = {name: [getattr(r, name) for r in records] for name in _RECORD_FIELDS}
    cols["run_id"] = ["x"] * len(records)
    return pa.Table.from_pydict({n: cols.get(n, [None] * len(records)) for n in REQUESTS_SCHEMA.names}, schema=REQUESTS_SCHEMA)


def _monitor(samples: list[tuple[float, float, float]]) -> pa.Table:
    """(t ms, loop lag ms, cpu s) samples of worker 0."""
    n = len(samples)
    return pa.Table.from_pydict(
        {
            "worker_id": [0] * n,
            "ts_ns": [int(t * MS) for t, _, _ in samples],
            "loop_lag_ns": [None if lag is None else int(lag * MS) for _, lag, _ in samples],
            "cpu_s": [c for _, _, c in samples],
            "in_flight": [1] * n,
            "sent": [0] * n,
            "completed": [0] * n,
        },
        schema=MONITOR_SCHEMA,
    )


def _requests(late_after_ms: float | None) -> pa.Table:
    recs = []
    for i in range(40):  # one request every 500 ms over 20 s
        t = i * 500.0
        lag = 30.0 if late_after_ms is not None and t >= late_after_ms else 0.2
        recs.append(record(f"r{i}", t + lag, [(t + lag + 50, 1), (t + lag + 60, 1)], intended_ms=t))
    return _table(recs)


def test_a_client_that_keeps_up_is_not_flagged() -> None:
    mon = _monitor([(t * 100.0, 1.0, t * 0.02) for t in range(201)] + [(20100.0, None, 4.1)])  # 20 % of a core
    client = summarize(_requests(None), monitor=mon).client
    assert client.warnings == [] and client.saturated_windows == 0
    assert len(client.windows) >= 2 and all(not w.saturated for w in client.windows)
    assert abs(client.cpu_busy_max - 0.2) < 0.05


def test_the_windows_where_the_client_fell_behind_are_flagged() -> None:
    # second half: sends 30 ms late, the loop lags 40 ms, the process uses a full core
    samples = []
    cpu = 0.0
    for k in range(201):
        t = k * 100.0
        busy = 1.0 if t >= 10000 else 0.2
        cpu += 0.1 * busy
        samples.append((t, 40.0 if t >= 10000 else 1.0, cpu))
    client = summarize(_requests(10000.0), monitor=_monitor(samples)).client
    flagged = [w for w in client.windows if w.saturated]
    calm = [w for w in client.windows if not w.saturated]
    assert flagged and calm
    assert all(w.start_s >= 9.0 for w in flagged)  # only the second half
    why = " ".join(" ".join(w.why) for w in flagged)
    assert "send lag" in why and "event-loop lag" in why and "client CPU" in why
    assert any(msg.startswith("client saturated in ") for msg in client.warnings)
    assert sum(w.offered for w in client.windows) == 40 == sum(w.sent for w in client.windows)


def _two_workers(silent_from_ms: float, silent_to_ms: float) -> pa.Table:
    """Samples every 100 ms over 20 s from worker 0 and worker 1 (20 % of a core each);
    worker 1 writes none between the two times (its loop starved), then resumes."""
    rows: list[tuple[int, float]] = [(0, t * 100.0) for t in range(201)]
    rows += [(1, t * 100.0) for t in range(201) if not silent_from_ms < t * 100.0 < silent_to_ms]
    n = len(rows)
    return pa.Table.from_pydict(
        {
            "worker_id": [w for w, _ in rows],
            "ts_ns": [int(t * MS) for _, t in rows],
            "loop_lag_ns": [int(1.0 * MS)] * n,
            "cpu_s": [t / 1000 * 0.2 for _, t in rows],
            "in_flight": [1] * n,
            "sent": [0] * n,
            "completed": [0] * n,
        },
        schema=MONITOR_SCHEMA,
    )


def test_a_silent_worker_fails_the_windows_it_spans_and_is_named() -> None:
    """A window with no sample from one worker is judged on that worker too: its silence
    (4 s without a monitor sample, from 6 s) fails every window it spans, and the summary
    names the worker, even though the healthy worker's samples there look fine."""
    client = summarize(_requests(None), monitor=_two_workers(6000.0, 10000.0)).client
    flagged = [w for w in client.windows if w.saturated]
    assert flagged, client.windows
    for w in client.windows:
        spans = w.start_s < 10.0 and w.end_s > 6.0
        assert w.saturated == spans, w
        assert (any(why == "worker 1 silent for 4.0 s" for why in w.why)) == spans, w
    assert client.silent_workers == [1]
    assert any(m.startswith("client saturated: worker 1 silent for 4.0 s from 6 s") for m in client.warnings), client.warnings


def test_a_short_gap_between_samples_is_not_silence() -> None:
    client = summarize(_requests(None), monitor=_two_workers(6000.0, 6900.0)).client  # 0.9 s apart
    assert client.silent_workers == [] and client.saturated_windows == 0, client.warnings
