"""An OTLP/HTTP trace receiver: the engine's per-request spans, collected during a run.

vLLM (``--otlp-traces-endpoint``) exports one ``llm_request`` span per request, with its
own timings as attributes (``gen_ai.latency.time_in_queue``, ``..._time_in_model_prefill``,
``..._time_to_first_token``, ``..._e2e``, seconds) and ``gen_ai.request.id``, the engine's
request id (the response's ``id``, with a per-choice suffix). bench listens on 127.0.0.1 for
``POST /v1/traces`` (OTLP/HTTP, protobuf body, optionally gzip), keeps the spans that carry a
request id, and writes them to the run folder (``server_spans.parquet``,
``results.schema.SERVER_SPANS_SCHEMA``) when the run ends; analysis joins them to the client's
records by request id (analysis/ttft_split.py).

The protobuf is decoded here, for the few fields needed, by a minimal wire-format reader
(no protobuf or opentelemetry dependency): ExportTraceServiceRequest.resource_spans(1) →
ResourceSpans.scope_spans(2) → ScopeSpans.spans(2) → Span{name(5),
start_time_unix_nano(7), end_time_unix_nano(8), attributes(9)} → KeyValue{key(1),
value(2)} → AnyValue{string(1), bool(2), int(3), double(4)}. Field numbers are those of
opentelemetry-proto's ``trace.proto`` and ``common.proto`` (stable since OTLP 1.0).
"""

from __future__ import annotations

import gzip
import json
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench_llm.core.errors import BenchError
from bench_llm.results.schema import SERVER_SPANS_FILE, SERVER_SPANS_SCHEMA, SPAN_LATENCY_ATTRIBUTES
from bench_llm.results.writer import write_table_atomic

#: The span attribute that names the engine's request.
REQUEST_ID_ATTRIBUTE = "gen_ai.request.id"
#: Every engine's request-id attribute, in order: vLLM's ``llm_request`` span
#: (``gen_ai.request.id``), SGLang's request root span (``rid``, its ``meta_info.id``, and from
#: 0.5.10 ``gen_ai.request.id`` too; python/sglang/srt/observability/trace.py from 0.5.10,
#: tracing/trace.py before). TGI's spans carry none (docs/engines.md).
REQUEST_ID_ATTRIBUTES = (REQUEST_ID_ATTRIBUTE, "rid")
#: Largest request body accepted (a batch of 512 spans is ~200 kB).
MAX_BODY_BYTES = 32 << 20

AttrValue = str | bool | int | float | None


class WireError(BenchError, ValueError):
    """A malformed protobuf payload."""


# -- protobuf wire format ----------------------------------------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if pos >= len(buf):
            raise WireError("truncated varint")
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, pos
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 10 bytes")


def fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of one message: an int for varint and
    fixed-width fields (fixed ones as their little-endian unsigned bits), bytes for
    length-delimited ones. Groups (wire types 3/4, deprecated) are refused."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 1:
            if pos + 8 > end:
                raise WireError("truncated fixed64")
            yield number, wire, struct.unpack_from("<Q", buf, pos)[0]
            pos += 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            if pos + n > end:
                raise WireError("truncated length-delimited field")
            yield number, wire, buf[pos : pos + n]
            pos += n
        elif wire == 5:
            if pos + 4 > end:
                raise WireError("truncated fixed32")
            yield number, wire, struct.unpack_from("<I", buf, pos)[0]
            pos += 4
        else:
            raise WireError(f"unsupported wire type {wire}")


def _any_value(buf: bytes) -> AttrValue:
    for number, wire, v in fields(buf):
        if number == 1 and isinstance(v, bytes):
            return v.decode("utf-8", "replace")
        if number == 2 and wire == 0 and isinstance(v, int):
            return bool(v)
        if number == 3 and wire == 0 and isinstance(v, int):
            return v - (1 << 64) if v >= 1 << 63 else v  # int64 as two's complement
        if number == 4 and wire == 1 and isinstance(v, int):
            return float(struct.unpack("<d", struct.pack("<Q", v))[0])
    return None  # arrays, key-value lists, bytes: not needed here


@dataclass(frozen=True)
class Span:
    name: str
    start_unix_ns: int
    end_unix_ns: int
    attributes: dict[str, AttrValue]


def _span(buf: bytes) -> Span:
    name, start, end = "", 0, 0
    attrs: dict[str, AttrValue] = {}
    for number, _, v in fields(buf):
        if number == 5 and isinstance(v, bytes):
            name = v.decode("utf-8", "replace")
        elif number == 7 and isinstance(v, int):
            start = v
        elif number == 8 and isinstance(v, int):
            end = v
        elif number == 9 and isinstance(v, bytes):
            key, value = "", None
            for n, _, kv in fields(v):
                if n == 1 and isinstance(kv, bytes):
                    key = kv.decode("utf-8", "replace")
                elif n == 2 and isinstance(kv, bytes):
                    value = _any_value(kv)
            attrs[key] = value
    return Span(name, start, end, attrs)


