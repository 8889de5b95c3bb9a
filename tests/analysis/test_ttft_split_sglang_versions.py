"""The TTFT split of SGLang 0.5.8, 0.5.10 and 0.5.23 requests, from payloads shaped as each
release sends them (analysis/ttft_rules.py; docs/engines.md "Per-request timings").

Each payload is the last ``/generate`` stream event of one request, its ``meta_info`` keys in
the order and with the meanings of that release's source (0.5.8 managers/tokenizer_manager.py
``_add_metric_if_present``; 0.5.10 and 0.5.23 observability/req_time_stats.py
``convert_to_output_meta_info``), and for 0.5.23 its request root span as tokenizer_manager
sets it (``gen_ai.request.id`` and ``gen_ai.latency.*``, where ``time_in_model_prefill`` runs
from the dispatch to the scheduler to the first token: the queue included). Every request
here is the same one: the client saw its first token 100 ms after sending it; it waited 20 ms
in the scheduler's queue and was prefilled in 45 ms (0.5.8/0.5.10 count 43 ms: the delay to
the batch's launch and the launch, host side); the engine's own TTFT was 80 ms.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from bench_llm.adapters.sglang import SGLangStreamParser
from bench_llm.analysis.ttft_rules import RULE_0510, RULE_058, RULE_STAMPS, RunEngine, choose_rule, run_engine
from bench_llm.analysis.ttft_split import format_split, request_parts
from bench_llm.loadgen.otlp import OtlpReceiver, decode_traces
from bench_llm.sim.otlp import SimSpan, encode_export

T0 = 1765000000.0  # a wall clock, seconds (the stamps SGLang sends from 0.5.10 on)
FINISH = {"type": "length", "length": 4}

LAST_EVENT = {
    "0.5.8": {"text": "abcd", "output_ids": [11, 12, 13, 14], "meta_info": {
        "id": "a58", "finish_reason": FINISH, "prompt_tokens": 512, "weight_version": "default",
        "total_retractions": 0, "queue_time": 0.020, "prefill_launch_delay": 0.003, "prefill_launch_latency": 0.040,
        "prefill_finished_ts": T0 + 0.065, "completion_tokens": 4, "cached_tokens": 0, "e2e_latency": 0.3,
        "request_received_ts": T0, "request_sent_to_scheduler_ts": T0 + 0.004, "response_sent_to_client_ts": T0 + 0.3,
        "decode_finished_ts": T0 + 0.3, "inference_time": 0.28, "decode_throughput": 14.0}},
    "0.5.10": {"text": "abcd", "output_ids": [11, 12, 13, 14], "meta_info": {
        "id": "a510", "finish_reason": FINISH, "prompt_tokens": 512, "weight_version": "default",
        "total_retractions": 0, "forward_entry_time": T0 + 0.030, "prefill_finished_time": T0 + 0.075,
        "queue_time": 0.020, "prefill_waiting_latency": 0.003, "prefill_launch_latency": 0.040,
        "reasoning_tokens": 0, "completion_tokens": 4, "cached_tokens": 0, "e2e_latency": 0.3,
        "request_received_ts": T0, "api_server_dispatch_finish_ts": T0 + 0.008, "response_sent_to_client_ts": T0 + 0.3,
        "request_finished_ts": T0 + 0.3, "inference_time": 0.29, "decode_throughput": 14.0}},
    "0.5.23": {"text": "abcd", "output_ids": [11, 12, 13, 14], "meta_info": {
        "id": "a523", "finish_reason": FINISH, "prompt_tokens": 512, "weight_version": "default",
        "total_retractions": 0, "forward_entry_time": T0 + 0.030, "prefill_finished_time": T0 + 0.075,
        "queue_time": 0.020, "reasoning_tokens": 0, "completion_tokens": 4, "cached_tokens": 0, "e2e_latency": 0.3,
        "request_received_ts": T0, "first_token_latency": 0.080, "api_server_dispatch_finish_ts": T0 + 0.008,
        "response_sent_to_client_ts": T0 + 0.3, "request_finished_ts": T0 + 0.3, "decode_throughput": 10.0}},
}  # fmt: skip


def _timing(version: str) -> tuple[str, str]:
    """(the engine's request id, the timings bench records) from the release's stream."""
    event = LAST_EVENT[version]
    p = SGLangStreamParser()
    first = {"text": "a", "output_ids": [11], "meta_info": {**event["meta_info"], "finish_reason": None,  # type: ignore[dict-item]
                                                          "completion_tokens": 1}}  # fmt: skip
    assert p.parse(orjson.dumps(first)) is not None
    last = p.parse(orjson.dumps(event))
    assert last is not None and last.finish_reason == "length" and last.server_timing
    return str(last.server_request_id), json.dumps(last.server_timing)


def _table(version: str, with_timings: bool = True) -> pa.Table:
    rid, timing = _timing(version)
    return pa.table({"phase": ["measure"], "ok": [True], "send_ns": [0], "first_token_ns": [100_000_000],
                     "server_request_id": [rid], "server_timing_json": [timing if with_timings else None]})  # fmt: skip


def _root_span_0523(rid: str) -> pa.Table:
    """SGLang 0.5.23's request root span as exported (encoded to OTLP, decoded by bench's receiver):
    TTFT 80 ms from arrival; 'prefill' 72 ms from the dispatch's end (8 ms) to the first token."""
    start = int(T0 * 1e9)
    span = SimSpan(f" Req {rid[:8]}", start, start + 300_000_000, (
        ("rid", rid), ("module", "sglang::tokenizer_manager"), ("gen_ai.usage.completion_tokens", 4),
        ("gen_ai.usage.prompt_tokens", 512), ("gen_ai.request.id", rid), ("gen_ai.request.max_tokens", 4),
        ("gen_ai.latency.time_to_first_token", 0.080), ("gen_ai.latency.e2e", 0.3),
        ("gen_ai.latency.time_in_model_decode", 0.22), ("gen_ai.latency.time_in_model_inference", 0.292),
        ("gen_ai.latency.time_in_model_prefill", 0.072)))  # fmt: skip
    receiver = OtlpReceiver()
    try:
        receiver.add(decode_traces(encode_export([span], "sglang")))
        return receiver.table()
    finally:
        receiver.stop()


