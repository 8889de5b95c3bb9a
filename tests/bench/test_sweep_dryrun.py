"""``bench sweep --dry-run``: every cell's argv, environment, GPU assignment and skip reason,
nothing started, the same text twice; each engine's argv uses only flags that engine documents
for the version targeted (docs/engines.md), and refusals are named."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from bench_llm.bench.sweep.dryrun import dry_run_lines
from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec
from tests.conftest import REPO

#: Long flags each engine documents, for the versions in docs/engines.md: vLLM 0.32
#: ``vllm serve`` (vllm/engine/arg_utils.py), SGLang ``sglang.launch_server``
#: (python/sglang/srt/server_args.py) and ``sglang_router.launch_router``, TGI 3.x
#: ``text-generation-launcher`` (launcher/src/main.rs). Only the flags these tests use.
DOCUMENTED = {
    "vllm": {
        "host", "port", "tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size",
        "enable-expert-parallel", "decode-context-parallel-size", "prefill-context-parallel-size",
        "max-num-seqs", "max-num-batched-tokens", "gpu-memory-utilization",
    },
    "sglang": {
        "model-path", "host", "port", "tp-size", "pp-size", "dp-size", "ep-size", "enable-metrics",
        "disaggregation-mode", "disaggregation-bootstrap-port", "max-running-requests", "mem-fraction-static",
        "schedule-conservativeness", "dcp-size",
    },
    "sglang-router": {"pd-disaggregation", "prefill", "decode", "host", "port"},
    "tgi": {
        "model-id", "hostname", "port", "num-shard", "sharded", "prometheus-port", "max-concurrent-requests",
        "cuda-memory-fraction",
    },
}  # fmt: skip


def _spec(engine: str, matrix: MatrixSpec, gpus: int = 4, **kw: object) -> SweepSpec:
    spec = SweepSpec(model="org/model", engine=engine, gpus=gpus, matrix=matrix, loads=LoadSpec(rates=(1.0,)), **kw)  # type: ignore[arg-type]
    spec.validate()
    return spec


def _flags(argv_line: str) -> set[str]:
    return {a[2:].split("=", 1)[0] for a in shlex.split(argv_line) if a.startswith("--")}


def _cells(lines: list[str]) -> dict[str, list[str]]:
    """cell id -> its lines (header first)."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in lines[1:]:
        if line.startswith("cell "):
            current = line[5:].split(":", 1)[0]
            out[current] = [line]
        else:
            out[current].append(line)
    return out


@pytest.fixture(autouse=True)
def _no_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_vllm_matrix_argv_gpus_env_and_skips() -> None:
    spec = _spec("vllm", MatrixSpec(tp=(1, 2), dp=(1, 2), flags={"max-num-seqs": ("8", "32")}), gpus=2)
    lines = dry_run_lines(spec)
    assert lines[0].endswith("8 cells (6 to run, 2 skipped); nothing was started")
    cells = _cells(lines)
    assert cells["tp2-dp2-max-num-seqs_8"] == ["cell tp2-dp2-max-num-seqs_8: 4 GPUs, skipped: needs 4 GPUs, 2 available"]
    head, proc, argv = cells["tp2-max-num-seqs_32"]
    assert head == "cell tp2-max-num-seqs_32: 2 GPUs"
    assert proc == "  engine: gpus 0,1; env CUDA_VISIBLE_DEVICES=0,1 VLLM_NO_USAGE_STATS=1 VLLM_SERVER_DEV_MODE=1"
    assert _flags(argv) <= DOCUMENTED["vllm"], _flags(argv) - DOCUMENTED["vllm"]
    assert "--tensor-parallel-size 2" in argv and argv.endswith("--max-num-seqs=32")
    assert "--port 8000" in argv
    assert "--data-parallel-size 2" in cells["tp1-dp2-max-num-seqs_8"][2]


