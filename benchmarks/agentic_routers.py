"""Prefix-aware vs round-robin DP routing for agents, on the modelled engine in virtual time.

Two tables (docs/workloads.md, Session graphs; sim/routing.py):

1. a hot prefix: every request starts with one 2,048-token system prompt that one replica
   holds first (DP 4, 250 requests/s): TTFT p90 and hit rate per router, and the prefix-aware
   router without its load guard (everything piles onto the replica with the prefix);
2. the ``agentic`` built-in at DP 4: job completion p50/p90, per-job prefix-cache hit rate and
   job SLO attainment (job_ms <= 40 s) per router and load (jobs/s).

    python benchmarks/agentic_routers.py            # about 1-2 minutes of CPU
"""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_llm.analysis.jobs import job_summary  # noqa: E402
from bench_llm.analysis.slo import SLO  # noqa: E402
from bench_llm.sim import backend as backend_module  # noqa: E402
from bench_llm.sim.backend import ModelBackend  # noqa: E402
from bench_llm.sim.options import ModelTiming  # noqa: E402
from bench_llm.sim.routing import CacheAwareGuard, prefix_aware  # noqa: E402
from bench_llm.sim.virtual import OK, Send, run  # noqa: E402


def hot_prefix(router: str, guard: CacheAwareGuard | None = None, n: int = 600, gap_ns: int = 4_000_000) -> tuple[float, float]:
    backend_module.prefix_aware = prefix_aware if guard is None else functools.partial(prefix_aware, guard=guard)  # type: ignore[assignment]
    try:
        b = ModelBackend(ModelTiming("llama-3.1-8b", "h100", dp=4, router=router))  # type: ignore[arg-type]
        hot = tuple(range(1, 129))
        sends = [Send(2048 + 256, 64, hot + tuple(10_000 + 16 * i + k for k in range(16)),
                      at_ns=0 if i == 0 else 1_000_000_000 + i * gap_ns) for i in range(n)]
        res = run(b, sends)
        ttft = [(o.token_ns[0] - o.intended_ns) / 1e6 for o in res.outcomes if o.state == OK]
        return float(np.percentile(ttft, 90)), b.prefix_hits / b.prefix_queries
    finally:
        backend_module.prefix_aware = prefix_aware


def agentic(router: str, rate: float, out: Path, requests: int = 800) -> str:
    cmd = [sys.executable, "-m", "bench_llm.bench", "run", "--launch", "--engine", "sim", "--model", "llama-3.1-8b",
           "--gpu", "h100", "--engine-arg=--dp=4", f"--engine-arg=--router={router}", "--workload", "agentic",
           "--rate", str(rate), "--requests", str(requests), "--clock", "virtual", "--out", str(out), "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    s = job_summary(out, SLO.parse("job_ms=40000"))
    assert s is not None
    m = s.metrics["job_ms"]
    return (f"{router:<13}{rate:>6g}{s.jobs:>6}{m['p50'] / 1000:>10.1f}{m['p90'] / 1000:>10.1f}"
            f"{100 * s.hit_rate:>9.1f}%{100 * s.attainment:>11.1f}%")


def main() -> None:
    print("hot 2,048-token prefix, DP 4, 250 requests/s (llama-3.1-8b, H100)")
    print(f"{'router':<34}{'TTFT p90 ms':>12}{'hit rate':>10}")
    for label, router, guard in (("round-robin", "round-robin", None), ("prefix-aware (guarded)", "prefix-aware", None),
                                 ("prefix-aware, sgl-router's abs 64", "prefix-aware", CacheAwareGuard(balance_abs_threshold=64)),
                                 ("prefix-aware, no guard", "prefix-aware", CacheAwareGuard(balance_abs_threshold=1 << 30))):
        p90, hit = hot_prefix(router, guard)
        print(f"{label:<34}{p90:>12.1f}{100 * hit:>9.1f}%")
    print()
    print("agentic built-in, DP 4 (800 requests per load; job SLO job_ms <= 40 s)")
    print(f"{'router':<13}{'jobs/s':>6}{'jobs':>6}{'JCT p50 s':>10}{'JCT p90 s':>10}{'hit rate':>10}{'attainment':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for rate in (1.0, 2.0):
            for router in ("round-robin", "prefix-aware"):
                print(agentic(router, rate, Path(tmp) / f"{router}-{rate}"))


if __name__ == "__main__":
    main()