def _row(version: str, engine: RunEngine | None, spans: pa.Table | None = None, with_timings: bool = True,
         stated: list[str] | None = None) -> dict[str, float]:  # fmt: skip
    parts = request_parts(_table(version, with_timings), spans, engine, stated)
    assert len(parts) == 1
    return parts.iloc[0].to_dict()  # type: ignore[no-any-return]


def _nan(x: float) -> bool:
    return x != x


@pytest.mark.parametrize("version, rule", [("0.5.8", RULE_058), ("0.5.10", RULE_0510), ("0.5.23", RULE_STAMPS)])
def test_each_release_is_read_by_its_own_rule(version: str, rule: str) -> None:
    stated: list[str] = []
    row = _row(version, RunEngine("sglang", version), stated=stated)
    assert row["source"] == "response" and row["queue_ms"] == pytest.approx(20)
    if version == "0.5.23":
        # prefill = prefill_finished_time - forward_entry_time; the engine's TTFT (first_token_latency)
        # puts emission (tokenizer, dispatch, first token back: 80 - 65) and transit (100 - 80) apart
        assert row["prefill_ms"] == pytest.approx(45, abs=1e-3)
        assert row["emission_ms"] == pytest.approx(15, abs=1e-3) and row["transit_ms"] == pytest.approx(20)
        assert _nan(row["other_ms"])
    else:  # the delay to the batch's launch (named prefill_waiting_latency from 0.5.10) and the launch
        assert row["prefill_ms"] == pytest.approx(43) and row["other_ms"] == pytest.approx(37)
    assert len(stated) == 1 and f"version {version}" in stated[0]
    chosen, _ = choose_rule(RunEngine("sglang", version), {"queue_time"})  # keys common to all: the version decides
    assert chosen is not None and chosen.name == rule


@pytest.mark.parametrize("version", ["0.5.8", "0.5.10", "0.5.23"])
def test_without_a_recorded_version_the_keys_choose_the_same_rule_and_say_so(version: str) -> None:
    stated: list[str] = []
    known = _row(version, RunEngine("sglang", version))
    guessed = _row(version, None, stated=stated)
    assert {k: v for k, v in guessed.items() if not _nan(v)} == pytest.approx({k: v for k, v in known.items() if not _nan(v)})
    assert "chosen by the keys" in stated[0]


