"""The gate and compare self-test on the embedded engine, with every figure printed.

Usage: python benchmarks/gate_selftest.py [RUNS_PER_SIDE]   (default 5; ~5 s per run)
Makes RUNS_PER_SIDE baseline runs (ITL 10 ms, TTFT 50 ms) and as many runs of an engine 15 %
slower per step (11.5 ms, 57.5 ms), 150 requests at concurrency 32, 32 output tokens each;
gates every same-configuration pair and baseline/slower pair with ci/gates-sim.toml, and
prints `bench compare` intervals for TTFT/TPOT/ITL/E2E p50.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_llm.analysis.bootstrap import BootstrapOptions, compare_sides, make_side  # noqa: E402
from bench_llm.analysis.compare import compare_paths  # noqa: E402
from bench_llm.analysis.gate import judge_change, load_gate_config  # noqa: E402
from bench_llm.analysis.load import load_run  # noqa: E402
from bench_llm.analysis.slo import SLO  # noqa: E402

METRICS = ["ttft_p50_ms", "tpot_p50_ms", "itl_p50_ms", "e2e_p50_ms"]


def run(out: Path, itl: str, ttft: str, seed: int) -> Path:
    argv = [sys.executable, "-m", "bench_llm.bench", "run", "--requests", "150", "--concurrency", "32", "--input-tokens", "128",
            "--output-tokens", "32", "--seed", str(seed), "--sim-itl-ms", itl, "--sim-ttft-ms", ttft, "--out", str(out),
            "--no-progress", "--json"]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, cwd=REPO, timeout=300)
    return out


def fmt(c) -> str:  # type: ignore[no-untyped-def]
    return f"{c.metric} {100 * c.rel:+.1f}% [{100 * c.rel_low:+.1f}, {100 * c.rel_high:+.1f}]{' sig' if c.significant else ''}"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    cfg = load_gate_config(REPO / "ci" / "gates-sim.toml")
    slo = SLO.from_dict(cfg.gate.slo)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        base = [run(root / "base" / f"run{i}", "10", "50", i) for i in range(n)]
        slow = [run(root / "slow" / f"run{i}", "11.5", "57.5", i) for i in range(n)]
        sides = {p: make_side([load_run(p).requests], slo) for p in base + slow}

        def gate(a: Path, b: Path, seed: int) -> tuple[bool, list[str]]:
            ch = compare_sides(sides[a], sides[b], list(cfg.metrics), BootstrapOptions(resamples=cfg.gate.resamples, seed=seed))
            checks = [r for c in ch for r in judge_change("run", c, cfg.metrics[c.metric])]
            return all(r.verdict != "fail" for r in checks), [f"{r.metric}:{r.verdict}" for r in checks if r.verdict != "pass"]

        same_pairs = list(itertools.combinations(base, 2))
        slow_pairs = [(base[i], slow[(i + k) % n]) for k in (0, 1) for i in range(n)]
        same = [gate(a, b, s) for s, (a, b) in enumerate(same_pairs)]
        slower = [gate(a, b, s) for s, (a, b) in enumerate(slow_pairs)]
        print(f"gate, same configuration: passed {sum(ok for ok, _ in same)}/{len(same)}")
        for ok, notes in same:
            if notes:
                print("   ", "pass" if ok else "FAIL", ", ".join(notes))
        print(f"gate, engine 15% slower per step: failed {sum(not ok for ok, _ in slower)}/{len(slower)}")
        opts = BootstrapOptions()
        sig = 0
        print("compare, same configuration (single runs):")
        for a, b in same_pairs:
            ch = {c.metric: c for c in compare_sides(sides[a], sides[b], METRICS, opts)}
            sig += ch["ttft_p50_ms"].significant
            print("   ", "; ".join(fmt(ch[m]) for m in METRICS))
        print(f"  TTFT p50 significant in {sig}/{len(same_pairs)} same-configuration pairs (95% level)")
        print("compare, 15% slower engine (single runs):")
        for a, b in slow_pairs[:n]:
            ch = {c.metric: c for c in compare_sides(sides[a], sides[b], METRICS, opts)}
            print("   ", "; ".join(fmt(ch[m]) for m in METRICS))
        pooled = compare_paths(root / "base", root / "slow", METRICS, options=opts)
        g = pooled.groups[0]
        print(f"compare, {n} vs {n} repeats pooled ({g.resampling}): " + "; ".join(fmt(c) for c in g.changes))


if __name__ == "__main__":
    main()
