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
import pytest

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
    cmd = [sys.executable, "-m", "bench_llm.bench", "sweep", "--engine", "vllm", "--model", "m", "--tp", "1", "--disagg", "1:1",
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


def test_dry_run_of_a_vllm_pd_cell_prints_each_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench_llm.bench.sweep.dryrun import dry_run_lines
    from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("BENCH_VLLM_PYTHON", "/opt/vllm/bin/python")
    spec = SweepSpec(model="org/m", engine="vllm", gpus=3, matrix=MatrixSpec(tp=(1,), disagg=("1:2",)),
                     loads=LoadSpec(rates=(1.0,)))  # fmt: skip
    spec.validate()
    lines = dry_run_lines(spec)
    assert lines == dry_run_lines(spec)  # stable: two dry runs diff clean
    assert lines[1] == "cell tp1-disagg1x2: 3 GPUs"
    roles = [line.split(":", 1)[0].strip() for line in lines[2::2]]
    assert roles == ["prefill", "decode", "decode", "proxy"]
    envs, argvs = lines[2::2], lines[3::2]
    assert [e.split(";")[0].split()[-1] for e in envs] == ["0", "1", "2", "-"]
    sides = [e.split("VLLM_NIXL_SIDE_CHANNEL_PORT=")[1].split()[0] for e in envs[:3]]
    assert len(set(sides)) == 3
    assert all("--kv-transfer-config" in a and " serve org/m " in a for a in argvs[:3])
    assert "launch.vllm_pd_proxy --host 127.0.0.1 --port 8000 --prefill" in argvs[3]
