"""The simulated engine's request spans, exported over OTLP/HTTP (``bench sim serve --otlp-traces-endpoint``).

The sim knows each request's queue, prefill and first-token times exactly, so it can export
them as the engines do, in their own naming, for bench's receiver to join to the client's
records by request id:

* vLLM flavour: one ``llm_request`` span per request, ``gen_ai.request.id`` = the response id
  plus vLLM's per-choice suffix ``-0``, and vLLM's ``gen_ai.latency.*`` attributes (seconds):
  ``time_in_queue``, ``time_in_model_prefill``, ``time_to_first_token`` (arrival at the HTTP
  server to the first token leaving it), ``e2e``.
* SGLang flavour: the request's root span (``Req <rid[:8]>``) with attribute ``rid`` (the
  ``meta_info.id`` the client sees); from the 0.5.10 generation also ``gen_ai.request.id`` and
  SGLang's ``gen_ai.latency.*`` attributes, whose ``time_in_model_prefill`` includes the queue
  (``sglang_root_span``). Its queue/prefill slices are child spans, which carry no request id.
* TGI flavour: nothing (TGI exports over gRPC only, and its spans carry no request id).

The encoder is written here from opentelemetry-proto's ``trace.proto``/``common.proto``
field numbers; it shares nothing with bench's decoder (loadgen/otlp.py), so a bug in one
cannot hide the same bug in the other. A daemon thread posts the spans gathered every
``interval_s`` (vLLM's BatchSpanProcessor with OTEL_BSP_SCHEDULE_DELAY=500); a failed
post is counted, never retried, and never slows the engine loop.
"""

from __future__ import annotations

import http.client
import os
import struct
import threading
import time
import urllib.parse
from dataclasses import dataclass

AttrValue = str | float | int | bool


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _key(number, 2) + _varint(len(payload)) + payload


def _any_value(v: AttrValue) -> bytes:
    if isinstance(v, bool):
        return _key(2, 0) + _varint(int(v))
    if isinstance(v, int):
        return _key(3, 0) + _varint(v & 0xFFFFFFFFFFFFFFFF)
    if isinstance(v, float):
        return _key(4, 1) + struct.pack("<d", v)
    return _bytes_field(1, str(v).encode())


def _key_value(k: str, v: AttrValue) -> bytes:
    return _bytes_field(1, k.encode()) + _bytes_field(2, _any_value(v))


@dataclass(frozen=True)
class SimSpan:
    name: str
    start_unix_ns: int
    end_unix_ns: int
    attributes: tuple[tuple[str, AttrValue], ...]


def encode_span(s: SimSpan, trace_id: bytes, span_id: bytes) -> bytes:
    """Span{trace_id(1), span_id(2), name(5), kind(6)=SERVER, start(7), end(8), attributes(9)}."""
    body = _bytes_field(1, trace_id) + _bytes_field(2, span_id) + _bytes_field(5, s.name.encode())
    body += _key(6, 0) + _varint(2) + _key(7, 1) + struct.pack("<Q", s.start_unix_ns)
    body += _key(8, 1) + struct.pack("<Q", s.end_unix_ns)
    for k, v in s.attributes:
        body += _bytes_field(9, _key_value(k, v))
    return body


def encode_export(spans: list[SimSpan], service: str) -> bytes:
    """ExportTraceServiceRequest{resource_spans(1){resource(1){attributes}, scope_spans(2){scope(1), spans(2)}}}."""
    resource = _bytes_field(1, _key_value("service.name", service))
    scope = _bytes_field(1, _bytes_field(1, b"bench.sim"))
    encoded = b"".join(_bytes_field(2, encode_span(s, os.urandom(16), os.urandom(8))) for s in spans)
    return _bytes_field(1, resource + _bytes_field(2, scope + encoded))


