"""``server_signals``' numpy path gives the pandas path's figures bit for bit (issue 18)."""

from __future__ import annotations

import math
import random
from typing import Any

import pyarrow as pa

from bench_llm.analysis.server_signals import _frame_server_signals, _plain_server_signals, server_signals
from bench_llm.results.schema import SERVER_METRICS_SCHEMA


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return list(a) == list(b) and all(
        (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))
        for x, y in zip(a.values(), b.values())
    )


def _scrapes(seed: int, label_sets: int, ties: bool, nan: bool) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    rows: list[dict[str, Any]] = []
    counters = {k: 0.0 for k in ("pre", "qs", "qc")}
    for i in range(rnd.randint(1, 12)):
        ts = (i // 2 if ties else i) * 1_000_000_000 + rnd.randint(0, 3)
        for lab in range(label_sets):
            labels = f'engine="{lab}"' if label_sets > 1 else ""
            for k in counters:
                counters[k] += rnd.choice([0.0, 0.1, 1.0, 3.7])
            rows += [
                {"ts_ns": ts, "metric": "vllm:kv_cache_usage_perc", "common": "kv_cache_usage", "type": "gauge",
                 "labels": labels, "value": float("nan") if nan and i == 1 else rnd.random() * rnd.choice([1, 100])},
                {"ts_ns": ts, "metric": "vllm:num_preemptions_total", "common": "preemptions", "type": "counter",
                 "labels": labels, "value": counters["pre"]},
                {"ts_ns": ts, "metric": "vllm:request_queue_time_seconds_sum", "common": "queue_seconds",
                 "type": "histogram_sum", "labels": labels, "value": counters["qs"]},
                {"ts_ns": ts, "metric": "x_seconds_count", "common": "queue_seconds", "type": "histogram_count",
                 "labels": labels, "value": counters["qc"]},
                {"ts_ns": ts, "metric": "vllm:request_queue_time_seconds_bucket", "common": "queue_seconds",
                 "type": "histogram_bucket", "labels": labels, "le": 0.5, "value": 1.0},
                {"ts_ns": ts, "metric": "other", "common": None, "type": "gauge", "labels": labels, "value": 5.0},
            ]
            if lab == 0:  # one waiting gauge per scrape
                w = float("nan") if nan and i == 2 else float(rnd.randint(0, 40)) * rnd.choice([1.0, -1.0, 0.5])
                rows.append({"ts_ns": i * 1_000_000_000 + 500, "metric": "vllm:num_requests_waiting", "common": "waiting",
                             "type": "gauge", "labels": labels, "value": w})
    rnd.shuffle(rows)
    return rows


def test_plain_path_matches_pandas_bit_for_bit() -> None:
    taken = 0
    for seed in range(60):
        rows = _scrapes(seed, label_sets=1 + seed % 3, ties=seed % 2 == 0, nan=seed % 5 == 0)
        table = pa.Table.from_pylist(rows, schema=SERVER_METRICS_SCHEMA)
        plain = _plain_server_signals(table)
        assert plain is not None
        taken += 1
        assert _same(plain, _frame_server_signals(table)), seed
        assert _same(server_signals(table), plain)
    assert taken == 60


def test_other_tables_take_the_pandas_path() -> None:
    rows = _scrapes(1, label_sets=1, ties=False, nan=False)
    twice = rows + [dict(r, labels="other") for r in rows if r["common"] == "waiting"]  # two gauges per scrape
    null_labels = [dict(r, labels=None) for r in rows]
    for case in (twice, null_labels):
        table = pa.Table.from_pylist(case, schema=SERVER_METRICS_SCHEMA)
        assert _plain_server_signals(table) is None
        assert _same(server_signals(table), _frame_server_signals(table))
        assert "waiting_max" in server_signals(table)
    no_type = pa.Table.from_pylist(rows, schema=SERVER_METRICS_SCHEMA).drop_columns(["type"])
    assert _plain_server_signals(no_type) is None
    assert server_signals(no_type) == _frame_server_signals(no_type)
