"""TTFT split per request into queue, prefill, KV transfer and the rest (docs/metrics.md).

Where the engine tells, per request, in order of preference:

* its OpenTelemetry request spans, received during the run (``bench run --otlp-receiver``;
  ``server_spans.parquet``) and joined to the client's rows by the engine's request id. vLLM's
  ``llm_request`` span gives the time in queue, in prefill and its own TTFT (from the request's
  arrival at its API server to the first token leaving its engine): ``emission`` is that TTFT
  minus queue and prefill (input processing before the queue, handing the first token back to
  the API server), ``transit`` the client's TTFT minus the engine's (HTTP in, the first chunk
  out, the network both ways, the client's own read).
* the timings returned with the response: SGLang (``--enable-metrics``) returns ``queue_time``,
  ``prefill_launch_delay`` and ``prefill_launch_latency`` in ``meta_info``; bench's simulated
  engine returns the same fields (plus ``kv_transfer_time`` with P/D), computed from its own
  clock. The client's TTFT minus what the engine accounted for is ``other``: the engine's
  HTTP and tokenizer front-end, first-token emission and the network both ways.

Parts sum to the client's TTFT by construction; ``other`` and ``transit`` are exact only as
far as the engine's parts are.

Where no request carries timings, the split falls back to the engine's queue and prefill
histograms, which give means per scrape interval over all requests, not per request.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from bench_llm.results.reader import read_requests, read_server_metrics, read_server_spans
from bench_llm.results.schema import SERVER_SPANS_FILE
from bench_llm.results.sweep_layout import CELL_PREFIX, LOAD_PREFIX

#: The engine's timing fields -> the part of TTFT they measure.
TIMING_PARTS = {
    "queue_time": "queue",
    "prefill_launch_delay": "prefill",
    "prefill_launch_latency": "prefill",
    "kv_transfer_time": "kv_transfer",
}
PARTS = ("queue", "prefill", "kv_transfer", "emission", "transit", "other")
COLUMNS = ["phase", "ok", "send_ns", "first_token_ns", "server_timing_json", "server_request_id"]
SOURCE_REQUEST = "per request, as the engine reported it"
SOURCE_SPANS = "per request, from the engine's OpenTelemetry spans"
SOURCE_HISTOGRAM = "engine histograms: means over all requests, not per request"


def span_index(spans: pa.Table | None) -> dict[str, dict[str, float]]:
    """The engine's spans by request id: each span under its own id and, for an id with a
    per-choice suffix (vLLM: ``<response id>-0``), under the id without it, which is what the
    client recorded (``server_request_id``). A client id matching several spans (n > 1
    choices) keeps the first. Spans without any TTFT timing (SGLang's request root span, which
    names the request by ``rid`` but keeps its queue and prefill in child spans that carry no
    id) are left out: the response's own timings, if any, split that request."""
    if spans is None or not spans.num_rows:
        return {}
    out: dict[str, dict[str, float]] = {}
    cols = ["span_request_id", "queue_s", "prefill_s", "ttft_s"]
    for row in spans.select(cols).to_pylist():
        rid = row.pop("span_request_id")
        timing = {k: float(v) for k, v in row.items() if v is not None}
        if not timing:  # a span that names the request but times none of it (SGLang's root span)
            continue
        out.setdefault(rid, timing)
        if "-" in rid:
            out.setdefault(rid.rsplit("-", 1)[0], timing)
    return out


def _span_parts(timing: dict[str, float], ttft_ms: float) -> dict[str, float]:
    parts = dict.fromkeys(PARTS[:-1], math.nan)
    for key, part in (("queue_s", "queue"), ("prefill_s", "prefill")):
        if key in timing:
            parts[part] = 1000 * timing[key]
    if "ttft_s" in timing:
        engine_ms = 1000 * timing["ttft_s"]
        parts["emission"] = engine_ms - sum(v for v in (parts["queue"], parts["prefill"]) if not math.isnan(v))
        parts["transit"] = ttft_ms - engine_ms
    return parts


