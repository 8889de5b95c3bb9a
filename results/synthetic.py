"""A synthetic run folder: requests with lognormal TTFT and token gaps, written without an
engine, for sizing the report (benchmarks/report_size.py) and for tests of the readers,
analysis and report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench_llm.results.schema import REQUESTS_SCHEMA
from bench_llm.results.writer import write_run_meta, write_table_atomic


def synthetic_run(run_dir: Path, n: int, tokens: int, seed: int = 0, scale: float = 1.0, extra: dict[str, Any] | None = None) -> Path:
    """A run folder with ``n`` requests of ``tokens`` single-token chunks (open loop, 50 req/s).

    ``scale`` multiplies every latency (TTFT and each token gap): 1.15 is a 15 % slower engine.
    """
    rng = np.random.default_rng(seed)
    intended = np.cumsum(rng.exponential(1 / 50, n) * 1e9).astype(np.int64) + 10**12
    send = intended + rng.integers(10_000, 200_000, n)
    ttft = rng.lognormal(np.log(80e6), 0.3, n).astype(np.int64)
    gaps = rng.lognormal(np.log(12e6), 0.25, (n, tokens)).astype(np.int64)
    gaps[:, 0] = ttft
    gaps = (gaps * scale).astype(np.int64)
    chunk = send[:, None] + np.cumsum(gaps, axis=1)
    offsets = np.arange(0, n * tokens + 1, tokens, dtype=np.int32)
    chunk_ns = pa.ListArray.from_arrays(pa.array(offsets), pa.array(chunk.ravel()))
    chunk_tk = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.ones(n * tokens, dtype=np.int32)))
    cols = {
        "run_id": pa.array(["synthetic"] * n),
        "request_id": pa.array([f"r{i:07d}" for i in range(n)]),
        "phase": pa.array(["measure"] * n),
        "worker_id": pa.array(np.zeros(n, np.int32)),
        "intended_send_ns": pa.array(intended),
        "send_ns": pa.array(send),
        "first_byte_ns": pa.array(send + ttft // 2),
        "first_token_ns": pa.array(chunk[:, 0]),
        "first_content_ns": pa.array(chunk[:, 0]),
        "end_ns": pa.array(chunk[:, -1] + 100_000),
        "chunk_ns": chunk_ns,
        "chunk_tokens": chunk_tk,
        "output_tokens": pa.array(np.full(n, tokens, np.int32)),
        "token_source": pa.array(["server_cumulative"] * n),
        "input_tokens_target": pa.array(np.full(n, 256, np.int32)),
        "max_output_tokens": pa.array(np.full(n, tokens, np.int32)),
        "ok": pa.array(np.ones(n, bool)),
    }
    table = pa.table({f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in REQUESTS_SCHEMA}, schema=REQUESTS_SCHEMA)
    (run_dir / "requests").mkdir(parents=True, exist_ok=True)
    write_table_atomic(table, run_dir / "requests" / "part-000-000000.parquet")
    write_run_meta(
        run_dir,
        {"run_id": f"synthetic-{run_dir.name}", "schema_version": "1.0", "bench_version": "test", "status": "complete",
         "engine": "synthetic", "model": "m", "config_json": {"slo": {"ttft_ms": 200, "tpot_ms": 20}}, "extra_json": extra},
    )  # fmt: skip
    return run_dir
