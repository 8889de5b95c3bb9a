"""Record invariants: stamped so they hold, and a record that breaks them is a named anomaly
kept out of every metric (docs/metrics.md, Record invariants)."""

from __future__ import annotations

import asyncio
import socket
import time
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.analysis.bootstrap import make_side, point_estimates
from bench_llm.analysis.format import format_summary
from bench_llm.analysis.invariants import ANOMALIES, anomaly_name, check_records
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.summary import SummaryOptions, summarize
from bench_llm.loadgen import rawhttp
from bench_llm.loadgen.rawhttp import RawHttpTransport
from bench_llm.loadgen.transport import Timeouts
from bench_llm.results.record import RequestRecord
from bench_llm.results.schema import REQUESTS_SCHEMA
from bench_llm.sim.server import ServerConfig, create_app, serve_in_process
from bench_llm.sim.timing import FixedTiming
from bench_llm.workloads.spec import RequestSpec
from tests.helpers_records import MS, record


def _table(records: list[RequestRecord]) -> pa.Table:
    rows = [{name: getattr(r, name, None) for name in REQUESTS_SCHEMA.names} for r in records]
    for row in rows:
        row["run_id"] = "r"
    return pa.Table.from_pylist(rows, schema=REQUESTS_SCHEMA)


def _good(rid: str, t: float) -> RequestRecord:
    return record(rid, t, [(t + 10, 1), (t + 12, 1), (t + 14, 1)])


def _broken() -> dict[str, RequestRecord]:
    """One record per rule, each breaking only that rule."""
    g = _good("x", 0.0)
    return {
        "sent_before_intended": replace(g, request_id="a", intended_send_ns=g.send_ns + 5),
        "first_byte_before_send": replace(g, request_id="b", first_byte_ns=g.send_ns - 1),
        # the kernel-clock fault of issue 16: first token stamped before the send
        "token_before_first_byte": replace(g, request_id="c", send_ns=11 * MS, first_byte_ns=11 * MS, intended_send_ns=11 * MS),
        "content_before_token": replace(g, request_id="d", first_content_ns=g.first_token_ns - 1),
        "end_before_last_chunk": replace(g, request_id="e", end_ns=13 * MS),
        "negative_gap": replace(g, request_id="f", chunk_ns=[10 * MS, 14 * MS, 12 * MS]),
        # the stream broke its protocol (issue 33; the recorder names it)
        "count_backwards": replace(g, request_id="h", protocol_anomaly="count_backwards"),
        "event_after_end": replace(g, request_id="i", protocol_anomaly="event_after_end"),
    }


def test_each_rule_is_named_and_good_or_failed_records_are_not() -> None:
    broken = _broken()
    assert tuple(broken) == ANOMALIES
    failed = replace(broken["negative_gap"], request_id="g", ok=False, error_type="http_error")
    checks = check_records(_table([_good("ok", 0.0), *broken.values(), failed]))
    names = [anomaly_name(int(c)) for c in checks.anomaly]
    assert names == [None, *ANOMALIES, None]


def test_an_anomalous_record_is_counted_printed_and_kept_out_of_every_metric() -> None:
    good = [_good(f"r{i}", 100.0 * i) for i in range(4)]
    bad = replace(_good("neg", 400.0), send_ns=int(411 * MS), first_byte_ns=int(411 * MS), intended_send_ns=int(411 * MS))
    slo = SLO.parse("ttft_ms=50")
    s = summarize(_table([*good, bad]), SummaryOptions(slo=slo))
    req = s.requests
    assert req.anomalies == 1 and req.anomaly_kinds == {"token_before_first_byte": 1}
    assert req.ok == 4 and s.latency["ttft_ms"]["n"] == 4
    assert s.latency["ttft_ms"]["p50"] == pytest.approx(10.0)  # no negative TTFT pooled
    assert s.latency["itl_ms"]["n"] == 8  # 2 per good request, none of the anomaly's
    assert s.slo.judged == 4 and s.slo.attainment == 1.0
    assert s.window_s == pytest.approx(0.314)  # 0 .. 314 ms: the anomaly's own span is out
    text = format_summary(s)
    assert "ANOMALIES: 1 anomalous record (token_before_first_byte 1)" in text
    # the bootstrap (compare, gate, report) leaves it out the same way
    side = make_side([_table([*good, bad])], slo)
    assert side.anomalies == 1
    est = point_estimates(side, ["ttft_p50_ms", "slo_attainment", "requests_per_s"])
    assert est["ttft_p50_ms"] == pytest.approx(10.0) and est["slo_attainment"] == 1.0
    assert est["requests_per_s"] == pytest.approx(s.throughput.requests_per_s)


