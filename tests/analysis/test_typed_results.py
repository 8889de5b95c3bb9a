"""The typed results serialise to the payloads bench has always written: the run summary's
JSON (keys in their order, optional sections left out while absent) and a sweep point's
``points.parquet`` row (columns in their order, one ``miss_share_<bound>`` per SLO bound)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from bench_llm.analysis.capacity_points import point_metrics
from bench_llm.analysis.load import load_run
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.summary import SummaryOptions, summarize
from bench_llm.analysis.summary_types import ClientHealth, Reasoning, json_of
from tests.helpers_records import record, write_run


def _run(tmp_path: Path) -> Path:
    recs = [record(f"r{i}", i * 100.0, [(i * 100.0 + 50, 1), (i * 100.0 + 60, 1)]) for i in range(8)]
    recs.append(record("slow", 900.0, [(900.0 + 900, 1), (900.0 + 910, 1)]))
    return write_run(tmp_path / "r", recs, {"workload_json": '{"rate": 10.0}'})


def test_summary_json_keeps_its_keys_order_and_leaves_out_what_is_absent(tmp_path: Path) -> None:
    table = load_run(_run(tmp_path)).requests
    plain = summarize(table).to_json()
    assert list(plain) == [
        "requests", "window_s", "throughput", "latency", "timing", "token_distributions", "tokens", "percentiles",
        "client", "smoothness",
    ]  # fmt: skip
    assert "reasoning" not in plain["tokens"] and "loop_lag_p99_ms" not in plain["client"]
    judged = summarize(table, SummaryOptions(slo=SLO.parse("ttft_ms=200"))).to_json()
    assert list(judged).index("slo") == list(judged).index("percentiles") + 1
    assert judged["slo"]["met"] == 8 and judged["slo"]["judged"] == 9
    assert isinstance(judged["slo"]["attainment_interval"], list) and judged["percentiles"] == [50, 90, 95, 99]
    assert list(judged["client"])[:2] == ["schedule_lag_p99_ms", "windows"]
    json.dumps(judged)  # plain data only
    health = ClientHealth(1.0, loop_lag_p99_ms=2.0, loop_lag_max_ms=3.0)
    assert list(health.to_json())[:3] == ["schedule_lag_p99_ms", "loop_lag_p99_ms", "loop_lag_max_ms"]
    assert json_of({"x": (Reasoning(1, 2, 3, 2.0, 3.0),)}) == {"x": [{
        "requests": 1, "reasoning_tokens": 2, "answer_tokens": 3, "reasoning_tokens_mean": 2.0, "answer_tokens_mean": 3.0,
    }]}  # fmt: skip


def test_a_point_row_has_its_columns_in_order_and_one_miss_share_per_bound(tmp_path: Path) -> None:
    m = point_metrics(load_run(_run(tmp_path)), SLO.parse("ttft_ms=200,tpot_ms=50"))
    row = m.as_row()
    cols = list(row)
    assert cols[:3] == ["requests", "ok", "failed"] and cols[-2:] == ["prompt_approximate", "more_requests_needed"]
    i = cols.index("goodput_rps")
    assert cols[i + 1 : i + 3] == ["miss_share_ttft_ms", "miss_share_tpot_ms"] and "miss_share" not in row
    assert row["miss_share_ttft_ms"] == m.miss_share["ttft_ms"] and math.isclose(row["miss_share_ttft_ms"], 1 / 9)
    assert set(row) - {f"miss_share_{k}" for k in m.miss_share} == {f.name for f in dataclasses.fields(m)} - {"miss_share"}
    unjudged = point_metrics(load_run(_run(tmp_path / "again")), SLO()).as_row()
    assert not any(c.startswith("miss_share_") for c in unjudged) and math.isnan(unjudged["attainment"])
