"""Does a reported capacity hold when tested? (issue 32's "Done when" table and seed coverage)

For the README main job (70B, 4 simulated H100s, TP2/TP4/TP2xDP2, 128/16 tokens) and the chat
sweep (8B, 2 H100s, TP1/TP2, ``--workload chat``), in virtual time (deterministic):

1. runs the capacity sweep and reads each configuration's reported capacity C;
2. runs ``bench run --launch --engine sim`` with 4,000 requests at C (workload seed 0, as a
   user re-running the answer would) and prints its attainment: it must be at least the
   target minus 5 points;
3. bisects, with 4,000-request runs, the highest rate R at which such a run meets the target
   (between C and 1.6 C; assumes attainment falls with rate) and prints C / R: it must be at
   least 0.85 (the sweep is not too cautious either).

``--seeds 0-7`` adds the coverage of the printed intervals: the sweep again at each workload
seed; for every pair of seeds (i, j), does seed i's printed interval [interval_low,
interval_high) (in virtual time the 90 % prediction interval over the sweep's own repeat
searches, analysis/capacity_repeats.py) hold seed j's capacity? Prints the share per job
(docs/sweeps.md, Measured coverage). Each sweep repeats its searches on two more seeds, so a
seed costs about three searches of CPU (the README job about 30 s, the chat sweep minutes).

    python benchmarks/capacity_verdict.py                 # the table (a few minutes of CPU)
    python benchmarks/capacity_verdict.py --seeds 0-7     # and the coverage (more minutes)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_llm.analysis.load import load_run  # noqa: E402
from bench_llm.analysis.metrics import measured, request_metrics  # noqa: E402
from bench_llm.analysis.slo import SLO  # noqa: E402
from bench_llm.analysis.slo_judge import slo_outcomes  # noqa: E402
from bench_llm.bench.sweep.store import read_cells  # noqa: E402
from bench_llm.results.sweep_layout import RECOMMENDATION_FILE  # noqa: E402

JOBS = {
    "readme": {
        "model": "llama-3.1-70b", "gpus": "4", "axes": ["--tp", "2,4", "--dp", "1,2"],
        "slo": "ttft_ms=300,tpot_ms=40", "workload": ["--input-tokens", "128", "--output-tokens", "16"],
        "sweep_extra": ["--target-rate", "38", "--engine-arg=--max-num-seqs=8"],
        "run_extra": ["--engine-arg=--max-num-seqs=8"],
    },
    "chat": {
        "model": "llama-3.1-8b", "gpus": "2", "axes": ["--tp", "1,2"],
        "slo": "ttft_ms=500,tpot_ms=50", "workload": ["--workload", "chat"], "sweep_extra": [], "run_extra": [],
    },
}  # fmt: skip
TARGET = 90.0
REQUESTS = 4000


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench_llm.bench", *args], cwd=ROOT, capture_output=True, text=True)


def sweep(job: dict, out: Path, seed: int) -> dict[str, dict]:
    """cell id -> {"capacity", "upper", "low", "tp", "dp", "confirmation"} of a capacity sweep
    (run unless ``out`` holds it already: ``--keep``)."""
    if (out / RECOMMENDATION_FILE).exists():
        return stored(out)
    r = bench("sweep", "--engine", "sim", "--model", job["model"], "--gpu", "h100", "--gpus", job["gpus"],
              *job["axes"], "--capacity", "--slo", job["slo"], *job["workload"], *job["sweep_extra"],
              "--seed", str(seed), "--no-progress", "--out", str(out))  # fmt: skip
    if r.returncode not in (0, 4):
        raise SystemExit(f"sweep failed ({r.returncode}): {r.stderr[-2000:]}")
    cells = {}
    for c in read_cells(out):
        if c["status"] != "complete":
            continue
        cap = next(iter(json.loads(c["capacity_json"]).values()))
        cells[c["cell_id"]] = {"capacity": cap["capacity_rps"], "upper": cap["upper_rps"], "tp": c["tp"],
                               "low": cap.get("interval_low_rps"), "dp": c["dp"],
                               "high": cap.get("interval_high_rps"),
                               "confirmation": cap.get("confirmation")}  # fmt: skip
    return cells


def stored(out: Path) -> dict[str, dict]:
    """A stored sweep's cells as ``sweep`` returns them, its interval re-judged from its
    Parquet files by this checkout's ``bench recommend`` (the capacity as the sweep found it)."""
    from bench_llm.analysis.recommend import recommend

    cells = {}
    rec = recommend(out)
    confs = {c.cell_id: c for w in rec.workloads.values() for c in w.configurations}
    for c in read_cells(out):
        if c["status"] != "complete" or c["cell_id"] not in confs:
            continue
        cap = next(iter(json.loads(c["capacity_json"]).values()))
        cells[c["cell_id"]] = {"capacity": cap["capacity_rps"], "upper": cap["upper_rps"], "tp": c["tp"],
                               "low": confs[c["cell_id"]].capacity.interval_low_rps, "dp": c["dp"],
                               "high": confs[c["cell_id"]].capacity.interval_high_rps,
                               "confirmation": cap.get("confirmation")}  # fmt: skip
    return cells


