"""The simulated engine's span export (sim/otlp.py), read back by bench's own decoder."""

from __future__ import annotations

import pytest

from bench_llm.loadgen.otlp import decode_traces, request_id
from bench_llm.sim.otlp import SimSpan, encode_export, request_span


def test_each_flavour_names_its_request_as_its_engine_does() -> None:
    vllm = request_span("vllm", "cmpl-7", 1_000, 9_000_001_000, 0.004, 0.012, 0.020)
    sglang = request_span("sglang", "0123456789abcdef", 1_000, 2_000, 0.004, 0.012, 0.020)
    assert request_span("tgi", "x", 1, 2, 0.0, 0.0, 0.0) is None  # TGI's spans name no request
    assert vllm is not None and sglang is not None
    spans = decode_traces(encode_export([vllm, sglang], "bench-sim"))
    assert [s.name for s in spans] == ["llm_request", " Req 01234567"]  # SGLang's unified role is "": f"{role} Req ..."
    a = spans[0].attributes
    assert request_id(spans[0]) == "cmpl-7-0" and a["gen_ai.latency.time_in_queue"] == pytest.approx(0.004)
    assert a["gen_ai.latency.time_in_model_prefill"] == pytest.approx(0.012)
    assert a["gen_ai.latency.time_to_first_token"] == pytest.approx(0.020) and a["gen_ai.latency.e2e"] == pytest.approx(9.0)
    assert spans[0].start_unix_ns == 1_000 and spans[0].end_unix_ns == 9_000_001_000
    assert request_id(spans[1]) == "0123456789abcdef" and set(spans[1].attributes) == {"rid"}


def test_sglang_root_span_from_0_5_10_carries_its_latencies_with_the_queue_inside_prefill() -> None:
    from bench_llm.sim.otlp import sglang_root_span

    ms = 1_000_000
    span = sglang_root_span("0123456789abcdef", "0.5.23", 0, 8 * ms, 80 * ms, 300 * ms)
    (got,) = decode_traces(encode_export([span], "sglang"))
    a = got.attributes
    assert request_id(got) == "0123456789abcdef" == a["gen_ai.request.id"] and a["module"] == "sglang::tokenizer_manager"
    assert a["gen_ai.latency.time_to_first_token"] == pytest.approx(0.080)
    assert a["gen_ai.latency.time_in_model_prefill"] == pytest.approx(0.072)  # from the dispatch's end: queue inside
    assert a["gen_ai.latency.e2e"] == pytest.approx(0.3) and a["gen_ai.latency.time_in_model_decode"] == pytest.approx(0.22)
    assert "gen_ai.latency.time_in_queue" not in a  # SGLang has no queue attribute
    old = sglang_root_span("0123456789abcdef", "0.5.8", 0, 8 * ms, 80 * ms, 300 * ms)
    assert dict(old.attributes) == {"rid": "0123456789abcdef"}


def test_the_encoder_writes_every_attribute_type_the_decoder_reads() -> None:
    span = SimSpan("s", 5, 6, (("b", True), ("i", -3), ("f", 0.5), ("s", "x")))
    (got,) = decode_traces(encode_export([span], "svc"))
    assert got.attributes == {"b": True, "i": -3, "f": 0.5, "s": "x"}
