"""Starting the embedded simulated engine as a subprocess for ``bench run``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench_llm.core.errors import BenchError
from bench_llm.launch.engines import SIM_FLAVORS
from bench_llm.launch.process import EngineStartError, ManagedProcess, free_port, python_module


def sim_flavor(engine: str) -> str:
    """The simulated engine's flavour speaking ``engine``'s API (``bench run --engine``):
    its own for sglang and tgi, vLLM's OpenAI-compatible one for the rest."""
    return engine if engine in SIM_FLAVORS else "vllm"


@contextlib.contextmanager
def embedded_engine(log_path: Path, sim_args: Sequence[str] = (), ready_timeout_s: float = 30.0) -> Iterator[str]:
    """Yield the base URL of a fresh simulated engine on 127.0.0.1; stop it on exit."""
    port = free_port()
    argv = python_module("bench_llm.bench", "sim", "serve", "--host", "127.0.0.1", "--port", str(port), *sim_args)
    proc = ManagedProcess(argv, log_path)
    proc.start()
    try:
        try:
            proc.wait_ready(f"http://127.0.0.1:{port}/health", ready_timeout_s)
        except EngineStartError as exc:
            raise BenchError(f"embedded engine failed to start: {exc}") from None
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()