def attainment(job: dict, cell: dict, rate: float, out: Path) -> float:
    """Share of a 4,000-request run at ``rate`` (workload seed 0) meeting every SLO."""
    r = bench("run", "--launch", "--engine", "sim", "--model", job["model"], "--gpu", "h100",
              "--parallel", f"tp={cell['tp']},dp={cell['dp']}", *job["workload"], *job["run_extra"],
              "--rate", f"{rate:g}", "--requests", str(REQUESTS), "--slo", job["slo"], "--out", str(out))  # fmt: skip
    if r.returncode not in (0, 4):
        raise SystemExit(f"run failed ({r.returncode}): {r.stderr[-2000:]}")
    df = request_metrics(measured(load_run(out).requests))
    return float(slo_outcomes(df, SLO.parse(job["slo"]))["met"].mean())


def highest_passing(job: dict, cell: dict, low: float, tmp: Path, steps: int = 6) -> float:
    """The highest rate (to ~1 %) at which a 4,000-request run meets TARGET, from ``low`` up."""
    lo, hi = low, 1.6 * low
    if attainment(job, cell, lo, tmp / f"lo-{lo:g}") * 100 < TARGET:
        lo, hi = 0.5 * low, low
    for _ in range(steps):
        mid = round((lo + hi) / 2, 3)
        if attainment(job, cell, mid, tmp / f"r-{mid:g}") * 100 >= TARGET:
            lo = mid
        else:
            hi = mid
    return lo


def done_when(tmp: Path) -> bool:
    ok = True
    print(f"{'job':8} {'cell':9} {'capacity':>9} {'interval':>17} {'confirmed':>10} {'4000 @ C':>9} "
          f"{'best R':>8} {'C/R':>6}  verdict")  # fmt: skip
    for name, job in JOBS.items():
        t0 = time.monotonic()
        cells = sweep(job, tmp / f"{name}-sweep", 0)
        for cid, cell in cells.items():
            cap = cell["capacity"]
            if cap is None:
                print(f"{name:8} {cid:9} {'none':>9}")
                continue
            att = attainment(job, cell, cap, tmp / f"{name}-{cid}-at-cap")
            best = highest_passing(job, cell, cap, tmp / f"{name}-{cid}")
            good = att * 100 >= TARGET - 5 and cap >= 0.85 * best
            ok &= good
            conf = cell["confirmation"]
            conf_txt = f"{100 * conf['attainment']:.1f}%" if conf else "-"
            upper = f"{cell.get('high') or cell['upper']:g}" if (cell.get("high") or cell["upper"]) else "-"
            low = f"{cell['low']:g}" if cell["low"] else "-"
            print(f"{name:8} {cid:9} {cap:9g} {f'[{low}, {upper})':>17} {conf_txt:>10} {100 * att:8.1f}% "
                  f"{best:8g} {cap / best:6.2f}  {'ok' if good else 'FAIL'}")  # fmt: skip
        print(f"# {name}: {time.monotonic() - t0:.0f} s wall for the sweep and the runs")
    return ok


def coverage(tmp: Path, seeds: list[int]) -> None:
    """For every ordered pair of seeds (i, j): does seed i's printed interval [low, upper)
    hold seed j's capacity? And the probe bracket [capacity, upper), for comparison."""
    for name, job in JOBS.items():
        t0 = time.monotonic()
        per_seed = {s: sweep(job, tmp / f"{name}-seed{s}", s) for s in seeds}
        hits = bracket_hits = total = 0
        for cid in per_seed[seeds[0]]:
            caps = {s: per_seed[s].get(cid, {}).get("capacity") for s in seeds}
            line = []
            for i in seeds:
                c = per_seed[i].get(cid, {})
                cap, low, up = c.get("capacity"), c.get("low"), c.get("upper")
                high = c.get("high") if c.get("high") is not None else up
                top = high if high is not None else np.inf
                bracket_top = up if up is not None else np.inf
                line.append(f"{cap:g} [{low if low is not None else '-'}, {high if high is not None else 'inf'})"
                            if cap is not None else "none")  # fmt: skip
                for j in seeds:
                    if i == j or cap is None or caps[j] is None:
                        continue
                    total += 1
                    hits += (low if low is not None else cap) <= caps[j] < top
                    bracket_hits += cap <= caps[j] < bracket_top
            print(f"{name} {cid}: capacity [interval) by seed: " + "; ".join(line))
        print(f"{name}: the printed interval holds another seed's capacity in {hits} of {total} pairs "
              f"({100 * hits / max(total, 1):.0f}%); the bracket [capacity, upper) in {bracket_hits} "
              f"({100 * bracket_hits / max(total, 1):.0f}%); {time.monotonic() - t0:.0f} s")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", help="e.g. 0-7: also measure the intervals' coverage across workload seeds")
    ap.add_argument("--job", choices=sorted(JOBS), action="append", help="only this job (repeatable)")
    ap.add_argument("--no-table", action="store_true", help="skip the 4,000-request table (coverage only)")
    ap.add_argument("--keep", type=Path, help="keep the sweeps in this folder; a sweep found there is re-judged, not re-run")
    args = ap.parse_args()
    for name in [n for n in JOBS if args.job and n not in args.job]:
        del JOBS[name]
    with tempfile.TemporaryDirectory() as d:
        tmp = args.keep or Path(d)
        tmp.mkdir(parents=True, exist_ok=True)
        ok = True if args.no_table else done_when(tmp)
        if args.seeds:
            a, _, b = args.seeds.partition("-")
            coverage(tmp, list(range(int(a), int(b or a) + 1)))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
