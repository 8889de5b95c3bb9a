"""bench trend on constructed histories of nightly runs of the simulated engine.

Usage::

    python benchmarks/trend_history.py [--clock virtual|real] [--histories 10] [--runs 30] [--at 20]
                                       [--revert-after K] [--copies N] [--keep DIR] [--reuse DIR]

Each history: the simulated engine (Llama-3.1-8B on an H100, modelled timing, 3 % step
jitter), with --slowdown 1.10 (every step 10 % slower) from nightly run REGRESSION_AT on.
Nightly run i (1-based, its own workload and engine seed) is added to a results store as
commit i, and `bench trend` (ci/gates-sim.toml's metrics and allowances) runs over the 30
commits. Prints, per history, the change points, then the totals: histories where run
REGRESSION_AT (±1) is flagged, and false alarms (flagged change points anywhere else). The
target (issue 23): every history flags run 20 and at most one false alarm over 10 histories.
Each history is also replayed night by night (the series cut after each night): the first
night the TPOT regression is flagged and the commit it names (issue 38). ``--revert-after K``:
the regression is fixed after K nights (both edges scored); ``--copies N``: the first
history's nights copied N times under new commits (the issue's 300-night store, 2N - 1 edges).

``--clock virtual`` (the default) runs each night as a user's nightly sim gate would: `bench
run --launch --engine sim` in virtual time, deterministic given the seeds, so the history holds
the engine's modelled noise (step jitter, workload) and nothing of this host. ``--clock real``
runs two live `bench sim serve` engines (normal and slowed) on this host: the history then
also holds the host's load, which moves TTFT and throughput by tens of % on a shared machine.
``--keep DIR`` keeps the stores; ``--reuse DIR`` computes every night's entry again from the
run folders of kept stores (no runs), to try the detector on the same measured histories.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from click.testing import CliRunner  # noqa: E402

from bench_llm.analysis.gate import load_gate_config  # noqa: E402
from bench_llm.analysis.history import entries, load_series  # noqa: E402
from bench_llm.analysis.slo import SLO  # noqa: E402
from bench_llm.analysis.trend import TrendOptions, detect, run_trend  # noqa: E402
from bench_llm.bench.cli import cli  # noqa: E402
from bench_llm.core.control import EngineClient  # noqa: E402
from bench_llm.results.history import Partition, add_entry, config_slug  # noqa: E402

GATES = REPO / "ci" / "gates-sim.toml"
MODEL = "llama-3.1-8b"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_sim(slowdown: float, seed: int) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    argv = [sys.executable, "-m", "bench_llm.bench", "sim", "serve", "--port", str(port), "--timing", "model", "--model-preset", MODEL,
            "--gpu", "h100", "--jitter", "0.03", "--seed", str(seed), "--slowdown", str(slowdown)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if EngineClient(url, timeout_s=1).get("/v1/models").ok:
            return proc, url
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the simulated engine did not start")


WORKLOAD = ["--model", MODEL, "--requests", "48", "--concurrency", "8", "--input-tokens", "256", "--output-tokens", "24",
            "--no-progress", "--slo", "ttft_ms=500,tpot_ms=50"]  # fmt: skip


def nightly(target: list[str], out: Path, seed: int) -> None:
    """One `bench run`, in this process (an interpreter start per run would triple the time)."""
    res = CliRunner().invoke(cli, ["run", *target, *WORKLOAD, "--seed", str(seed), "--out", str(out)])
    if res.exit_code != 0:
        raise RuntimeError(f"bench run failed: {res.output[-500:]}")


def virtual_target(slowdown: float, seed: int) -> list[str]:
    """`bench run` arguments for the simulated engine in virtual time (what `bench sim serve`
    would model, the same rows for the same seeds on any host)."""
    sim = ["--jitter", "0.03", "--slowdown", f"{slowdown:g}", "--seed", str(seed)]
    return ["--launch", "--engine", "sim", "--gpu", "h100", "--clock", "virtual", *(f"--engine-arg={a}" for a in sim)]


def record(store: Path, runs: int, at: int, root: Path, seed: int, clock: str, order: str, until: int | None = None) -> None:
    cfg = load_gate_config(GATES)
    slo = SLO.from_dict(cfg.gate.slo)
    engines = (start_sim(1.0, seed), start_sim(1.10, seed)) if clock == "real" else ()
    nights = list(range(1, runs + 1))
    if order == "shuffled":
        random.Random(seed).shuffle(nights)
    try:
        for i in nights:
            out = root / f"h{seed}-run{i:02d}"
            slowdown = 1.10 if at <= i and (until is None or i < until) else 1.0
            if clock == "real":
                target = ["--url", engines[slowdown > 1][1]]
            else:
                target = virtual_target(slowdown, 1000 * seed + i)
            nightly(target, out, 1000 * seed + i)
            day = (_dt.date(2026, 1, 1) + _dt.timedelta(days=i - 1)).isoformat()
            for e in entries(out, list(cfg.metrics), slo):
                add_entry(store, Partition(day, f"c{i:02d}", config_slug(e.config_key)), e.entry_id, e.rows, [r.path for r in e.runs])
            shutil.rmtree(out)
    finally:
        for proc, _ in engines:
            proc.terminate()
            proc.wait(timeout=30)


def rebuild(kept: Path, store: Path) -> None:
    """A store with every night's entry computed again, by this code, from the run folders a
    kept store holds (so --reuse sees metrics added since the histories were recorded)."""
    cfg = load_gate_config(GATES)
    slo = SLO.from_dict(cfg.gate.slo)
    for run_dir in sorted(kept.glob("runs/date=*/commit=*/config=*/run=*")):
        day, commit, config = (run_dir.parents[i].name.split("=", 1)[1] for i in (2, 1, 0))
        for e in entries(run_dir, list(cfg.metrics), slo):
            add_entry(store, Partition(day, commit, config), e.entry_id, e.rows, [r.path for r in e.runs])


def first_night(store: Path, at: int, seed: int) -> tuple[int, str, str]:
    """Replay the history night by night (each series cut after night n) and return the first
    night the TPOT regression is flagged, what it names as the culprit and whether that is
    the right commit ("right", "uncertain, right one in the span", "WRONG"); (0, "", "") when
    never."""
    cfg = load_gate_config(GATES)
    series = [s for s in load_series(store, ["tpot_p50_ms"]).series]
    for night in range(at, max(len(s.points) for s in series) + 1):
        cut = [replace(s, points=s.points[:night]) for s in series]
        for f in detect(cut, dict(cfg.metrics), TrendOptions(seed=seed)):
            if f.flagged and abs(f.index + 1 - at) <= 3:
                lo, hi = f.span
                verdict = ("right" if f.index + 1 == at else "WRONG") if f.certain else ("uncertain, right one in the span" if lo <= at <= hi else "WRONG span")
                return night, f.where, verdict
    return 0, "", ""


def history(seed: int, at: int, store: Path, until: int | None = None) -> tuple[int, list[tuple[str, int]], list[str]]:
    cfg = load_gate_config(GATES)
    result = run_trend(store, dict(cfg.metrics), list(cfg.metrics), TrendOptions(seed=seed))
    lines = [f"{f.metric} at run {f.index + 1}: {f.verdict} {100 * f.change.rel_change:+.1f}% (p={f.change.p_value:.3f})" for f in result.findings]
    night, where, verdict = first_night(store, at, seed)
    lines.append(f"nightly replay: TPOT regression first flagged on night {night}, naming {where}: {verdict}" if night else "nightly replay: never flagged")
    edges = [at] + ([until] if until else [])
    hit = int(all(any(abs(f.index + 1 - e) <= 1 and f.metric == "tpot_p50_ms" for f in result.flagged) for e in edges))
    false = [(f.metric, f.index + 1) for f in result.flagged if all(abs(f.index + 1 - e) > 1 for e in edges)]
    return hit, false, lines


def copies(kept: Path, n: int, at: int, out: Path) -> str:
    """The issue's 300-night store: the nights of one kept history copied ``n`` times under new
    commits and dates (so TPOT steps up at night ``at`` of each copy and back down at the start
    of the next: 2n - 1 edges), then trend over it; returns the score line."""
    import pyarrow.parquet as pq

    runs = len({p.parent.parent.name for p in kept.glob("metrics/date=*/commit=*/config=*/*.parquet")})
    for path in sorted(kept.glob("metrics/date=*/commit=*/config=*/*.parquet")):
        night = int(path.parent.parent.name.split("=c", 1)[1])
        rows = pq.read_table(path)
        for k in range(n):
            i = k * runs + night
            day = (_dt.date(2026, 1, 1) + _dt.timedelta(days=i - 1)).isoformat()
            add_entry(out, Partition(day, f"n{i:04d}", path.parent.name.split("=", 1)[1]), path.stem, rows, [])
    cfg = load_gate_config(GATES)
    result = run_trend(out, dict(cfg.metrics), ["tpot_p50_ms"], TrendOptions())
    edges = [k * runs + at for k in range(n)] + [k * runs + 1 for k in range(1, n)]
    found = [f.index + 1 for f in result.flagged]
    hit = sum(e in found for e in edges)
    near = sum(any(abs(f - e) <= 1 for f in found) for e in edges)
    false = sum(all(abs(f - e) > 1 for e in edges) for f in found)
    return f"{n} copies ({n * runs} nights), TPOT: {hit} of {len(edges)} edges flagged at their commit ({near} within ±1), {false} false"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clock", choices=("virtual", "real"), default="virtual")
    ap.add_argument("--histories", type=int, default=10)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--at", type=int, default=20, help="first nightly run of the slowed engine (1-based)")
    ap.add_argument("--revert-after", type=int, help="the regression is fixed after this many nights (a reverted change: "
                                                      "its second edge, an improvement, is scored too)")
    ap.add_argument("--order", choices=("sequential", "shuffled"), default="sequential",
                    help="record the nights in order, or in a seeded random order (each night's place in the history "
                         "is its number either way): shuffled, the host's load changes of the minutes the benchmark "
                         "takes fall on random nights, as on nights a day apart, instead of on a run of consecutive ones")
    ap.add_argument("--keep", type=Path, help="keep the results stores in this folder")
    ap.add_argument("--reuse", type=Path, help="read the stores kept in this folder (no runs)")
    ap.add_argument("--copies", type=int, help="also copy the first history's nights this many times under new commits "
                                                "(a reverted step per copy) and trend over that store")
    args = ap.parse_args()
    n_hist, runs, at = args.histories, args.runs, args.at
    hits = host = 0
    false: list[tuple[int, str, int]] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-trend-") as tmp:
        for seed in range(n_hist):
            if args.reuse is not None:
                store = Path(tmp) / f"store-{seed}"
                rebuild(args.reuse / f"store-{seed}", store)
            else:
                store = (args.keep or Path(tmp)) / f"store-{seed}"
                until = at + args.revert_after if args.revert_after else None
                record(store, runs, at, Path(tmp), seed, args.clock, args.order, until)
            h, f, lines = history(seed, at, store, at + args.revert_after if args.revert_after else None)
            host += sum(" host change " in line for line in lines)
            hits += h
            false += [(seed, metric, run) for metric, run in f]
            print(f"history seed={seed}: run {at} flagged: {'yes' if h else 'NO'}; false alarms {len(f)}", flush=True)
            for line in lines:
                print(f"    {line}", flush=True)
        first = Path(tmp) / "store-0" if args.reuse is not None else (args.keep or Path(tmp)) / "store-0"
        copied = copies(first, args.copies, at, Path(tmp) / "copies") if args.copies else ""
    source = f"stores in {args.reuse}" if args.reuse else f"clock {args.clock}, nights recorded {args.order}"
    print(f"\n{n_hist} histories of {runs} nightly runs ({source}), 10 % TPOT regression (--slowdown 1.10) from run {at}:")
    edges = f"run {at}" + (f" and its revert at run {at + args.revert_after}" if args.revert_after else "")
    print(f"  {edges} (±1) flagged on TPOT in {hits} of {n_hist} histories")
    print(f"  false alarms: {len(false)} flagged change points, at {len({(s, r) for s, _, r in false})} distinct (history, run) points")
    by_metric: dict[str, int] = {}
    for _, metric, _ in false:
        by_metric[metric] = by_metric.get(metric, 0) + 1
    print("  false alarms by metric: " + (", ".join(f"{m} {n}" for m, n in sorted(by_metric.items())) or "none"))
    print(f"  host changes (a regression/improvement where the host's event-loop lag changed too; not flagged): {host}")
    if copied:
        print("  " + copied)
    print(f"  ({time.monotonic() - t0:.0f} s on this host)")


if __name__ == "__main__":
    main()
