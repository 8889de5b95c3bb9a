"""bench trend on constructed histories of nightly runs of the simulated engine.

Usage: python benchmarks/trend_history.py [HISTORIES] [RUNS] [REGRESSION_AT]   (default 10 30 20)

Each history: two simulated engines (Llama-3.1-8B on an H100, modelled timing, 3 % step
jitter), the second with --slowdown 1.10 (every step 10 % slower). Nightly run i (1-based,
its own workload seed) goes to the first engine before REGRESSION_AT and to the slow one from
it on, is added to a results store as commit i, and `bench trend` (ci/gates-sim.toml's
metrics and allowances) runs over the 30 commits. Prints, per history, the flagged change
points, then the totals: histories where run REGRESSION_AT (±1) is flagged, and false alarms
(flagged change points anywhere else). The target (issue 23): every history flags run 20 and
at most one false alarm over 10 histories.
"""

from __future__ import annotations

import datetime as _dt
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from click.testing import CliRunner  # noqa: E402

from analysis.gate import load_gate_config  # noqa: E402
from analysis.history import entries  # noqa: E402
from analysis.slo import SLO  # noqa: E402
from analysis.trend import TrendOptions, run_trend  # noqa: E402
from bench.cli import cli  # noqa: E402
from core.control import EngineClient  # noqa: E402
from results.history import Partition, add_entry, config_slug  # noqa: E402

GATES = REPO / "ci" / "gates-sim.toml"
MODEL = "llama-3.1-8b"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_sim(slowdown: float, seed: int) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    argv = [sys.executable, "-m", "bench", "sim", "serve", "--port", str(port), "--timing", "model", "--model-preset", MODEL,
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


def nightly(url: str, out: Path, seed: int) -> None:
    """One `bench run`, in this process (an interpreter start per run would triple the time)."""
    argv = ["run", "--url", url, "--model", MODEL, "--requests", "48", "--concurrency", "8", "--input-tokens", "256",
            "--output-tokens", "24", "--seed", str(seed), "--out", str(out), "--no-progress", "--slo", "ttft_ms=500,tpot_ms=50"]  # fmt: skip
    res = CliRunner().invoke(cli, argv)
    if res.exit_code != 0:
        raise RuntimeError(f"bench run failed: {res.output[-500:]}")


def history(seed: int, runs: int, at: int, root: Path) -> tuple[int, list[tuple[str, int]], list[str]]:
    cfg = load_gate_config(GATES)
    slo = SLO.from_dict(cfg.gate.slo)
    store = root / f"store-{seed}"
    base, slow = start_sim(1.0, seed), start_sim(1.10, seed)
    try:
        for i in range(1, runs + 1):
            out = root / f"h{seed}-run{i:02d}"
            nightly((slow if i >= at else base)[1], out, 1000 * seed + i)
            day = (_dt.date(2026, 1, 1) + _dt.timedelta(days=i - 1)).isoformat()
            for e in entries(out, list(cfg.metrics), slo):
                add_entry(store, Partition(day, f"c{i:02d}", config_slug(e.config_key)), e.entry_id, e.rows, [r.path for r in e.runs])
    finally:
        for proc, _ in (base, slow):
            proc.terminate()
            proc.wait(timeout=30)
    result = run_trend(store, dict(cfg.metrics), list(cfg.metrics), TrendOptions(seed=seed))
    lines = [f"{f.metric} at run {f.index + 1}: {f.verdict} {100 * f.change.rel_change:+.1f}% (p={f.change.p_value:.3f})" for f in result.findings]
    hit = int(any(abs(f.index + 1 - at) <= 1 for f in result.flagged))
    false = [(f.metric, f.index + 1) for f in result.flagged if abs(f.index + 1 - at) > 1]
    return hit, false, lines


def main() -> None:
    n_hist = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    at = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    hits = 0
    false: list[tuple[int, str, int]] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-trend-") as tmp:
        for seed in range(n_hist):
            h, f, lines = history(seed, runs, at, Path(tmp))
            hits += h
            false += [(seed, metric, run) for metric, run in f]
            print(f"history seed={seed}: run {at} flagged: {'yes' if h else 'NO'}; false alarms {len(f)}", flush=True)
            for line in lines:
                print(f"    {line}", flush=True)
    print(f"\n{n_hist} histories of {runs} nightly runs, 10 % TPOT regression (--slowdown 1.10) from run {at}:")
    print(f"  run {at} (±1) flagged in {hits} of {n_hist} histories")
    print(f"  false alarms: {len(false)} flagged change points, at {len({(s, r) for s, _, r in false})} distinct (history, run) points")
    by_metric: dict[str, int] = {}
    for _, metric, _ in false:
        by_metric[metric] = by_metric.get(metric, 0) + 1
    print("  false alarms by metric: " + (", ".join(f"{m} {n}" for m, n in sorted(by_metric.items())) or "none"))
    print(f"  ({time.monotonic() - t0:.0f} s on this host)")


if __name__ == "__main__":
    main()
