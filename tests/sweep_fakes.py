"""Test doubles for sweep orchestration: a launcher that starts the fixed-timing embedded
engine (fast, no performance model) and can be told to fail chosen cells."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench_llm.bench.sweep.engines import CellEngine
from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.process import EngineStartError, ManagedProcess, free_port


@dataclass
class FixedSimHandle:
    url: str
    log_path: Path
    proc: ManagedProcess
    argv: list[str]
    version: str | None = "fixed-sim"

    def stop(self) -> None:
        self.proc.stop()


@dataclass
class FixedSimLauncher:
    """Starts ``bench sim serve`` (fixed timing) for every cell; ``bad_cells`` get an argument
    that makes the engine exit during start-up."""

    ttft_ms: float = 20.0
    itl_ms: float = 2.0
    bad_cells: tuple[str, ...] = ()
    #: cell -> load label: the engine is killed as soon as that load's run folder appears
    crash_at: dict[str, str] = field(default_factory=dict)
    refuse: dict[str, str] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)
    #: more ``bench sim serve`` arguments for every cell (e.g. a flavour)
    extra_argv: tuple[str, ...] = ()

    def unsupported(self, engine: str, parallel: ParallelConfig) -> list[str]:
        reason = self.refuse.get(parallel.cell_id)
        return [reason] if reason else []

    def start(self, cell: CellEngine, log_path: Path) -> FixedSimHandle:
        port = free_port()
        argv = [
            sys.executable, "-m", "bench_llm.bench", "sim", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--model", cell.model, "--ttft-ms", str(self.ttft_ms), "--itl-ms", str(self.itl_ms),
            *self.extra_argv,
        ]  # fmt: skip
        if cell.parallel.cell_id in self.bad_cells:
            argv.append("--no-such-option-for-this-test")
        proc = ManagedProcess(argv, log_path)
        proc.start()
        self.started.append(cell.parallel.cell_id)
        try:
            proc.wait_ready(f"http://127.0.0.1:{port}/health", 30.0)
        except EngineStartError:
            proc.stop()
            raise
        label = self.crash_at.get(cell.parallel.cell_id)
        if label:
            target = log_path.parent / f"load={label}" / "run.parquet"

            def crash() -> None:
                deadline = time.monotonic() + 120
                while not target.exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
                with open(log_path, "a") as f:
                    f.write("simulated crash: engine killed by the test\n")
                proc.stop(grace_s=0.0)

            threading.Thread(target=crash, daemon=True).start()
        return FixedSimHandle(f"http://127.0.0.1:{port}", log_path, proc, argv)
