"""Replay a slice of the Mooncake conversation trace through the simulated engine with
prefix caching on, and compare the engine's prefix-cache hit rate with the slice's
reusable-prefix fraction computed from ``hash_ids`` (the STATS.md definition).

    python benchmarks/mooncake_prefix_replay.py [--requests 500] [--time-scale 0.25]

Prints one line per figure. The hit rate is sum(cached_tokens) / sum(prompt_tokens) over
completed requests, both as the engine reported them in its usage.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO.parent / "shared" / "traces" / "mooncake-fast25" / "conversation_trace.jsonl"

sys.path.insert(0, str(REPO))

from bench_llm.core.control import EngineClient  # noqa: E402
from bench_llm.launch.process import free_port  # noqa: E402


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"simulated engine exited with {proc.returncode}")
        if EngineClient(url, timeout_s=1).health().ok:
            return
        time.sleep(0.2)
    raise SystemExit("simulated engine did not become ready")


def replay(
    trace: Path,
    requests: int,
    time_scale: float,
    sim_args: list[str],
    out: Path,
    caching: bool = True,
    timeout_s: float = 900,
) -> dict[str, float]:
    """Run the slice; return the engine's hit rate and the slice's reusable fraction."""
    import pyarrow.parquet as pq

    from bench_llm.workloads.stats import prefix_reuse

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    flag = "--enable-prefix-caching" if caching else "--no-enable-prefix-caching"
    argv = [sys.executable, "-m", "bench_llm.bench", "sim", "serve", "--host", "127.0.0.1", "--port", str(port), *sim_args, flag]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "engine.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(url, proc)
        model = sim_args[sim_args.index("--model-preset") + 1] if "--model-preset" in sim_args else "sim-model"
        run = subprocess.run(
            [sys.executable, "-m", "bench_llm.bench", "run", "--url", url, "--model", model, "--workload", str(trace),
             "--requests", str(requests), "--arrival", f"trace:time_scale={time_scale}", "--out", str(out / "run"),
             "--overwrite", "--no-progress", "--json"],
            capture_output=True, text=True, timeout=timeout_s,
        )
        if run.returncode != 0:
            raise SystemExit(f"bench run failed: {run.stderr.strip()[-400:]}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
    rows = pq.read_table(out / "run" / "requests").to_pandas()
    ok = rows[rows["ok"]]
    lines = [json.loads(x) for x in trace.read_text().splitlines()[:requests]]
    hashes, lengths = [r["hash_ids"] for r in lines], [r["input_length"] for r in lines]
    reusable = prefix_reuse(hashes, lengths, 512)
    kv_tokens = _kv_tokens(out / "engine.log")
    lru = prefix_reuse(hashes, lengths, 512, kv_tokens // 512) if kv_tokens else float("nan")
    return {
        "kv_tokens": float(kv_tokens or 0),
        "reusable_lru": lru,
        "requests": float(len(rows)),
        "ok": float(len(ok)),
        "hit_rate": float(ok["cached_tokens"].fillna(0).sum() / max(1, ok["prompt_tokens"].sum())),
        "reusable": reusable,
        "exact_lengths": float((ok["prompt_tokens"] == ok["input_tokens_target"]).mean()),
    }


def _kv_tokens(log: Path) -> int | None:
    """KV tokens per instance from the simulated engine's start line (``bench sim: {...}``)."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("bench sim: "):
            try:
                return int(json.loads(line[len("bench sim: ") :])["kv_tokens_per_instance"])
            except (ValueError, KeyError):
                return None
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument(
        "--sim",
        default="--timing model --model-preset llama-3.1-8b --gpu h200 --tp 8",
        help="bench sim serve flags (prefix caching is added)",
    )
    ap.add_argument("--control", action="store_true", help="also run with prefix caching off")
    args = ap.parse_args()
    if not args.trace.is_file():
        print(f"trace {args.trace} not present; nothing to do")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        r = replay(args.trace, args.requests, args.time_scale, args.sim.split(), Path(tmp) / "on")
        print(f"slice: first {args.requests} requests of {args.trace.name}, time_scale {args.time_scale}")
        print(f"sim flags: {args.sim} --enable-prefix-caching")
        print(f"completed: {r['ok']:.0f}/{r['requests']:.0f}; prompt_tokens == target: {r['exact_lengths']:.1%}")
        print(f"reusable prefix fraction of the slice (hash_ids, infinite cache): {r['reusable']:.1%}")
        print(
            f"same with an LRU of the engine's KV capacity ({r['kv_tokens'] / 1e6:.1f}M tokens, "
            f"512-token blocks): {r['reusable_lru']:.1%}"
        )
        print(f"engine prefix-cache hit rate (cached_tokens / prompt_tokens): {r['hit_rate']:.1%}")
        print("whole trace, STATS.md: 37.4 % reusable (infinite cache), 26.8 % with an LRU of 8.2M tokens")
        if args.control:
            c = replay(args.trace, args.requests, args.time_scale, args.sim.split(), Path(tmp) / "off", caching=False)
            print(f"control, prefix caching off: hit rate {c['hit_rate']:.1%}")
        print(f"wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
