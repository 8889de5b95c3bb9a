"""Result folders for the report tests: a real small run, a synthetic sweep around it, and a
synthetic large run (no engine needed for the last two)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench_llm.results.reader import read_run_meta
from bench_llm.results.schema import SERVER_METRICS_SCHEMA
from bench_llm.results.synthetic import synthetic_run
from bench_llm.results.writer import write_run_meta, write_table_atomic
from tests.conftest import REPO, bench_argv

NASTY_MODEL = '<img src=x onerror="window.__xss=1">&"model"</script>'


def real_run(out: Path, requests: int = 60, concurrency: int = 8, output_tokens: int = 16, slo: str = "ttft_ms=80,tpot_ms=12") -> Path:
    argv = bench_argv(
        "run", "--requests", str(requests), "--concurrency", str(concurrency), "--input-tokens", "64",
        "--output-tokens", str(output_tokens), "--model", NASTY_MODEL, "--slo", slo, "--out", str(out), "--no-progress",
    )  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def add_server_metrics(run_dir: Path) -> None:
    """Synthetic scrapes: queue/running/KV gauges and queue/prefill histogram sums/counts."""
    from bench_llm.results.reader import read_requests

    reqs = read_requests(run_dir, ["intended_send_ns", "end_ns"])
    t0 = int(min(reqs["intended_send_ns"].to_pylist()))
    t1 = int(max(v for v in reqs["end_ns"].to_pylist() if v is not None))
    ts = np.linspace(t0, t1, 12).astype(np.int64)
    rows: dict[str, list] = {n: [] for n in SERVER_METRICS_SCHEMA.names}

    def add(t: int, metric: str, common: str, typ: str, value: float, delta: float | None = None) -> None:
        for k, v in (("ts_ns", t), ("metric", metric), ("common", common), ("type", typ), ("labels", "{}"),
                     ("le", None), ("value", value), ("delta", delta)):  # fmt: skip
            rows[k].append(v)

    for i, t in enumerate(ts.tolist()):
        add(t, "vllm:num_requests_waiting", "waiting", "gauge", float(i % 4))
        add(t, "vllm:num_requests_running", "running", "gauge", float(4 + i % 3))
        add(t, "vllm:kv_cache_usage_perc", "kv_cache_usage", "gauge", 0.05 * i)
        for metric, common, mean_s in (("vllm:request_queue_time_seconds", "queue_seconds", 0.004),
                                       ("vllm:request_prefill_time_seconds", "prefill_seconds", 0.03)):  # fmt: skip
            n = 0.0 if i == 0 else 5.0
            add(t, metric + "_sum", common, "histogram_sum", mean_s * 5 * i, mean_s * n if i else None)
            add(t, metric + "_count", common, "histogram_count", 5.0 * i, n if i else None)
    (run_dir / "server_metrics").mkdir(exist_ok=True)
    write_table_atomic(pa.Table.from_pydict(rows, schema=SERVER_METRICS_SCHEMA), run_dir / "server_metrics" / "part-000-000000.parquet")


def make_sweep(src_run: Path, sweep: Path) -> Path:
    """A sweep folder (interfaces.md layout) built from copies of one real run."""
    cells = [("tp1", {"tp": 1, "pp": 1, "dp": 1, "ep": 1, "dcp": 1, "pcp": 1, "gpus": 1}),
             ("tp2", {"tp": 2, "pp": 1, "dp": 1, "ep": 1, "dcp": 1, "pcp": 1, "gpus": 2})]  # fmt: skip
    for cell_id, cell in cells:
        for j, rate in enumerate((2.0, 4.0)):
            dst = sweep / f"cell={cell_id}" / f"load=rate-{rate:g}"
            shutil.copytree(src_run, dst)
            meta = read_run_meta(dst)
            meta = {k: v for k, v in meta.items() if not (k + "_json") in meta}
            meta["run_id"] = f"{cell_id}-r{rate:g}"
            extra = {"sweep_id": "s1", "cell": {**cell, "engine": "sim", "model": NASTY_MODEL, "gpu": "h100"},
                     "load": {"kind": "rate", "value": rate, "label": f"rate-{rate:g}"}, "repeat": 0, "saturated": False}  # fmt: skip
            meta["extra_json"] = json.dumps(extra)
            write_run_meta(dst, meta)
            if j == 0:
                add_server_metrics(dst)
    table = pa.table(
        {
            "cell_id": ["tp1", "tp2", "tp4"],
            "status": ["complete", "complete", "failed"],
            "reason": [None, None, "out of memory: <weights> don't fit"],
            "tp": [1, 2, 4], "pp": [1, 1, 1], "dp": [1, 1, 1], "gpus": [1, 2, 4],
            "engine": ["sim"] * 3, "model": [NASTY_MODEL] * 3, "gpu": ["h100"] * 3,
            "capacity_rps": [3.5, 7.9, None], "capacity_rps_per_gpu": [3.5, 3.95, None],
            "limiting_factor": ["queueing", "decode", None],
        }
    )  # fmt: skip
    write_table_atomic(table, sweep / "cells.parquet")
    pick = {"cell_id": "tp2", "gpus": 2, "capacity_rps": 7.9, "capacity_rps_per_gpu": 3.95,
            "evidence": {"load": "4 req/s", "requests": 60, "attainment": 0.95, "throughput_rps": 3.9, "ttft_p90_ms": 61.0,
                         "tpot_p90_ms": 9.5, "saturated": False, "runs": ["cell=tp2/load=rate-4"]}}
    configs = [{"cell_id": "tp1", "gpus": 1, "capacity_rps": 3.5, "upper_rps": 4.0, "capacity_rps_per_gpu": 3.5,
                "limiting_factor": "queueing", "diagnosis": "TTFT is mostly queue time: add replicas (DP) or admission control"},
               {"cell_id": "tp2", "gpus": 2, "capacity_rps": 7.9, "upper_rps": 8.5, "capacity_rps_per_gpu": 3.95,
                "limiting_factor": "decode", "diagnosis": "TPOT rises with load (decode-bound) <i>at 8.5 req/s</i>"}]
    rec = {"message": "tp2 (2 GPUs) is the smallest configuration meeting the SLOs at 4 req/s <b>bold?</b>",
           "recommendation": pick, "slo": {"ttft_ms": 80, "tpot_ms": 12}, "attainment_pct": 90.0,
           "workloads": {"default": {"configurations": configs, "recommendation": pick}}}  # fmt: skip
    (sweep / "recommendation.json").write_text(json.dumps(rec))
    (sweep / "sweep.json").write_text(json.dumps({"bench_version": "test"}))
    return sweep


def test_synthetic_run_reads_back(tmp_path: Path) -> None:
    from bench_llm.analysis.load import load_run
    from bench_llm.analysis.summary import summarize

    run = load_run(synthetic_run(tmp_path / "syn", 200, 8))
    s = summarize(run.requests)
    assert s.requests.ok == 200
    assert 60 < s.latency["ttft_ms"]["p50"] < 110
