"""The sweep's typed rows (results/sweep_rows.py): one vocabulary, read back as written, and
files of the earlier version (a run's load spelled ``"load": {"kind", "value", "label"}``) read."""

from __future__ import annotations

import math

from bench_llm.results.sweep_rows import (
    CapacityRecord,
    CapacityRepeats,
    CellColumns,
    ClientLimit,
    Confirmation,
    Judging,
    LoadRef,
    PointRow,
    Reason,
    ReasonCode,
    RunMeta,
    WorkloadColumns,
    capacity_record,
)

CELL = CellColumns("tp2", "sim", "llama-3.1-8b", "h100", 2, 1, 1, 1, 1, 1, None, 2, 1, None)
WORKLOAD = WorkloadColumns("chat", "chat", None, None)


def _point(**kw: object) -> PointRow:
    base = dict(cell=CELL, sweep_id="s1", workload=WORKLOAD, load=LoadRef("rate", 4.0, "rate-4"), repeat=0,
                probe=True, role="probe", status="complete", saturated=False, saturation_reason=None,
                run_dir="cell=tp2/load=rate-4", warmup_requests=2,
                metrics={"requests": 100, "ok": 99, "attainment": 0.95, "miss_share_ttft_ms": 0.05})
    base.update(kw)
    return PointRow(**base)  # type: ignore[arg-type]


def test_point_row_round_trips_in_the_sweeps_column_order() -> None:
    p = _point().with_verdict("pass", None)
    row = p.to_row()
    assert list(row)[:14] == list(CELL.to_row())
    assert row["load_kind"] == "rate" and row["load_value"] == 4.0 and row["load_label"] == "rate-4"
    assert list(row)[-2:] == ["verdict", "verdict_reason"]
    assert PointRow.from_row(row) == p
    assert p.requests == 100 and p.ok == 99 and math.isclose(p.figure("attainment"), 0.95)


def test_a_skipped_point_writes_no_run_folder_and_no_verdict() -> None:
    row = _point(status="skipped", run_dir=None, warmup_requests=None, metrics={}).to_row()
    assert "run_dir" not in row and "warmup_requests" not in row and "verdict" not in row


def test_run_meta_writes_the_point_rows_load_keys_and_reads_the_old_nested_spelling() -> None:
    meta = RunMeta("s1", {"tp": 2, "cell_id": "tp2"}, LoadRef("concurrency", 8.0, "conc-8"), "chat", 1, False, "load")
    row = meta.to_row()
    assert "load" not in row and row["load_kind"] == "concurrency" and row["load_value"] == 8.0
    assert RunMeta.from_row(row) == meta
    old = {"sweep_id": "s1", "cell": {"tp": 2, "cell_id": "tp2"}, "load": {"kind": "concurrency", "value": 8,
           "label": "conc-8"}, "workload": "chat", "repeat": 1, "probe": False, "role": "load"}  # fmt: skip
    assert RunMeta.from_row(old) == meta
    assert RunMeta.from_row({"tags": {}}) is None


def test_capacity_record_writes_only_the_keys_it_has() -> None:
    stopped = capacity_record("search", optional=(), capacity_rps=None, upper_rps=None, precision=0.02,
                              achieved_precision=None, converged=True, probes=0, note="fails")  # fmt: skip
    assert set(stopped.to_row()) == {"method", "capacity_rps", "upper_rps", "precision", "achieved_precision",
                                     "converged", "probes", "note"}  # fmt: skip
    conf = Confirmation(4.0, "pass", None, 4000, 0.97, 5000, 0.96, 0.95, 0.97, True)
    found = capacity_record("search", capacity_rps=4.0, upper_rps=4.1, precision=0.02, achieved_precision=0.025,
                            converged=True, probes=6, note="", interval_low_rps=3.9, interval_high_rps=4.1,
                            undecided=(4.05,), level=0.95, confirmation=conf).with_judged(Judging({"ttft_ms": 300}, 90.0, 0.95))
    row = found.to_row()
    assert row["confirmation"]["pooled_attainment"] == 0.96
    assert row["judged"] == {"slo": {"ttft_ms": 300}, "attainment_pct": 90.0, "confidence": 0.95}
    back = CapacityRecord.from_row(row)
    assert back == found and back.to_row() == row


