#!/usr/bin/env bash
# The sweep the nightly gate runs, and its baseline: the simulated engine (Llama-3.1-8B preset
# on H100s), TP 1 and 2, two open-loop rates, 3 repeats per load so that `bench gate` can use
# hierarchical resampling (run-to-run variation inside the interval).
# Usage: ci/sweep-sim.sh OUT_DIR
set -euo pipefail
out="${1:?usage: ci/sweep-sim.sh OUT_DIR}"
exec bench sweep --engine sim --model llama-3.1-8b --gpu h100 --gpus 2 \
  --tp 1,2 --rate 2,4 --requests 120 --repeats 3 \
  --input-tokens 512 --output-tokens 64 --seed 0 \
  --slo ttft_ms=500,tpot_ms=50 --out "$out"