def _reported_parts(text: str) -> dict[str, float]:
    timing = json.loads(text)
    parts = dict.fromkeys(PARTS[:-1], math.nan)
    for key, part in TIMING_PARTS.items():
        v = timing.get(key)
        if isinstance(v, (int, float)):
            parts[part] = (0.0 if math.isnan(parts[part]) else parts[part]) + 1000 * float(v)
    return parts


def request_parts(table: pa.Table, spans: pa.Table | None = None) -> pd.DataFrame:
    """One row per measured, completed request that carries timings (its engine span in
    ``spans``, else timings in its response): ``ttft_ms``, one ``<part>_ms`` column per part
    (NaN for a part the engine did not report) and ``source`` ('span' | 'response')."""
    columns = ["ttft_ms", *(f"{p}_ms" for p in PARTS), "source"]
    df = table.select([c for c in COLUMNS if c in table.column_names]).to_pandas()
    index = span_index(spans)
    if "server_timing_json" not in df and not index:
        return pd.DataFrame(columns=columns)
    for c in ("server_timing_json", "server_request_id"):
        if c not in df:
            df[c] = None
    df = df[(df["phase"] == "measure") & df["ok"] & df["first_token_ns"].notna()]
    rows = []
    for ttft_ns, text, rid in zip((df["first_token_ns"] - df["send_ns"]).to_numpy(dtype=float), df["server_timing_json"],
                                  df["server_request_id"]):  # fmt: skip
        ttft_ms = ttft_ns / 1e6
        span = index.get(rid) if isinstance(rid, str) else None
        if span is not None:
            parts, source = _span_parts(span, ttft_ms), "span"
        elif isinstance(text, str):
            parts, source = _reported_parts(text), "response"
        else:
            continue
        known = sum(v for v in parts.values() if not math.isnan(v))
        # with the engine's own TTFT, transit is the rest: nothing is left over
        other = math.nan if not math.isnan(parts["transit"]) else ttft_ms - known
        rows.append({"ttft_ms": ttft_ms, **{f"{p}_ms": v for p, v in parts.items()}, "other_ms": other, "source": source})
    return pd.DataFrame(rows, columns=columns)


def _stats(values: np.ndarray) -> dict[str, float]:
    v = values[np.isfinite(values)]
    if not len(v):
        return {}
    return {"mean": float(v.mean()), "p50": float(np.percentile(v, 50)), "p90": float(np.percentile(v, 90)),
            "p99": float(np.percentile(v, 99))}  # fmt: skip


def split_summary(run_dir: Path, requests: pa.Table | None = None) -> dict[str, Any] | None:
    """The run's TTFT split: per request when the engine reported timings, else from its
    histograms (labelled so), else None."""
    table = requests if requests is not None and all(c in requests.column_names for c in COLUMNS) else read_requests(run_dir, COLUMNS)
    parts = request_parts(table, read_server_spans(run_dir))
    if len(parts):
        stats = {p: _stats(parts[f"{p}_ms"].to_numpy(dtype=float)) for p in PARTS}
        total = parts[[f"{p}_ms" for p in PARTS]].fillna(0.0).sum(axis=1)
        spans = int((parts["source"] == "span").sum())
        return {
            "source": SOURCE_SPANS if spans == len(parts) else SOURCE_REQUEST,
            "requests": int(len(parts)),
            "ttft_ms": _stats(parts["ttft_ms"].to_numpy(dtype=float)),
            "parts_ms": {p: s for p, s in stats.items() if s},
            "max_sum_error_ms": float((total - parts["ttft_ms"]).abs().max()),
        }
    return _histogram_split(run_dir, table)


