"""The summary says plainly, per window, when the client itself was the bottleneck."""

from __future__ import annotations

import pyarrow as pa

from analysis.summary import summarize
from results.schema import MONITOR_SCHEMA, REQUESTS_SCHEMA
from results.writer import _RECORD_FIELDS
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
