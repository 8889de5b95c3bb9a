"""A vLLM prefill/decode cell swept end to end: bench launches a prefill and a decode instance
(a fake ``vllm`` program speaking vLLM 0.32's KV hand-off, tests/fake_vllm.py) and its own proxy,
measures a load through the proxy, records every process, and tears the cell down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from tests.conftest import REPO


def test_sweep_measures_a_vllm_pd_cell_through_the_proxy(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
                    "from tests.fake_vllm import main\nmain(sys.argv[1:])\n")  # fmt: skip
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "BENCH_VLLM_PYTHON"}
    env["PATH"] = f"{fake.parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO)
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "bench", "sweep", "--engine", "vllm", "--model", "m", "--tp", "1", "--disagg", "1:1",
           "--gpus", "2", "--concurrency", "2", "--requests", "10", "--input-tokens", "8", "--output-tokens", "4",
           "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (cell,) = pq.read_table(out / "cells.parquet").to_pylist()
    assert cell["status"] == "complete" and cell["disagg"] == "1:1" and cell["gpus"] == 2
    info = json.loads(cell["engine_info"])
    assert [p["role"] for p in info["processes"]] == ["prefill", "decode", "proxy"]
    assert [p["cuda_visible_devices"] for p in info["processes"]] == ["0", "1", None]
    assert cell["engine_version"] == "0.32.0-fake"  # the decode instance's /version, through the proxy
    rows = pq.read_table(out / "cell=tp1-disagg1x1" / "load=conc-2" / "requests").to_pylist()
    measured = [r for r in rows if r["phase"] != "warmup"]
    assert len(measured) >= 10 and all(r["ok"] for r in rows)
    assert all(r["output_tokens"] == 4 and r["token_source"] == "server_cumulative" for r in rows)
    # every request was decoded from the prefill instance's KV (the hand-off), none prefilled on decode
    decode_log = (out / "cell=tp1-disagg1x1" / "engine.decode1.log").read_text()
    assert decode_log.count("decode kv") == len(rows) and "nokv" not in decode_log
