"""Arrow schemas, declared once. Timestamps are integer nanoseconds.

Bump ``SCHEMA_VERSION`` on any incompatible change; readers refuse newer major versions.
A new nullable column bumps the minor version (older files read it as null):
1.1 added ``requests.n`` (sequences per request); 1.2 added ``requests.protocol_anomaly`` and
``schedule.after``, ``schedule.after_delay_ns`` and ``schedule.context_from`` (session graphs);
1.3 added the model-error columns (``MODEL_ERROR_FIELDS``) of a simulated sweep's points and cells.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "1.3"

REQUESTS_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),
        pa.field("worker_id", pa.int32(), nullable=False),
        pa.field("session_id", pa.string()),
        pa.field("turn", pa.int32()),
        pa.field("prefix_group", pa.string()),
        pa.field("intended_send_ns", pa.int64(), nullable=False),
        pa.field("send_ns", pa.int64()),
        pa.field("first_byte_ns", pa.int64()),
        pa.field("first_token_ns", pa.int64()),
        pa.field("first_content_ns", pa.int64()),
        pa.field("end_ns", pa.int64()),
        pa.field("chunk_ns", pa.list_(pa.int64())),
        pa.field("chunk_tokens", pa.list_(pa.int32())),
        pa.field("output_tokens", pa.int32(), nullable=False),
        pa.field("token_source", pa.string(), nullable=False),
        pa.field("input_tokens_target", pa.int32(), nullable=False),
        pa.field("input_tokens_source", pa.string()),
        pa.field("max_output_tokens", pa.int32(), nullable=False),
        pa.field("prompt_tokens", pa.int32()),
        pa.field("completion_tokens", pa.int32()),
        pa.field("cached_tokens", pa.int32()),
        pa.field("http_status", pa.int32()),
        pa.field("finish_reason", pa.string()),
        pa.field("ok", pa.bool_(), nullable=False),
        pa.field("error_type", pa.string()),
        pa.field("error_message", pa.string()),
        pa.field("server_request_id", pa.string()),
        pa.field("output_text", pa.string()),
        pa.field("server_timing_json", pa.string()),
        pa.field("length_class", pa.string()),
        pa.field("reasoning_tokens", pa.int32()),
        pa.field("kind", pa.string()),
        pa.field("model", pa.string()),
        pa.field("structured_ok", pa.bool_()),
        pa.field("inputs", pa.int32()),
        pa.field("tool_calls", pa.int32()),
        pa.field("first_tool_call_ns", pa.int64()),
        pa.field("images", pa.int32()),
        pa.field("n", pa.int32()),
        # a stream that broke its protocol (analysis/invariants.py: counted, kept out of every metric)
        pa.field("protocol_anomaly", pa.string()),
    ],
    metadata={"bench.schema_version": SCHEMA_VERSION, "bench.table": "requests"},
)

#: The simulated engine's error (issue 36) on each load (``points.parquet``) and cell
#: (``cells.parquet``) of a sweep run on it: per metric the relative error ``e`` (a figure ``x``
#: stands for a measured engine's ``[x(1-e), x(1+e)]``), where it comes from, and the capacity's
#: (the largest over the metrics a capacity under SLOs rests on). Null on a measured engine's rows.
MODEL_ERROR_METRICS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "e2e_ms", "throughput", "capacity")
MODEL_ERROR_SOURCE = "model_error_source"
MODEL_ERROR_FIELDS: tuple[pa.Field, ...] = (
    *(pa.field(f"model_error_{m}", pa.float64()) for m in MODEL_ERROR_METRICS),
    pa.field(MODEL_ERROR_SOURCE, pa.string()),
)


def model_error_column(metric: str) -> str:
    """The column holding the model's relative error on ``metric`` (one of ``MODEL_ERROR_METRICS``)."""
    if metric not in MODEL_ERROR_METRICS:
        raise ValueError(f"model error metric {metric!r}: one of {', '.join(MODEL_ERROR_METRICS)}")
    return f"model_error_{metric}"


#: One row per run. JSON columns hold nested settings as text.
RUN_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("schema_version", pa.string(), nullable=False),
        pa.field("bench_version", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),  # running | complete | interrupted | failed
        pa.field("command", pa.string()),
        pa.field("config_json", pa.string()),
        pa.field("engine", pa.string()),
        pa.field("model", pa.string()),
        pa.field("adapter_json", pa.string()),
        pa.field("workload_json", pa.string()),
        pa.field("host_json", pa.string()),
        pa.field("start_utc", pa.timestamp("ns", tz="UTC")),
        pa.field("end_utc", pa.timestamp("ns", tz="UTC")),
        pa.field("t0_monotonic_ns", pa.int64()),
        pa.field("t0_unix_ns", pa.int64()),
        pa.field("clock", pa.string()),
        pa.field("notes_json", pa.string()),
        pa.field("extra_json", pa.string()),
    ],
    metadata={"bench.schema_version": SCHEMA_VERSION, "bench.table": "run"},
)

