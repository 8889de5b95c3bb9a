"""TTFT split per request into queue, prefill, KV transfer and the rest (docs/metrics.md).

Where the engine tells, per request, in order of preference:

* its OpenTelemetry request spans, received during the run (``bench run --otlp-receiver``;
  ``server_spans.parquet``) and joined to the client's rows by the engine's request id. vLLM's
  ``llm_request`` span gives the time in queue, in prefill and its own TTFT (from the request's
  arrival at its API server to the first token leaving its engine): ``emission`` is that TTFT
  minus queue and prefill (input processing before the queue, handing the first token back to
  the API server), ``transit`` the client's TTFT minus the engine's (HTTP in, the first chunk
  out, the network both ways, the client's own read). SGLang's request root span (0.5.10 on)
  gives the engine's TTFT too, but its ``time_in_model_prefill`` includes the scheduler
  queue: the queue and prefill then come from the response's timings (``span+response``),
  or, without them, the span's figure is the part ``queue_prefill``, labelled so.
* the timings returned with the response: SGLang (``--enable-metrics``) returns them in
  ``meta_info``, named and defined differently by release; each release's rule reads them
  (analysis/ttft_rules.py), chosen by the run's recorded engine version or, without one, by
  the keys. Bench's simulated engine returns its imitated release's fields (plus
  ``kv_transfer_time`` with P/D), computed from its own clock. Where the engine states its
  own TTFT (``first_token_latency``, recent SGLang), ``emission`` and ``transit`` are apart as
  with spans; otherwise the client's TTFT minus what the engine accounted for is ``other``:
  the engine's HTTP and tokenizer front-end, first-token emission and the network both ways.

The split states, per run, which source and which release's rule it used (``rule``).
Parts sum to the client's TTFT by construction; ``other`` and ``transit`` are exact only as
far as the engine's parts are.

Where no request carries timings, the split falls back to the engine's queue and prefill
histograms, which give means per scrape interval over all requests, not per request.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from bench_llm.analysis.ttft_rules import RunEngine, choose_rule, is_sglang_span, run_engine
from bench_llm.results.reader import ResultsError, read_requests, read_run_meta, read_server_metrics, read_server_spans
from bench_llm.results.schema import SERVER_SPANS_FILE
from bench_llm.results.sweep_layout import CELL_PREFIX, LOAD_PREFIX

PARTS = ("queue", "prefill", "queue_prefill", "kv_transfer", "emission", "transit", "other")
COLUMNS = ["phase", "ok", "send_ns", "first_token_ns", "server_timing_json", "server_request_id"]
SOURCE_REQUEST = "per request, as the engine reported it"
SOURCE_SPANS = "per request, from the engine's OpenTelemetry spans"
SOURCE_HISTOGRAM = "engine histograms: means over all requests, not per request"
#: How SGLang's request spans are read (analysis/ttft_rules.py).
SGLANG_SPAN_RULE = ("SGLang request spans: engine TTFT = gen_ai.latency.time_to_first_token; "
                    "gen_ai.latency.time_in_model_prefill includes the scheduler queue")  # fmt: skip
#: How vLLM's ``llm_request`` spans are read.
VLLM_SPAN_RULE = ("vLLM llm_request spans: queue = gen_ai.latency.time_in_queue, prefill = time_in_model_prefill, "
                  "engine TTFT = time_to_first_token")  # fmt: skip
_SGLANG = "sglang_span"


def span_index(spans: pa.Table | None) -> dict[str, dict[str, float]]:
    """The engine's spans by request id: each span under its own id and, for an id with a
    per-choice suffix (vLLM: ``<response id>-0``), under the id without it, which is what the
    client recorded (``server_request_id``). A client id matching several spans (n > 1
    choices) keeps the first. Spans without any TTFT timing (SGLang's request root span up to
    0.5.9, which names the request by ``rid`` but keeps its queue and prefill in child spans
    that carry no id) are left out: the response's own timings, if any, split that request.
    SGLang's spans are marked (``sglang_span``): their prefill includes the queue."""
    if spans is None or not spans.num_rows:
        return {}
    out: dict[str, dict[str, float]] = {}
    cols = ["span_request_id", "queue_s", "prefill_s", "ttft_s"]
    extra = [c for c in ("name", "attributes_json") if c in spans.column_names]
    for row in spans.select(cols + extra).to_pylist():
        rid = row.pop("span_request_id")
        sglang = is_sglang_span(row.pop("attributes_json", None), row.pop("name", None))
        timing = {k: float(v) for k, v in row.items() if v is not None}
        if not timing:  # a span that names the request but times none of it (SGLang's root span before 0.5.10)
            continue
        if sglang:
            timing[_SGLANG] = 1.0
        out.setdefault(rid, timing)
        if "-" in rid and not sglang:  # SGLang's rids are bare hex: no per-choice suffix to drop
            out.setdefault(rid.rsplit("-", 1)[0], timing)
    return out


