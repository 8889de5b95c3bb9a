"""What a sweep cell ran on, beyond the client host (``bench.host``): bench's own commit, the
GPUs as ``nvidia-smi`` reports them, and the model's ``config.json`` hash.

Each part is recorded when it can be read and says why when it cannot (no git checkout, no
``nvidia-smi``, a model that is a hub id rather than a local folder); none of them fails a
cell. Commands run from argv lists with a short timeout.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench_llm.core import __version__

#: The checkout bench runs from, when it runs from one.
_SOURCE_ROOT = Path(__file__).resolve().parents[2]
_TIMEOUT_S = 10.0
_GPU_FIELDS = ("index", "name", "driver_version", "memory.total", "memory.used", "uuid")


def cell_fingerprint(model: str, source_root: Path = _SOURCE_ROOT) -> dict[str, Any]:
    """bench's version and commit, the GPUs and the model config hash, for one cell's record."""
    return {
        "bench_version": __version__,
        "bench_git": git_commit(source_root),
        "gpus": nvidia_smi(),
        "model_config": model_config_hash(model),
    }


def _run(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_commit(root: Path) -> dict[str, Any]:
    """``{"commit": ..., "dirty": bool}`` of the checkout at ``root``; why not, when it is none."""
    if not (root / ".git").exists():
        return {"absent": f"{root} is not a git checkout"}
    git = shutil.which("git")
    if git is None:
        return {"absent": "git is not installed"}
    commit = _run([git, "-C", str(root), "rev-parse", "HEAD"])
    if not commit:
        return {"absent": "git rev-parse HEAD failed"}
    status = _run([git, "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
    return {"commit": commit.strip(), "dirty": bool(status and status.strip())}


def nvidia_smi(exe: str | None = None) -> dict[str, Any]:
    """Each GPU's name, driver, memory and UUID, and the CUDA version the driver supports, from
    ``nvidia-smi``; why not, when it is not there or does not answer."""
    exe = exe or shutil.which("nvidia-smi")
    if exe is None:
        return {"absent": "nvidia-smi not found"}
    listing = _run([exe, f"--query-gpu={','.join(_GPU_FIELDS)}", "--format=csv,noheader,nounits"])
    if listing is None:
        return {"absent": "nvidia-smi did not answer"}
    devices = [dict(zip(_GPU_FIELDS, (v.strip() for v in line.split(",")))) for line in listing.splitlines() if line.strip()]
    header = _run([exe]) or ""
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header)
    return {"devices": devices, "cuda_version": cuda.group(1) if cuda else None}


def model_config_hash(model: str) -> dict[str, Any]:
    """SHA-256 of a local model folder's ``config.json``; why not, for anything else."""
    path = Path(model).expanduser() / "config.json"
    try:
        data = path.read_bytes()
    except OSError:
        return {"absent": f"{model} is not a local model folder with a config.json"}
    return {"path": str(path), "sha256": hashlib.sha256(data).hexdigest()}
