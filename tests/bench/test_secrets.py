"""API keys never reach results, logs or reports."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import bench_argv

SECRET = "sk-bench-test-0123456789abcdef"


def test_api_key_from_env_or_file_never_written(tmp_path: Path) -> None:
    env = {**os.environ, "OPENAI_API_KEY": SECRET}
    out = tmp_path / "run"
    p = subprocess.run(
        bench_argv("run", "--concurrency", "2", "--requests", "4", "--output-tokens", "4", "--save-text",
                   "--out", str(out), "--no-progress"),
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert p.returncode == 0, p.stderr
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    out2 = tmp_path / "run2"
    p2 = subprocess.run(
        bench_argv("run", "--concurrency", "2", "--requests", "4", "--output-tokens", "4",
                   "--api-key-file", str(key_file), "--out", str(out2), "--no-progress"),
        capture_output=True, text=True, timeout=120,
    )
    assert p2.returncode == 0, p2.stderr
    report = tmp_path / "report.html"
    p3 = subprocess.run(bench_argv("report", str(out), "-o", str(report)), capture_output=True, text=True, timeout=120)
    assert p3.returncode == 0, p3.stderr
    for text in (p.stdout, p.stderr, p2.stdout, p2.stderr, p3.stdout, p3.stderr):
        assert SECRET not in text
    files = [f for d in (out, out2) for f in d.rglob("*") if f.is_file()] + [report]
    assert len(files) > 4
    for f in files:
        assert SECRET.encode() not in f.read_bytes(), f
        if f.suffix == ".parquet" and not f.name.startswith("."):
            # Parquet pages are compressed: look at the decoded values too.
            table = pq.read_table(f)
            assert SECRET not in str(table.schema.metadata or {}), f
            for col in table.columns:
                if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                    assert not any(SECRET in v for v in col.to_pylist() if v), (f, col)