def decode_traces(body: bytes) -> list[Span]:
    """Every span of an ``ExportTraceServiceRequest``."""
    out = []
    for n1, _, resource_spans in fields(body):
        if n1 != 1 or not isinstance(resource_spans, bytes):
            continue
        for n2, _, scope_spans in fields(resource_spans):
            if n2 != 2 or not isinstance(scope_spans, bytes):
                continue
            for n3, _, span in fields(scope_spans):
                if n3 == 2 and isinstance(span, bytes):
                    out.append(_span(span))
    return out


# -- the receiver --------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        rec = self.server.receiver
        if self.path.split("?")[0] != "/v1/traces":
            self._reply(404, b"")
            return
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            n = -1
        if not 0 <= n <= MAX_BODY_BYTES:
            rec.count_error("bad Content-Length")
            self._reply(413, b"")
            return
        body = self.rfile.read(n)
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype != "application/x-protobuf":
            rec.count_error(f"unsupported Content-Type {ctype!r} (set OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf)")
            self._reply(415, b"")
            return
        try:
            encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            rec.add(decode_traces(body))
        except (WireError, OSError, zlib.error, EOFError) as exc:
            rec.count_error(f"undecodable payload: {exc}")
            self._reply(400, b"")
            return
        self._reply(200, b"")  # an empty ExportTraceServiceResponse: everything accepted

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        pass  # the engine's exporter retries; counts go to the run's notes


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    receiver: OtlpReceiver


class OtlpReceiver:
    """``POST /v1/traces`` on ``host:port`` (port 0: any free one) in a daemon thread.

    ``endpoint`` is what to give the engine (``--otlp-traces-endpoint``). Spans without a
    request id (REQUEST_ID_ATTRIBUTES) are counted, not kept."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._spans: list[Span] = []
        self.payloads = 0
        self.spans_seen = 0
        self.errors: dict[str, int] = {}
        self._server = _Server((host, port), _Handler)
        self._server.receiver = self
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1/traces"

    def start(self) -> OtlpReceiver:
        self._thread = threading.Thread(target=self._server.serve_forever, name="bench-otlp", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reset(self) -> None:
        """Forget the spans received so far (a new run starts; the counters keep counting)."""
        with self._lock:
            self._spans = []

    def add(self, spans: list[Span]) -> None:
        with self._lock:
            self.payloads += 1
            self.spans_seen += len(spans)
            self._spans += [s for s in spans if request_id(s) is not None]

    def count_error(self, what: str) -> None:
        with self._lock:
            self.errors[what] = self.errors.get(what, 0) + 1

    @property
    def request_spans(self) -> int:
        with self._lock:
            return len(self._spans)

    def wait_for(self, spans: int, timeout_s: float, quiet_s: float = 1.0) -> bool:
        """Wait until at least ``spans`` request spans arrived and then none for ``quiet_s``
        (True), or ``timeout_s`` passed (False): engines export in batches, seconds after a
        request ends, and may export spans bench did not count (warm-up requests)."""
        deadline = time.monotonic() + timeout_s
        seen, quiet_since = -1, time.monotonic()
        while True:
            now, n = time.monotonic(), self.request_spans
            if n != seen:
                seen, quiet_since = n, now
            if n >= spans and now - quiet_since >= quiet_s:
                return True
            if now >= deadline:
                return n >= spans
            time.sleep(min(0.05, max(0.0, deadline - now)))

    def table(self) -> pa.Table:
        with self._lock:
            spans = list(self._spans)
        cols: dict[str, list[Any]] = {
            "span_request_id": [request_id(s) for s in spans],
            "name": [s.name for s in spans],
            "start_unix_ns": [s.start_unix_ns or None for s in spans],
            "end_unix_ns": [s.end_unix_ns or None for s in spans],
        }
        for column, attribute in SPAN_LATENCY_ATTRIBUTES.items():
            cols[column] = [_seconds(s.attributes.get(attribute)) for s in spans]
        cols["attributes_json"] = [json.dumps(s.attributes, sort_keys=True, default=str) for s in spans]
        return pa.table(cols, schema=SERVER_SPANS_SCHEMA)

    def write(self, run_dir: Path) -> Path | None:
        """``server_spans.parquet`` in the run folder (None when no request span arrived)."""
        if not self.request_spans:
            return None
        path = Path(run_dir) / SERVER_SPANS_FILE
        write_table_atomic(self.table(), path)
        return path

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {"endpoint": self.endpoint, "payloads": self.payloads, "spans": self.spans_seen,
                    "request_spans": len(self._spans), "errors": dict(self.errors)}  # fmt: skip


def request_id(span: Span) -> str | None:
    """The engine's request id on ``span`` (REQUEST_ID_ATTRIBUTES), or None."""
    for key in REQUEST_ID_ATTRIBUTES:
        v = span.attributes.get(key)
        if isinstance(v, str) and v:
            return v
    return None


def _seconds(v: AttrValue) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
