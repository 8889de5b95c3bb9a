"""Helpers for the simulated-engine tests: run bench's own client against an in-process sim."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.analysis.load import load_run
from bench_llm.bench.execute import RunConfig, execute_run
from bench_llm.loadgen.runner import RunOptions
from bench_llm.loadgen.transport import Timeouts
from bench_llm.sim.server import ServerConfig, create_app, serve_in_process
from bench_llm.workloads.spec import RequestSpec, Schedule
from bench_llm.workloads.synthetic import SyntheticWorkload


def schedule(n: int, input_tokens: int = 16, output_tokens: int = 8, concurrency: int | None = 4,
             rate: float | None = None, seed: int = 0) -> Schedule:
    return SyntheticWorkload(requests=n, input_tokens=input_tokens, output_tokens=output_tokens,
                             concurrency=concurrency if rate is None else None, rate=rate, seed=seed).schedule()


def spaced(prompts: list[str], output_tokens: int, gap_ms: float = 20.0) -> Schedule:
    specs = tuple(
        RequestSpec(f"r{i:03d}", input_tokens=len(p.split()), max_output_tokens=output_tokens, prompt=p,
                    send_offset_ns=int(i * gap_ms * 1e6))
        for i, p in enumerate(prompts)
    )
    return Schedule("spaced", 0, "open", specs, rate=1000.0 / gap_ms)


def run_against(cfg: ServerConfig, sched: Schedule, tmp: Path, adapter: Any = None, stall_s: float = 5.0,
                engine: str = "sim", clock: str = "auto", fit_context: bool = True) -> list[dict[str, Any]]:
    """Serve ``cfg`` in-process, run ``sched`` with bench's runner, return the request rows
    (``fit_context=False``: send requests too long for the served context, to see the engine's answer)."""

    async def main() -> Path:
        async with serve_in_process(create_app(cfg)) as url:
            rc = RunConfig(out=tmp / "run", url=url, engine=engine, model=cfg.model, schedule=sched,
                           options=RunOptions(progress=False, drain_timeout_s=30.0), timeouts=Timeouts(stall=stall_s),
                           clock=clock, fit_context=fit_context)
            res = await execute_run(rc, adapter or OpenAIAdapter(model=cfg.model), install_signals=False)
            return res.run_dir

    run_dir = asyncio.run(main())
    return sorted(load_run(run_dir).requests.to_pylist(), key=lambda r: r["request_id"])