def _nan_parts() -> dict[str, float]:
    return dict.fromkeys(PARTS[:-1], math.nan)


def _with_engine_ttft(parts: dict[str, float], engine_ms: float, ttft_ms: float) -> dict[str, float]:
    """``emission``: the engine's TTFT less the parts it names; ``transit``: the client's TTFT less the engine's."""
    parts["emission"] = engine_ms - sum(v for k, v in parts.items() if k not in ("emission", "transit") and not math.isnan(v))
    parts["transit"] = ttft_ms - engine_ms
    return parts


def _span_parts(timing: dict[str, float], ttft_ms: float, reported: dict[str, float]) -> tuple[dict[str, float], str]:
    """A request's parts from its span (and, for SGLang's span, its response's queue and prefill)."""
    parts = _nan_parts()
    if _SGLANG in timing:
        if "queue" in reported and "prefill" in reported:
            # the span's TTFT, the response's queue and prefill: the split SGLang's span cannot give
            for key in ("queue", "prefill", "kv_transfer"):
                if key in reported:
                    parts[key] = reported[key]
            source = "span+response"
        else:
            if "prefill_s" in timing:  # dispatch finished -> first token: queue included, labelled so
                parts["queue_prefill"] = 1000 * timing["prefill_s"]
            source = "span"
        if "ttft_s" in timing:
            _with_engine_ttft(parts, 1000 * timing["ttft_s"], ttft_ms)
        return parts, source
    for key, part in (("queue_s", "queue"), ("prefill_s", "prefill")):
        if key in timing:
            parts[part] = 1000 * timing[key]
    if "ttft_s" in timing:
        _with_engine_ttft(parts, 1000 * timing["ttft_s"], ttft_ms)
    return parts, "span"


def _reported_parts(reported: dict[str, float], ttft_ms: float) -> dict[str, float]:
    parts = _nan_parts()
    for key in ("queue", "prefill", "kv_transfer"):
        if key in reported:
            parts[key] = reported[key]
    if "engine_ttft" in reported:  # SGLang's own TTFT (first_token_latency): emission and transit apart
        _with_engine_ttft(parts, reported["engine_ttft"], ttft_ms)
    return parts


def _timing_keys(texts: Iterable[Any]) -> tuple[list[dict[str, Any] | None], set[str]]:
    out: list[dict[str, Any] | None] = []
    keys: set[str] = set()
    for text in texts:
        obj = json.loads(text) if isinstance(text, str) else None
        if isinstance(obj, dict):
            keys.update(obj)
            out.append(obj)
        else:
            out.append(None)
    return out, keys