def request_span(flavor: str, rid: str, arrival_unix_ns: int, end_unix_ns: int, queue_s: float | None,
                 prefill_s: float | None, ttft_s: float | None) -> SimSpan | None:  # fmt: skip
    """One finished request's span in the flavour's naming (None: the flavour exports none)."""
    if flavor == "vllm":
        attrs: list[tuple[str, AttrValue]] = [("gen_ai.request.id", f"{rid}-0")]
        for key, v in (("time_in_queue", queue_s), ("time_in_model_prefill", prefill_s), ("time_to_first_token", ttft_s)):
            if v is not None:
                attrs.append((f"gen_ai.latency.{key}", float(v)))
        attrs.append(("gen_ai.latency.e2e", (end_unix_ns - arrival_unix_ns) / 1e9))
        return SimSpan("llm_request", arrival_unix_ns, end_unix_ns, tuple(attrs))
    if flavor == "sglang":
        return sglang_root_span(rid, "0.5.8", arrival_unix_ns, arrival_unix_ns, None, end_unix_ns)
    return None


def sglang_root_span(rid: str, generation: str, arrival_unix_ns: int, dispatched_unix_ns: int,
                     first_unix_ns: int | None, end_unix_ns: int) -> SimSpan:  # fmt: skip
    """SGLang's request root span (``" Req <rid[:8]>"``, observability/trace.py). Up to 0.5.9 it
    names the request only (``rid``). From 0.5.10 the tokenizer manager sets, when the request
    ends, ``gen_ai.request.id`` and ``gen_ai.latency.*`` (req_time_stats.py
    ``convert_to_gen_ai_span_attrs``): ``time_to_first_token`` from arrival, ``e2e``,
    ``time_in_model_decode`` from the first token, ``time_in_model_inference`` and
    ``time_in_model_prefill`` from the end of the dispatch to the scheduler (the scheduler
    queue included; no attribute times the queue)."""
    attrs: list[tuple[str, AttrValue]] = [("rid", rid)]
    if generation != "0.5.8":
        attrs += [("module", "sglang::tokenizer_manager"), ("gen_ai.request.id", rid)]
        if first_unix_ns is not None:
            attrs.append(("gen_ai.latency.time_to_first_token", (first_unix_ns - arrival_unix_ns) / 1e9))
        attrs.append(("gen_ai.latency.e2e", (end_unix_ns - arrival_unix_ns) / 1e9))
        if first_unix_ns is not None:
            attrs.append(("gen_ai.latency.time_in_model_decode", (end_unix_ns - first_unix_ns) / 1e9))
        attrs.append(("gen_ai.latency.time_in_model_inference", (end_unix_ns - dispatched_unix_ns) / 1e9))
        if first_unix_ns is not None:
            attrs.append(("gen_ai.latency.time_in_model_prefill", (first_unix_ns - dispatched_unix_ns) / 1e9))
    return SimSpan(f" Req {rid[:8]}", arrival_unix_ns, end_unix_ns, tuple(attrs))


class SpanExporter:
    """Gathers spans and posts them to ``endpoint`` (``http://host:port/v1/traces``) from a thread."""

    def __init__(self, endpoint: str, service: str, interval_s: float = 0.5) -> None:
        url = urllib.parse.urlsplit(endpoint)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"otlp_traces_endpoint {endpoint!r}: expected http://HOST:PORT/v1/traces (OTLP/HTTP)")
        self.host, self.port, self.path = url.hostname, url.port or 80, url.path or "/v1/traces"
        self.service, self.interval_s = service, interval_s
        self._pending: list[SimSpan] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.exported = 0
        self.failed_posts = 0
        #: perf_counter_ns -> unix ns (spans carry wall-clock times)
        self.offset_ns = time.time_ns() - time.perf_counter_ns()

    def add(self, span: SimSpan) -> None:
        with self._lock:
            self._pending.append(span)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sim-otlp", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Post what is pending, then stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            spans, self._pending = self._pending, []
        for i in range(0, len(spans), 512):
            batch = spans[i : i + 512]
            if self._post(encode_export(batch, self.service)):
                self.exported += len(batch)
            else:
                self.failed_posts += 1

    def _post(self, body: bytes) -> bool:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
        try:
            conn.request("POST", self.path, body, {"Content-Type": "application/x-protobuf"})
            return 200 <= conn.getresponse().status < 300
        except OSError:
            return False
        finally:
            conn.close()