def test_capacity_repeats_and_client_limit_are_typed_and_read_from_files_of_the_mapping_form() -> None:
    # capacity_json as the sweep wrote it when both were free-form mappings (bench before the typed records)
    old = {"method": "search", "capacity_rps": 9.0, "upper_rps": 18.0, "precision": 0.02, "achieved_precision": 1.0,
           "converged": False, "probes": 4, "note": "", "interval_low_rps": 8.5, "interval_high_rps": 9.7,
           "repeats": {"capacities": [9.2, None], "level": 0.95, "low": 8.5, "high": 9.7, "resolution": 0.18},
           "client_limit": {"rate": 18.0, "workers": 2, "host_load_average": 3.25,
                            "reason": "client-limited: bench's client was saturated in 9 of 10 windows"}}  # fmt: skip
    rec = CapacityRecord.from_row(old)
    assert rec.repeats == CapacityRepeats((9.2, None), 0.95, 8.5, 9.7, 0.18)
    assert rec.client_limit == ClientLimit(18.0, 2, old["client_limit"]["reason"], 3.25)
    assert rec.to_row() == old  # written back key for key
    # a search whose repeats found no interval; a limit found where the host load is not known
    bare = rec.with_extra(repeats=CapacityRepeats((None, None)), client_limit=ClientLimit(18.0, 1, "why"))
    row = bare.to_row()
    assert row["repeats"] == {"capacities": [None, None], "level": None, "low": None, "high": None, "resolution": None}
    assert row["client_limit"] == {"rate": 18.0, "workers": 1, "reason": "why"}
    assert CapacityRecord.from_row(row) == bare
    # damaged values read as unknown, not as an exception
    odd = CapacityRecord.from_row({**old, "repeats": {"capacities": "x"}, "client_limit": {"rate": "fast"}})
    assert odd.repeats == CapacityRepeats(()) and odd.client_limit is not None
    assert math.isnan(odd.client_limit.rate) and odd.client_limit.workers == 1


def test_a_reason_is_a_code_and_a_message() -> None:
    r = Reason(ReasonCode.UNDECIDED, "undecided: 26 more requests needed", more_requests=26)
    assert r.code == "undecided" and str(r) == r.message and r.more_requests == 26


def test_sweep_file_round_trips_and_reads_a_file_without_a_definition() -> None:
    from bench_llm.results.sweep_rows import SweepFile

    f = SweepFile("abc", "1.0", {"model": "m", "slo": {}}, "bench sweep", ("tp1", "tp2"), 1.0, 2.0)
    assert SweepFile.from_row(f.to_row()) == f
    bare = SweepFile.from_row({"sweep_id": "abc"})
    assert bare.spec is None and bare.cells == () and bare.created_unix_s is None


def test_cell_row_round_trips_and_reads_its_capacity_records() -> None:
    from bench_llm.results.sweep_layout import CELLS_SCHEMA
    from bench_llm.results.sweep_rows import CellRow, capacity_json

    rec = capacity_record("rate list", optional=("undecided", "level"), capacity_rps=4.0, upper_rps=8.0,
                          precision=None, achieved_precision=1.0, converged=True, probes=2, note="",
                          undecided=(), level=0.95)  # fmt: skip
    row = CellRow(CELL, "complete", capacity_rps=4.0, capacity_json=capacity_json({"chat": rec}))
    d = row.to_row()
    assert set(d) == set(CELLS_SCHEMA.names)  # every cells.parquet column, spelled here once
    assert CellRow.from_row(d) == row and row.capacity == {"chat": rec} and row.cell_id == "tp2"
