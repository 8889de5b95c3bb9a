"""Issue 33: a transport never follows a redirect silently (a 3xx is a recorded failure
naming its target, without the target's credentials)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench_llm.loadgen.transport import Timeouts
from tests.hostile_server import hostile, make, record_one, run


@pytest.mark.parametrize("kind", ["raw", "python", "aiohttp"])
def test_a_redirect_is_a_failure_naming_its_target(kind: str) -> None:
    with hostile("redirect") as server:
        r = run(record_one(make(kind, server.url, Timeouts(stall=5.0, total=20.0))))
        assert server.requests == 1  # not sent again anywhere
    assert not r.ok and r.error_type == "redirect" and r.http_status == 307
    assert "redirect to http://***@127.0.0.1:9/v1/completions" in (r.error_message or "")
    assert "secret" not in (r.error_message or "")


@pytest.mark.parametrize("kind", ["raw", "python", "aiohttp"])
def test_counts_that_go_backwards_are_a_protocol_anomaly(kind: str) -> None:
    with hostile("backwards") as server:
        r = run(record_one(make(kind, server.url, Timeouts(stall=5.0, total=20.0))))
    assert r.ok and r.protocol_anomaly == "count_backwards", r


@pytest.mark.parametrize("kind", ["raw", "python", "aiohttp"])
def test_events_after_the_end_are_a_protocol_anomaly_and_never_counted(kind: str) -> None:
    with hostile("after_done") as server:
        r = run(record_one(make(kind, server.url, Timeouts(stall=5.0, total=20.0))))
    assert r.ok and r.protocol_anomaly == "event_after_end", r
    assert r.output_tokens == 4 and sum(r.chunk_tokens) == 4  # the 4 events after [DONE] are not


def test_protocol_anomalies_are_counted_and_kept_out_like_record_anomalies() -> None:
    import pyarrow as pa

    from bench_llm.analysis.invariants import anomaly_counts, check_records

    table = pa.table({"ok": [True, True, True, False], "protocol_anomaly": [None, "count_backwards", "event_after_end",
                                                                           "event_after_end"]})  # fmt: skip
    checks = check_records(table)
    assert list(checks.anomaly != 0) == [False, True, True, False]  # a failed record is a failure, not an anomaly
    assert anomaly_counts(checks.anomaly) == {"count_backwards": 1, "event_after_end": 1}


def test_a_run_folder_with_a_protocol_anomaly_shows_it_in_its_summary(tmp_path: Path) -> None:
    """Through the summary's own column reads (analysis.summary reads the per-request columns
    it names; the anomaly column must be among them)."""
    from dataclasses import replace

    from bench_llm.analysis.summary import summarize_run
    from tests.helpers_records import record, write_run

    good = [record(f"r{i}", 10.0 * i, [(10.0 * i + 5, 1), (10.0 * i + 6, 1)]) for i in range(3)]
    bad = replace(record("bad", 40.0, [(45.0, 1), (46.0, 1)]), protocol_anomaly="event_after_end")
    s = summarize_run(write_run(tmp_path / "run", [*good, bad]))
    assert s.requests.anomalies == 1 and s.requests.anomaly_kinds == {"event_after_end": 1}
    assert s.requests.ok == 3


def test_the_stall_clock_runs_from_the_response_head() -> None:
    """Comments are not progress; the head is (issue 33: a stream of only SSE comments fails at
    the stall timeout counted from its head). Stamps given, no clock read."""
    from bench_llm.adapters.openai import OpenAIAdapter
    from bench_llm.loadgen.recorder import RequestRecorder
    from bench_llm.workloads.spec import RequestSpec

    spec = RequestSpec(request_id="r0", input_tokens=4, max_output_tokens=4, prompt="hi")
    rec = RequestRecorder(spec, OpenAIAdapter(model="m").parser(), 0, 0)
    rec.sent(100)
    assert rec.progress_ns() == 100
    rec.headers(500, 200, "text/event-stream")
    rec.data(600, b": keep-alive\n\n")
    rec.data(700, b": keep-alive\n\n")
    assert rec.progress_ns() == 500
    rec.data(800, b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n')
    assert rec.progress_ns() == 800