def _histogram_split(run_dir: Path, table: pa.Table) -> dict[str, Any] | None:
    from bench_llm.analysis.server_metrics import PREFILL_HIST, QUEUE_HIST, hist_interval_means

    server = read_server_metrics(run_dir)
    if server is None or "common" not in server.column_names:
        return None
    means: dict[str, dict[str, float]] = {}
    for part, aliases in (("queue", QUEUE_HIST), ("prefill", PREFILL_HIST)):
        res = hist_interval_means(server, aliases)
        if res is not None:
            mean, count = res
            means[part] = {"mean": float((mean * count).sum() / count.sum() * 1000)}
    if not means:
        return None
    df = table.select(["phase", "ok", "send_ns", "first_token_ns"]).to_pandas()
    df = df[(df["phase"] == "measure") & df["ok"] & df["first_token_ns"].notna()]
    ttft = ((df["first_token_ns"] - df["send_ns"]) / 1e6).to_numpy(dtype=float)
    return {"source": SOURCE_HISTOGRAM, "requests": int(len(ttft)), "ttft_ms": _stats(ttft), "parts_ms": means}


LABELS = {"queue": "queue", "prefill": "prefill", "kv_transfer": "KV transfer",
          "emission": "front-end + first-token emission (engine)", "transit": "transit (HTTP, network, client)",
          "other": "other (front-end, emission, transit)"}  # fmt: skip


def format_split(split: dict[str, Any]) -> list[str]:
    """Terminal lines: each part's mean (and p50/p90 per request) and its share of mean TTFT."""
    ttft = split["ttft_ms"].get("mean", math.nan)
    lines = [f"TTFT split ({split['source']}; {split['requests']} requests, mean TTFT {ttft:,.2f} ms):"]
    for part, s in split["parts_ms"].items():
        share = f"{100 * s['mean'] / ttft:5.1f}%" if ttft and math.isfinite(ttft) else "    -"
        detail = f", p50 {s['p50']:,.2f}, p90 {s['p90']:,.2f}" if "p50" in s else ""
        lines.append(f"  {LABELS.get(part, part):<38} mean {s['mean']:>9,.2f} ms {share}{detail}")
    return lines


def sweep_splits(sweep_dir: Path) -> list[dict[str, Any]]:
    """The per-request TTFT split of every load of every cell that kept the engine's spans
    (``bench sweep --otlp-receiver``): ``cell_id``, ``load`` and the split (``split_summary``),
    by cell then load. Loads without spans are not read (a sweep has many)."""
    rows = []
    for path in sorted(Path(sweep_dir).glob(f"{CELL_PREFIX}*/{LOAD_PREFIX}*/{SERVER_SPANS_FILE}")):
        run = path.parent
        split = split_summary(run)
        if split is None or split["source"] == SOURCE_HISTOGRAM:
            continue
        rows.append({"cell_id": run.parent.name.removeprefix(CELL_PREFIX), "load": run.name.removeprefix(LOAD_PREFIX),
                     **split})  # fmt: skip
    return rows


def _load_weight(label: str) -> float:
    """A load label's offered load, for picking a cell's heaviest (``rate-12.5`` -> 12.5;
    a one-at-a-time baseline is the lightest)."""
    if label.startswith("baseline-"):
        return -1.0
    try:
        return float(label.split("-")[1])
    except (IndexError, ValueError):
        return 0.0


def format_sweep_splits(rows: list[dict[str, Any]]) -> list[str]:
    """One line per cell: the split of its heaviest load with spans (each part's mean)."""
    heaviest: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["cell_id"] not in heaviest or _load_weight(r["load"]) >= _load_weight(heaviest[r["cell_id"]]["load"]):
            heaviest[r["cell_id"]] = r
    lines = []
    for cell, r in heaviest.items():
        parts = ", ".join(f"{p} {s['mean']:,.1f}" for p, s in r["parts_ms"].items())
        lines.append(f"  {cell} at {r['load']}: mean TTFT {r['ttft_ms'].get('mean', math.nan):,.1f} ms = {parts} ms "
                     f"({r['requests']} requests)")  # fmt: skip
    return ["TTFT split per cell (engine spans, heaviest load with spans):", *lines] if lines else []
