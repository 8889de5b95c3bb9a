"""The per-request TTFT split (analysis/ttft_split.py, docs/metrics.md "TTFT split")."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from bench_llm.adapters.sglang import SGLangStreamParser
from bench_llm.analysis.ttft_split import SOURCE_HISTOGRAM, SOURCE_REQUEST, request_parts, split_summary
from tests.analysis.test_report_fixtures import add_server_metrics, synthetic_run
from tests.bench.test_cli_run import _wait_for_port
from tests.conftest import REPO, bench_argv


def test_sglang_meta_info_timings_are_parsed() -> None:
    p = SGLangStreamParser()
    meta = {"id": "r1", "completion_tokens": 1, "finish_reason": None, "queue_time": 0.012,
            "prefill_launch_delay": 0.001, "prefill_launch_latency": 0.030}  # fmt: skip
    ev = p.parse(orjson.dumps({"text": "a", "meta_info": meta}))
    assert ev is not None and ev.server_timing == {"queue_time": 0.012, "prefill_launch_delay": 0.001, "prefill_launch_latency": 0.030}
    ev = p.parse(orjson.dumps({"text": "ab", "meta_info": {"id": "r1", "completion_tokens": 2}}))
    assert ev is not None and ev.server_timing is None  # without --enable-metrics: nothing invented


def test_parts_from_reported_timings_and_the_rest() -> None:
    timing = json.dumps({"queue_time": 0.010, "prefill_launch_delay": 0.002, "prefill_launch_latency": 0.028})
    table = pa.table({"phase": ["measure", "measure", "warmup"], "ok": [True, True, True],
                      "send_ns": [0, 0, 0], "first_token_ns": [50_000_000, 60_000_000, 1],
                      "server_timing_json": [timing, None, timing]})  # fmt: skip
    parts = request_parts(table)
    assert len(parts) == 1  # the request without timings and the warm-up are left out
    row = parts.iloc[0]
    assert row["queue_ms"] == pytest.approx(10) and row["prefill_ms"] == pytest.approx(30)
    assert row["other_ms"] == pytest.approx(10) and row["kv_transfer_ms"] != row["kv_transfer_ms"]  # NaN: not reported


def test_without_per_request_timings_the_histograms_are_labelled_as_interval_means(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "run", 100, 4)
    assert split_summary(run) is None
    add_server_metrics(run)
    split = split_summary(run)
    assert split is not None and split["source"] == SOURCE_HISTOGRAM
    assert split["parts_ms"]["queue"]["mean"] == pytest.approx(4.0) and "p50" not in split["parts_ms"]["queue"]


def test_simulated_sglang_split_sums_to_the_client_ttft(tmp_path: Path) -> None:
    from bench_llm.launch.process import free_port

    port, out = free_port(), tmp_path / "run"
    server = subprocess.Popen(
        bench_argv("sim", "serve", "--port", str(port), "--flavor", "sglang", "--timing", "model"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for_port(port)
        p = subprocess.run(
            bench_argv("run", "--url", f"http://127.0.0.1:{port}", "--engine", "sglang", "--model", "llama-3.1-8b",
                       "--requests", "40", "--concurrency", "8", "--input-tokens", "1024", "--output-tokens", "8",
                       "--out", str(out), "--no-progress"),
            capture_output=True, text=True, timeout=180, cwd=REPO,
        )  # fmt: skip
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert p.returncode == 0, p.stderr
    # the simulated SGLang speaks 0.5.23 by default: its first_token_latency puts emission and transit apart
    assert "TTFT split (per request" in p.stdout and "transit (HTTP, network, client)" in p.stdout
    assert "read as: SGLang 0.5.12+" in p.stdout and "reported version 0.5.23" in p.stdout  # asked at --url
    split = split_summary(out)
    assert split is not None and split["source"] == SOURCE_REQUEST and split["requests"] == 40
    assert split["max_sum_error_ms"] < 1.0
    from bench_llm.results.reader import read_requests

    parts = request_parts(read_requests(out))
    # The engine's share stays within what the client saw. Not always: the client stamps
    # send_ns after its send() returns, and a pause of its process there (this host is shared)
    # shortens the client's TTFT, which then shows as a negative `other` (docs/metrics.md).
    engine = parts["queue_ms"] + parts["prefill_ms"]
    assert (engine <= parts["ttft_ms"] + 1.0).mean() >= 0.9 and (parts["queue_ms"] >= 0).all()
    assert (parts["prefill_ms"] > 1.0).all() and (parts["kv_transfer_ms"].isna()).all()
    from bench_llm.analysis.report import build_report

    info = build_report(out, tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "ttft-split-requests" in page and "-ttft-split\"" not in page  # per request, not the histogram means
    assert info.figures >= 3


def _spans(rows: list[tuple[str, float | None, float | None, float | None]]) -> pa.Table:
    from bench_llm.results.schema import SERVER_SPANS_SCHEMA

    n = len(rows)
    return pa.table({"span_request_id": [r[0] for r in rows], "name": ["llm_request"] * n, "start_unix_ns": [1] * n,
                     "end_unix_ns": [2] * n, "queue_s": [r[1] for r in rows], "prefill_s": [r[2] for r in rows],
                     "decode_s": [None] * n, "inference_s": [None] * n, "ttft_s": [r[3] for r in rows],
                     "e2e_s": [None] * n, "attributes_json": ["{}"] * n}, schema=SERVER_SPANS_SCHEMA)  # fmt: skip


def test_engine_spans_join_by_request_id_and_split_into_queue_prefill_emission_transit() -> None:
    table = pa.table({"phase": ["measure"] * 4, "ok": [True] * 4, "send_ns": [0] * 4,
                      "first_token_ns": [50_000_000, 60_000_000, 70_000_000, 80_000_000],
                      "server_request_id": ["cmpl-a", "cmpl-b", "cmpl-c", None],
                      "server_timing_json": [None, None, None, None]})  # fmt: skip
    # vLLM names a request <response id>-<choice>; cmpl-c has no span, the last no id
    spans = _spans([("cmpl-a-0", 0.010, 0.025, 0.040), ("cmpl-b-0", 0.0, 0.030, None), ("cmpl-x-0", 1.0, 1.0, 2.0)])
    parts = request_parts(table, spans).set_index("ttft_ms")
    assert list(parts.index) == [50.0, 60.0] and (parts["source"] == "span").all()
    a = parts.loc[50.0]
    assert a["queue_ms"] == pytest.approx(10) and a["prefill_ms"] == pytest.approx(25)
    assert a["emission_ms"] == pytest.approx(5) and a["transit_ms"] == pytest.approx(10)
    assert a["other_ms"] != a["other_ms"]  # NaN: transit is the rest
    assert a[["queue_ms", "prefill_ms", "emission_ms", "transit_ms"]].sum() == pytest.approx(50)
    b = parts.loc[60.0]  # no engine TTFT in the span: no emission/transit, the rest is `other`
    assert b["emission_ms"] != b["emission_ms"] and b["other_ms"] == pytest.approx(30)


def test_split_summary_reads_the_runs_spans(tmp_path: Path) -> None:
    from bench_llm.results.reader import read_requests
    from bench_llm.results.schema import SERVER_SPANS_FILE
    from bench_llm.results.writer import write_table_atomic

    run = synthetic_run(tmp_path / "run", 40, 4)
    part = next((run / "requests").glob("*.parquet"))
    table = read_requests(run)
    ids = [f"cmpl-{r}" for r in table.column("request_id").to_pylist()]
    write_table_atomic(table.set_column(table.schema.get_field_index("server_request_id"), "server_request_id", pa.array(ids)), part)
    assert split_summary(run) is None
    write_table_atomic(_spans([(f"{rid}-0", 0.001, 0.002, 0.004) for rid in ids]), run / SERVER_SPANS_FILE)
    split = split_summary(run)
    assert split is not None and split["source"] == "per request, from the engine's OpenTelemetry spans"
    assert split["rule"].startswith("vLLM llm_request spans: queue = gen_ai.latency.time_in_queue")
    assert split["parts_ms"]["queue"]["mean"] == pytest.approx(1.0) and split["parts_ms"]["emission"]["mean"] == pytest.approx(1.0)
    assert "transit" in split["parts_ms"] and "other" not in split["parts_ms"] and split["max_sum_error_ms"] < 1e-6