def test_responses_in_one_read_make_itl_and_tpot_not_measurable() -> None:
    # 3 of 4 responses arrive whole in one read (every token the same stamp): TPOT 0.00
    one = [record(f"o{i}", 100.0 * i, [(100.0 * i + 8, 1), (100.0 * i + 8, 1), (100.0 * i + 8, 1)]) for i in range(3)]
    s = summarize(_table([*one, _good("g", 400.0)]))
    assert s.timing.to_json() == {"one_read_responses": 3, "multi_token_responses": 4, "itl_measurable": False}
    text = format_summary(s)
    tpot = next(line for line in text.splitlines() if line.startswith("TPOT"))
    assert "not measurable: 3 of 4 responses arrived in one read" in tpot and "0.00" not in tpot
    assert not any(line.startswith("ITL") and "0.00" in line for line in text.splitlines())
    fine = summarize(_table([_good(f"g{i}", 100.0 * i) for i in range(4)]))
    assert fine.timing.itl_measurable and "not measurable" not in format_summary(fine)


class _StampedSocket(socket.socket):
    """Notes the clock at every ``send`` call, before the bytes are handed over."""

    calls: list[int] = []

    def send(self, data: bytes, *args: int) -> int:  # type: ignore[override]
        type(self).calls.append(time.perf_counter_ns())
        return super().send(data, *args)


@pytest.mark.parametrize("clock", ["user", "kernel"])
def test_the_send_is_stamped_before_the_request_is_written(clock: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stamped after the write returns, a pause of the client between the two put the
    kernel's stamp of the reply before the send: negative TTFTs (issue 16, item 2)."""
    proxy = types.SimpleNamespace(**vars(socket))
    proxy.socket = _StampedSocket
    monkeypatch.setattr(rawhttp, "socket", proxy)
    _StampedSocket.calls = []

    class Sink:
        def __init__(self) -> None:
            self.sent_ns: int | None = None

        def sent(self, ts: int) -> None:
            self.sent_ns = ts

        def headers(self, ts: int, status: int, content_type: str = "") -> None:
            pass

        def data(self, ts: int, data: bytes) -> None:
            pass

    async def main() -> list[tuple[int | None, int]]:
        async with serve_in_process(create_app(ServerConfig(timing=FixedTiming(0.001, 0.001)))) as url:
            t = RawHttpTransport(url, Timeouts(stall=5.0), clock=clock)  # type: ignore[arg-type]
            call = OpenAIAdapter(model="sim-model").build(RequestSpec("r", 4, 3, prompt="hi"))
            out = []
            first = Sink()
            await t.send(call, first)  # a new connection: the awaited path
            out.append((first.sent_ns, _StampedSocket.calls[-1]))
            second = Sink()
            ex = t.start(call, second)  # a kept-alive one: the synchronous path of a freed slot
            assert ex is not None
            out.append((second.sent_ns, _StampedSocket.calls[-1]))
            await t.complete(ex, call, second)
            await t.close()
            return out

    for sent_ns, write_ns in asyncio.run(main()):
        assert sent_ns is not None and sent_ns <= write_ns


def test_the_open_loop_never_sends_before_the_intended_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The event loop's timer may fire a little early; _sleep_until must not return early."""
    from bench_llm.loadgen import runner

    real_sleep = asyncio.sleep

    async def early_sleep(delay: float) -> None:  # a timer that fires 5 ms early
        await real_sleep(max(0.0, delay - 0.005))

    monkeypatch.setattr(runner.asyncio, "sleep", early_sleep)

    async def main() -> list[int]:
        late = []
        for _ in range(5):
            deadline = time.perf_counter_ns() + 20_000_000
            await runner._sleep_until(deadline)
            late.append(time.perf_counter_ns() - deadline)
        return late

    assert np.all(np.array(asyncio.run(main())) >= 0)


def test_compare_and_gate_name_the_anomalies_they_left_out(tmp_path: Path) -> None:
    from bench_llm.analysis.compare import compare_paths, format_comparison
    from bench_llm.analysis.gate import GateConfig, GateSettings, MetricGate, markdown_summary, run_gate, text_summary
    from tests.helpers_records import write_run

    good = [_good(f"r{i}", 100.0 * i) for i in range(6)]
    bad = replace(_good("neg", 600.0), send_ns=int(611 * MS), first_byte_ns=int(611 * MS), intended_send_ns=int(611 * MS))
    base = write_run(tmp_path / "base", good)
    cur = write_run(tmp_path / "cur", [*good, bad])
    cmp = compare_paths(base, cur, ["ttft_p50_ms"])
    g = cmp.groups[0]
    assert (g.baseline_anomalies, g.current_anomalies) == (0, 1)
    assert "WARNING: anomalous records excluded: baseline 0, current 1" in format_comparison(cmp)
    result = run_gate(base, cur, GateConfig(GateSettings(resamples=100), {"ttft_p50_ms": MetricGate(max_increase_pct=10)}))
    assert "anomalous records excluded: baseline 0, current 1" in text_summary(result)
    assert "anomalous records excluded" in markdown_summary(result)