def request_parts(table: pa.Table, spans: pa.Table | None = None, engine: RunEngine | None = None,
                  stated: list[str] | None = None) -> pd.DataFrame:  # fmt: skip
    """One row per measured, completed request that carries timings (its engine span in
    ``spans``, else timings in its response): ``ttft_ms``, one ``<part>_ms`` column per part
    (NaN for a part the engine did not report) and ``source`` ('span' | 'span+response' |
    'response'). The response timings are read by their SGLang release's rule
    (analysis/ttft_rules.py), chosen from ``engine`` (the run's recorded engine and version)
    or, without it, from the keys; ``stated`` receives the sentences saying which rules were used."""
    columns = ["ttft_ms", *(f"{p}_ms" for p in PARTS), "source"]
    df = table.select([c for c in COLUMNS if c in table.column_names]).to_pandas()
    index = span_index(spans)
    if "server_timing_json" not in df and not index:
        return pd.DataFrame(columns=columns)
    for c in ("server_timing_json", "server_request_id"):
        if c not in df:
            df[c] = None
    df = df[(df["phase"] == "measure") & df["ok"] & df["first_token_ns"].notna()]
    timings, keys = _timing_keys(df["server_timing_json"])
    rule, why = choose_rule(engine or RunEngine(), keys)
    used: set[str] = set()
    rows = []
    for ttft_ns, timing, rid in zip((df["first_token_ns"] - df["send_ns"]).to_numpy(dtype=float), timings,
                                    df["server_request_id"]):  # fmt: skip
        ttft_ms = ttft_ns / 1e6
        reported = rule.parts(timing) if rule is not None and timing is not None else {}
        span = index.get(rid) if isinstance(rid, str) else None
        if span is not None:
            parts, source = _span_parts(span, ttft_ms, reported)
            if _SGLANG in span:
                used.add(SGLANG_SPAN_RULE + ("; queue and prefill from the responses: " + why if source == "span+response"
                                             else "; no response timings: labelled queue + prefill"))  # fmt: skip
            else:
                used.add(VLLM_SPAN_RULE)
        elif reported:
            parts, source = _reported_parts(reported, ttft_ms), "response"
            used.add(why)
        else:
            continue
        known = sum(v for v in parts.values() if not math.isnan(v))
        # with the engine's own TTFT, transit is the rest: nothing is left over
        other = math.nan if not math.isnan(parts["transit"]) else ttft_ms - known
        rows.append({"ttft_ms": ttft_ms, **{f"{p}_ms": v for p, v in parts.items()}, "other_ms": other, "source": source})
    if stated is not None:
        stated.extend(sorted(used))
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
    stated: list[str] = []
    parts = request_parts(table, read_server_spans(run_dir), _run_engine(run_dir), stated)
    if len(parts):
        stats = {p: _stats(parts[f"{p}_ms"].to_numpy(dtype=float)) for p in PARTS}
        total = parts[[f"{p}_ms" for p in PARTS]].fillna(0.0).sum(axis=1)
        spans = int(parts["source"].str.startswith("span").sum())
        return {
            "source": SOURCE_SPANS if spans == len(parts) else SOURCE_REQUEST,
            "rule": "; ".join(stated) or None,
            "requests": int(len(parts)),
            "ttft_ms": _stats(parts["ttft_ms"].to_numpy(dtype=float)),
            "parts_ms": {p: s for p, s in stats.items() if s},
            "max_sum_error_ms": float((total - parts["ttft_ms"]).abs().max()),
        }
    return _histogram_split(run_dir, table)


def _run_engine(run_dir: Path) -> RunEngine:
    """The engine the run recorded (family, version); an empty one when its metadata is unreadable."""
    try:
        return run_engine(read_run_meta(run_dir))
    except (ResultsError, OSError, ValueError):
        return RunEngine()


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
          "queue_prefill": "queue + prefill (SGLang span; no queue figure)",
          "emission": "front-end + first-token emission (engine)", "transit": "transit (HTTP, network, client)",
          "other": "other (front-end, emission, transit)"}  # fmt: skip


def format_split(split: dict[str, Any]) -> list[str]:
    """Terminal lines: each part's mean (and p50/p90 per request) and its share of mean TTFT."""
    ttft = split["ttft_ms"].get("mean", math.nan)
    lines = [f"TTFT split ({split['source']}; {split['requests']} requests, mean TTFT {ttft:,.2f} ms):"]
    if split.get("rule"):
        lines.append(f"  read as: {split['rule']}")
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
    rules = sorted({str(r["rule"]) for r in heaviest.values() if r.get("rule")})
    head = ["TTFT split per cell (engine spans, heaviest load with spans):", *(f"  read as: {rule}" for rule in rules)]
    return [*head, *lines] if lines else []