def test_sglang_disagg_and_refused_flags_by_name() -> None:
    spec = _spec(
        "sglang", MatrixSpec(tp=(1,), dcp=(1,), disagg=("1:1",), flags={"max-running-requests": ("16",)}),
        engine_env=("HF_TOKEN",),
    )  # fmt: skip
    (cell,) = _cells(dry_run_lines(spec)).values()
    roles = [line.split(":", 1)[0].strip() for line in cell[1::2]]
    assert roles == ["prefill", "decode", "router"]
    assert "gpus 0;" in cell[1] and "gpus 1;" in cell[3] and "gpus -;" in cell[5]  # disjoint GPUs, router none
    assert "HF_TOKEN=***" in cell[1] and "hf_secret" not in "\n".join(cell)
    for argv in (cell[2], cell[4]):
        assert _flags(argv) <= DOCUMENTED["sglang"], _flags(argv) - DOCUMENTED["sglang"]
        assert "--max-running-requests=16" in argv
    assert _flags(cell[6]) <= DOCUMENTED["sglang-router"]
    # vLLM's name for the batch limit is refused by name, and dcp before SGLang 0.5.21 with the version
    lines = dry_run_lines(_spec("sglang", MatrixSpec(tp=(2,), dcp=(2,), flags={"max-num-seqs": ("8",)}),
                                engine_version="0.5.8"))  # fmt: skip
    assert lines[1] == (
        "cell tp2-dcp2-max-num-seqs_8: 2 GPUs, skipped: sglang does not support it: SGLang has no --max-num-seqs; "
        "its max running requests flag is --max-running-requests; SGLang 0.5.8 has no decode context parallelism "
        "(--dcp-size arrived in 0.5.21)"
    )


def test_tgi_argv_and_refusals() -> None:
    spec = _spec("tgi", MatrixSpec(tp=(1, 2), dp=(1, 2), flags={"cuda-memory-fraction": ("0.8",)}))
    cells = _cells(dry_run_lines(spec))
    argv = cells["tp2-cuda-memory-fraction_0.8"][2]
    assert _flags(argv) <= DOCUMENTED["tgi"], _flags(argv) - DOCUMENTED["tgi"]
    # --prometheus-port exists from TGI 3.3.0 on: left out while the version is unknown (docs/engines.md)
    assert "--num-shard 2 --sharded true" in argv and "--prometheus-port" not in argv
    known = _cells(dry_run_lines(_spec("tgi", MatrixSpec(tp=(2,)), engine_version="3.3.0")))
    assert "--prometheus-port 8001" in next(iter(known.values()))[2]
    assert "TGI has no data parallelism" in cells["tp1-dp2-cuda-memory-fraction_0.8"][0]
    refused = _cells(dry_run_lines(_spec("tgi", MatrixSpec(flags={"gpu-memory-utilization": ("0.8",)}))))
    assert "TGI has no --gpu-memory-utilization; its KV memory fraction flag is --cuda-memory-fraction" in next(
        iter(refused.values())
    )[0]


def test_cli_dry_run_is_stable_and_starts_nothing(tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "bench_llm.bench", "sweep", "--dry-run", "--engine", "sim", "--model", "llama-3.1-8b",
        "--tp", "1,2", "--axis", "max-num-seqs=8,32", "--axis", "kv-cache-dtype=fp8", "--rate", "1",
    ]  # fmt: skip
    runs = [subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60) for _ in range(2)]
    assert runs[0].returncode == 0, runs[0].stderr
    assert runs[0].stdout == runs[1].stdout
    assert list(tmp_path.iterdir()) == []  # no sweep folder, no files
    out = runs[0].stdout
    assert "4 cells (0 to run, 4 skipped)" in out
    assert "the simulated engine has no KV cache dtype flag (--kv-cache-dtype)" in out
    ok = subprocess.run(cmd[:-4] + ["--rate", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "--max-num-seqs=32" in ok.stdout and "--tp 2" in ok.stdout and "gpus -;" in ok.stdout
    assert REPO.exists()
