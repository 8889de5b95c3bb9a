"""Print the real-vLLM figures for a run folder made by `bench run --engine vllm --launch ...`.

    /work/venv/bin/python tests/real_engine/crosscheck.py RUN_DIR

Per-request agreement of the chunk token counts with the server's final usage, and the
client's TTFT beside vLLM's own TTFT histogram for the same window.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench_llm.analysis.server_metrics import ttft_cross_check
from bench_llm.results.reader import read_requests


def main(run_dir: Path) -> None:
    rows = read_requests(run_dir).to_pylist()
    agree = sum(1 for r in rows if r["completion_tokens"] is not None and sum(r["chunk_tokens"]) == r["completion_tokens"])
    full = sum(1 for r in rows if r["output_tokens"] == r["max_output_tokens"])
    sources = sorted({r["token_source"] for r in rows})
    print(f"requests {len(rows)}, ok {sum(r['ok'] for r in rows)}")
    print(f"per-chunk counts == server final usage: {agree}/{len(rows)} (sources: {', '.join(sources)})")
    print(f"output == requested length: {full}/{len(rows)}")
    c = ttft_cross_check(run_dir, read_requests(run_dir))
    if c is None:
        print("no server TTFT histogram in this run")
        return
    lo, hi = c.server_p50_bucket_ms
    print(f"client TTFT p50 {c.client_p50_ms:.2f} ms, mean {c.client_mean_ms:.2f} ms (n={c.client_count})")
    print(f"vLLM histogram p50 {c.server_p50_ms:.2f} ms (interpolated in its {lo:g}-{hi:g} ms bucket), "
          f"mean {c.server_mean_ms:.2f} ms (exact, n={c.server_count:.0f})")  # fmt: skip
    print(f"p50: client {100 * c.p50_rel_diff:+.1f}% raw; through the same buckets "
          f"{c.client_p50_bucketed_ms:.2f} ms = {100 * c.p50_rel_diff_bucketed:+.1f}%; "
          f"mean {100 * c.mean_rel_diff:+.1f}% ({c.mean_gap_ms:+.2f} ms)")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: crosscheck.py RUN_DIR")
    main(Path(sys.argv[1]))