def test_a_version_whose_keys_are_absent_is_said_so_and_the_payload_read_by_its_keys() -> None:
    stated: list[str] = []
    row = _row("0.5.10", RunEngine("sglang", "0.5.23"), stated=stated)  # a version the payload does not match
    assert row["prefill_ms"] == pytest.approx(43) and "0.5.23 reported" in stated[0] and "read by the keys" in stated[0]


def test_sglang_span_prefill_includes_the_queue_so_queue_and_prefill_come_from_the_response() -> None:
    stated: list[str] = []
    row = _row("0.5.23", RunEngine("sglang", "0.5.23"), _root_span_0523("a523"), stated=stated)
    # not queue NaN + prefill 72 (queue inside) + emission 8 as a vLLM span's meaning would give
    assert row["source"] == "span+response"
    assert row["queue_ms"] == pytest.approx(20) and row["prefill_ms"] == pytest.approx(45, abs=1e-3)
    assert row["emission_ms"] == pytest.approx(15, abs=1e-3) and row["transit_ms"] == pytest.approx(20)
    assert _nan(row["queue_prefill_ms"]) and _nan(row["other_ms"])
    assert any("includes the scheduler queue" in s and "queue and prefill from the responses" in s for s in stated)


def test_sglang_span_alone_labels_its_prefill_as_queue_plus_prefill() -> None:
    stated: list[str] = []
    row = _row("0.5.23", RunEngine("sglang", "0.5.23"), _root_span_0523("a523"), with_timings=False, stated=stated)
    assert row["source"] == "span" and _nan(row["queue_ms"]) and _nan(row["prefill_ms"])
    assert row["queue_prefill_ms"] == pytest.approx(72) and row["emission_ms"] == pytest.approx(8)
    assert row["transit_ms"] == pytest.approx(20) and any("labelled queue + prefill" in s for s in stated)


def test_the_split_states_its_rule() -> None:
    split = {"source": "per request, as the engine reported it", "rule": "SGLang 0.5.12+ meta_info: ...", "requests": 1,
             "ttft_ms": {"mean": 100.0}, "parts_ms": {"queue_prefill": {"mean": 72.0}}}  # fmt: skip
    lines = format_split(split)
    assert "read as: SGLang 0.5.12+" in lines[1] and "queue + prefill" in lines[2]


def test_run_engine_reads_the_recorded_version() -> None:
    meta = {"engine": "sglang", "adapter": {"adapter": "sglang", "engine_version": None},
            "config": {"engine_launch": {"version": "0.5.23"}}}  # fmt: skip
    assert run_engine(meta) == RunEngine("sglang", "0.5.23")
    assert run_engine({"engine": "sim", "adapter": {"adapter": "vllm"}, "config": {}}).sglang is False


def test_live_simulated_0_5_23_spans_split_with_the_responses_queue_and_prefill(tmp_path: Path) -> None:
    import signal
    import subprocess

    from bench_llm.analysis.ttft_split import SOURCE_SPANS, split_summary
    from bench_llm.launch.process import free_port
    from tests.bench.test_cli_run import _wait_for_port
    from tests.conftest import REPO, bench_argv

    port, otlp, out = free_port(), free_port(), tmp_path / "run"
    server = subprocess.Popen(
        bench_argv("sim", "serve", "--port", str(port), "--flavor", "sglang", "--timing", "model", "--model-preset",
                   "llama-3.1-8b", "--otlp-traces-endpoint", f"http://127.0.0.1:{otlp}/v1/traces"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for_port(port)
        p = subprocess.run(
            bench_argv("run", "--url", f"http://127.0.0.1:{port}", "--engine", "sglang", "--model", "llama-3.1-8b",
                       "--requests", "10", "--concurrency", "4", "--input-tokens", "512", "--output-tokens", "4",
                       "--otlp-receiver", "--otlp-port", str(otlp), "--out", str(out), "--no-progress"),
            capture_output=True, text=True, timeout=180, cwd=REPO,
        )  # fmt: skip
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert p.returncode == 0, p.stderr[-3000:]
    split = split_summary(out)
    assert split is not None and split["source"] == SOURCE_SPANS and split["requests"] == 10
    assert "includes the scheduler queue" in split["rule"] and "reported version 0.5.23" in split["rule"]
    parts = split["parts_ms"]
    assert {"queue", "prefill", "emission", "transit"} <= set(parts) and "queue_prefill" not in parts
    assert parts["prefill"]["mean"] > 0 and split["max_sum_error_ms"] < 1.0
