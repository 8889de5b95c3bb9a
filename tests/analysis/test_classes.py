"""Mixed workloads: each request's class is recorded and reported (analysis/classes.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from bench_llm.analysis.classes import class_breakdown, format_breakdown
from bench_llm.analysis.report import build_report
from bench_llm.analysis.slo import SLO
from bench_llm.analysis.summary import SummaryOptions
from bench_llm.results.reader import read_parquet_file, read_requests
from bench_llm.results.synthetic import synthetic_run
from bench_llm.results.writer import write_schedule, write_table_atomic
from bench_llm.workloads.catalog import build_named_schedule
from bench_llm.workloads.definition import builtins


def test_a_mix_labels_each_request_without_changing_its_draws(tmp_path: Path) -> None:
    mix = builtins()["long-short-mix"].lengths
    a = mix.sample(500, np.random.default_rng(7))
    i, o, labels = mix.sample_labelled(500, np.random.default_rng(7))
    assert np.array_equal(a[0], i) and np.array_equal(a[1], o)  # seeded schedules are unchanged
    assert set(labels) == {"short", "long"} and (i[labels == "long"] >= 8192).all()
    sched = build_named_schedule("long-short-mix", requests=200, rate=None, arrival="poisson", concurrency=4, warmup=0, seed=3)
    classes = [s.length_class for s in sched.requests]
    assert set(classes) == {"short", "long"}
    write_schedule(tmp_path, sched.requests)
    assert read_parquet_file(tmp_path / "schedule.parquet")["length_class"].to_pylist() == classes
    plain = build_named_schedule("fixed", requests=10, rate=None, arrival="poisson", concurrency=4, warmup=0, seed=3)
    assert {s.length_class for s in plain.requests} == {None}


def _mixed_run(root: Path) -> Path:
    """A synthetic run whose every 10th request is a 'long' one with a 4x slower first token."""
    short = read_requests(synthetic_run(root / "short", 180, 8, seed=1))
    long = read_requests(synthetic_run(root / "long", 20, 8, seed=2, scale=4.0))
    n = short.num_rows + long.num_rows
    table = pa.concat_tables([short, long])
    table = table.set_column(table.schema.get_field_index("length_class"), "length_class",
                             pa.array(["short"] * short.num_rows + ["long"] * long.num_rows))  # fmt: skip
    table = table.set_column(table.schema.get_field_index("request_id"), "request_id", pa.array([f"r{i:05d}" for i in range(n)]))
    run = root / "short"
    write_table_atomic(table, run / "requests" / "part-000-000000.parquet")
    return run


def test_breakdown_shows_what_the_mix_hides(tmp_path: Path) -> None:
    run = _mixed_run(tmp_path)
    rows = class_breakdown(read_requests(run), SummaryOptions(slo=SLO.from_dict({"ttft_ms": 200})))
    by = {r["class"]: r for r in rows}
    assert set(by) == {"short", "long"} and by["long"]["requests"] == 20 and abs(by["long"]["share"] - 0.1) < 1e-9
    assert by["long"]["ttft_p50_ms"] > 3 * by["short"]["ttft_p50_ms"]
    assert by["long"]["attainment"] < 0.5 < by["short"]["attainment"]
    text = "\n".join(format_breakdown(rows))
    assert "long" in text and "10.0%" in text
    out = tmp_path / "r.html"
    build_report(run, out)
    page = out.read_text(encoding="utf-8")
    assert "Per class (mix component" in page and "<td>long</td><td>20</td><td>10.0%</td>" in page
