"""Size and build time of `bench report` for a large run (synthetic, no engine needed).

Usage: python benchmarks/report_size.py [REQUESTS] [TOKENS_PER_REQUEST]
Prints the Parquet size, the report size, the part of it that is plotly.js, and the time.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plotly.offline import get_plotlyjs  # noqa: E402

from bench_llm.analysis.report import build_report  # noqa: E402
from bench_llm.results.synthetic import synthetic_run  # noqa: E402


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        run = synthetic_run(Path(d) / "run", n, tokens)
        gen_s = time.perf_counter() - t
        parquet = sum(p.stat().st_size for p in run.rglob("*.parquet"))
        t = time.perf_counter()
        info = build_report(run, Path(d) / "report.html")
        build_s = time.perf_counter() - t
        js = len(get_plotlyjs().encode())
        print(f"requests {n:,} x {tokens} tokens ({n * tokens:,} token timestamps); generated in {gen_s:.1f} s")
        print(f"parquet {parquet / 1e6:.1f} MB")
        print(f"report {info.bytes / 1e6:.2f} MB ({js / 1e6:.2f} MB of it plotly.js, {(info.bytes - js) / 1e3:.0f} kB page + data), "
              f"{info.figures} figures, built in {build_s:.1f} s")


if __name__ == "__main__":
    main()
