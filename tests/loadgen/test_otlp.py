"""bench's OTLP/HTTP trace receiver (loadgen/otlp.py): protobuf payloads built by hand here,
field by field from opentelemetry-proto's trace.proto / common.proto, posted over 127.0.0.1."""

from __future__ import annotations

import gzip
import json
import struct
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bench_llm.loadgen.otlp import OtlpReceiver, WireError, decode_traces
from bench_llm.results.reader import read_server_spans


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _fixed64(number: int, value: int) -> bytes:
    return _varint(number << 3 | 1) + struct.pack("<Q", value)


def _attr(key: str, value: str | float | int | bool) -> bytes:
    if isinstance(value, bool):
        any_value = _varint(2 << 3 | 0) + _varint(int(value))
    elif isinstance(value, str):
        any_value = _len(1, value.encode())
    elif isinstance(value, int):
        any_value = _varint(3 << 3 | 0) + _varint(value & (1 << 64) - 1)
    else:
        any_value = _varint(4 << 3 | 1) + struct.pack("<d", value)
    return _len(1, key.encode()) + _len(2, any_value)


def _span(name: str, attrs: dict[str, str | float | int | bool], start: int = 1_000, end: int = 2_000) -> bytes:
    body = _len(1, b"\x01" * 16) + _len(2, b"\x02" * 8) + _len(5, name.encode()) + _varint(6 << 3) + _varint(2)
    body += _fixed64(7, start) + _fixed64(8, end)
    for k, v in attrs.items():
        body += _len(9, _attr(k, v))
    return body


def _export(*spans: bytes) -> bytes:
    """ExportTraceServiceRequest{resource_spans{resource{attributes}, scope_spans{scope, spans}}}."""
    resource = _len(1, _attr("service.name", "vllm"))
    scope = _len(1, _len(1, b"vllm.llm_engine"))
    scope_spans = scope + b"".join(_len(2, s) for s in spans)
    return _len(1, resource + _len(2, scope_spans))


def _vllm_span(rid: str, queue: float, prefill: float, ttft: float) -> bytes:
    return _span("llm_request", {"gen_ai.request.id": rid, "gen_ai.latency.time_in_queue": queue,
                                 "gen_ai.latency.time_in_model_prefill": prefill, "gen_ai.latency.time_to_first_token": ttft,
                                 "gen_ai.latency.e2e": 0.5, "gen_ai.usage.prompt_tokens": 12, "gen_ai.request.n": 1,
                                 "gen_ai.request.stream": True})  # fmt: skip


def _post(url: str, body: bytes, ctype: str = "application/x-protobuf", encoding: str | None = None) -> int:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": ctype})
    if encoding:
        req.add_header("Content-Encoding", encoding)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_decoder_reads_the_fields_it_needs_and_skips_the_rest() -> None:
    spans = decode_traces(_export(_vllm_span("cmpl-a-0", 0.010, 0.020, 0.035), _span("other", {"x": -3})))
    assert [s.name for s in spans] == ["llm_request", "other"]
    a = spans[0].attributes
    assert a["gen_ai.request.id"] == "cmpl-a-0" and a["gen_ai.latency.time_in_queue"] == pytest.approx(0.010)
    assert a["gen_ai.usage.prompt_tokens"] == 12 and a["gen_ai.request.stream"] is True
    assert spans[0].start_unix_ns == 1_000 and spans[0].end_unix_ns == 2_000
    assert spans[1].attributes["x"] == -3  # int64 two's complement
    with pytest.raises(WireError):
        decode_traces(_export(_vllm_span("r", 0.1, 0.1, 0.1))[:-3])


def test_receiver_keeps_request_spans_and_writes_them_to_the_run(tmp_path: Path) -> None:
    with OtlpReceiver() as rec:
        assert rec.endpoint.startswith("http://127.0.0.1:") and rec.endpoint.endswith("/v1/traces")
        assert _post(rec.endpoint, _export(_vllm_span("cmpl-a-0", 0.010, 0.020, 0.035), _span("no id", {}))) == 200
        assert _post(rec.endpoint, gzip.compress(_export(_vllm_span("cmpl-b-0", 0.0, 0.030, 0.031))), encoding="gzip") == 200
        assert _post(rec.endpoint, b"\x0a\xff", ) == 400  # truncated
        assert _post(rec.endpoint, b"{}", ctype="application/json") == 415
        assert _post(rec.endpoint.replace("/v1/traces", "/v1/metrics"), b"") == 404
        assert rec.wait_for(2, timeout_s=5.0, quiet_s=0.1)
        d = rec.describe()
        assert d["payloads"] == 2 and d["spans"] == 3 and d["request_spans"] == 2 and sum(d["errors"].values()) == 2
        assert rec.write(tmp_path) is not None
    spans = read_server_spans(tmp_path)
    assert spans is not None and spans.column("span_request_id").to_pylist() == ["cmpl-a-0", "cmpl-b-0"]
    assert spans.column("queue_s").to_pylist() == pytest.approx([0.010, 0.0])
    assert spans.column("ttft_s").to_pylist() == pytest.approx([0.035, 0.031])
    assert spans.column("decode_s").to_pylist() == [None, None]  # not in these spans: null, not 0
    assert json.loads(spans.column("attributes_json")[0].as_py())["gen_ai.usage.prompt_tokens"] == 12


def test_no_request_span_writes_nothing(tmp_path: Path) -> None:
    with OtlpReceiver() as rec:
        assert not rec.wait_for(1, timeout_s=0.2)
        assert rec.write(tmp_path) is None
    assert read_server_spans(tmp_path) is None