SCHEDULE_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("phase", pa.string(), nullable=False),
        pa.field("send_offset_ns", pa.int64()),
        pa.field("input_tokens", pa.int32(), nullable=False),
        pa.field("max_output_tokens", pa.int32(), nullable=False),
        pa.field("session_id", pa.string()),
        pa.field("turn", pa.int32()),
        pa.field("think_time_ns", pa.int64()),
        pa.field("prefix_group", pa.string()),
        pa.field("input_tokens_source", pa.string()),
        pa.field("length_class", pa.string()),
        # session graphs (workloads/graph.py): the requests that must finish before this one,
        # the delay after each, and the one whose conversation it continues
        pa.field("after", pa.list_(pa.string())),
        pa.field("after_delay_ns", pa.list_(pa.int64())),
        pa.field("context_from", pa.string()),
    ],
    metadata={"bench.schema_version": SCHEMA_VERSION, "bench.table": "schedule"},
)

#: File and folder names inside a run folder.
RUN_FILE = "run.parquet"
SCHEDULE_FILE = "schedule.parquet"
REQUESTS_DIR = "requests"
SERVER_METRICS_DIR = "server_metrics"
MONITOR_DIR = "client_monitor"
ENGINE_LOG = "engine.log"

#: Client self-monitoring samples (event-loop lag, CPU, in-flight counts).
MONITOR_SCHEMA = pa.schema(
    [
        pa.field("worker_id", pa.int32(), nullable=False),
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("loop_lag_ns", pa.int64()),
        pa.field("cpu_s", pa.float64()),  # process CPU seconds (user+system) since start
        pa.field("in_flight", pa.int32()),
        pa.field("sent", pa.int64()),
        pa.field("completed", pa.int64()),
    ],
    metadata={"bench.schema_version": SCHEMA_VERSION, "bench.table": "client_monitor"},
)

#: Scraped engine /metrics in long format. Histograms are one row per bucket (``le``),
#: plus ``_sum``/``_count`` rows; counters and buckets also carry ``delta`` from the
#: previous scrape. ``common`` maps engine-specific names onto bench's common ones.
SERVER_METRICS_SCHEMA = pa.schema(
    [
        pa.field("ts_ns", pa.int64(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("common", pa.string()),
        pa.field("type", pa.string()),
        pa.field("labels", pa.string()),
        pa.field("le", pa.float64()),
        pa.field("value", pa.float64()),
        pa.field("delta", pa.float64()),
    ],
    metadata={"bench.schema_version": SCHEMA_VERSION, "bench.table": "server_metrics"},
)

#: The engine's own per-request spans, received over OTLP during the run (loadgen/otlp.py;
#: ``bench run --otlp-receiver``), one row per span that names a request
#: (``gen_ai.request.id``). Written once, when the run ends; analysis joins it to the
#: client's rows by request id (``span_request_id`` is the engine's id of the request, the
#: ``server_request_id`` of the client's row plus a per-choice suffix such as ``-0``).
#: Latencies in seconds, as the engine reported them (vLLM's ``llm_request`` span).
SERVER_SPANS_FILE = "server_spans.parquet"
#: column -> the span attribute it holds
SPAN_LATENCY_ATTRIBUTES = {
    "queue_s": "gen_ai.latency.time_in_queue",
    "prefill_s": "gen_ai.latency.time_in_model_prefill",
    "decode_s": "gen_ai.latency.time_in_model_decode",
    "inference_s": "gen_ai.latency.time_in_model_inference",
    "ttft_s": "gen_ai.latency.time_to_first_token",
    "e2e_s": "gen_ai.latency.e2e",
}
SERVER_SPANS_SCHEMA = pa.schema(
    [
        pa.field("span_request_id", pa.string(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("start_unix_ns", pa.int64()),
        pa.field("end_unix_ns", pa.int64()),
        *(pa.field(c, pa.float64()) for c in SPAN_LATENCY_ATTRIBUTES),
        pa.field("attributes_json", pa.string()),  # every attribute of the span
    ],
    metadata={"bench.schema_version": SCHEMA_VERSION, "bench.table": "server_spans"},
)

#: A results store (``bench history``): many runs as one partitioned Parquet dataset,
#: ``STORE/metrics/date=D/commit=C/config=K/<run_id>.parquet`` in long format (one row per
#: gated metric of the run), beside a copy of each run folder under ``STORE/runs/<same
#: partitions>/run=<run_id>/``. ``date``, ``commit`` and ``config`` come from the folder names
#: (Hive partitions), so one glob reads the whole history.
HISTORY_METRICS_DIR = "metrics"
HISTORY_RUNS_DIR = "runs"
HISTORY_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("config_key", pa.string(), nullable=False),  # the exact configuration ('' for a plain run)
        pa.field("start_utc", pa.timestamp("ns", tz="UTC")),
        pa.field("added_utc", pa.timestamp("ns", tz="UTC"), nullable=False),
        pa.field("engine", pa.string()),
        pa.field("model", pa.string()),
        pa.field("bench_version", pa.string()),
        pa.field("runs", pa.int32(), nullable=False),  # repeats pooled into this row
        pa.field("requests", pa.int64(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
        # What was measured, as JSON (analysis/history.run_fingerprint): workload, load, engine
        # identity and host; only entries with the same one are compared. Null in older stores.
        pa.field("fingerprint", pa.string()),
    ],
    metadata={"bench.schema_version": SCHEMA_VERSION, "bench.table": "history"},
)
