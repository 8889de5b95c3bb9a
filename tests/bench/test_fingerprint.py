"""A sweep cell's fingerprint (issue 22): bench's git commit, nvidia-smi's GPUs, the model's
config.json hash; each absent part says why instead of failing the cell."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bench_llm.bench.sweep.fingerprint import cell_fingerprint, git_commit, model_config_hash, nvidia_smi


def test_git_commit_of_a_checkout_and_of_a_plain_folder(tmp_path: Path) -> None:
    assert "absent" in git_commit(tmp_path)
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "f").write_text("x")
    env = ["-c", "user.email=t@example.invalid", "-c", "user.name=t"]
    for argv in (["init", "-q"], ["add", "f"], [*env, "commit", "-q", "-m", "one"]):
        subprocess.run(["git", "-C", str(repo), *argv], check=True, capture_output=True, timeout=30)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True,
                          timeout=30).stdout.strip()  # fmt: skip
    assert git_commit(repo) == {"commit": head, "dirty": False}
    (repo / "f").write_text("changed")
    assert git_commit(repo) == {"commit": head, "dirty": True}


def test_nvidia_smi_is_read_when_present_and_skipped_when_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert nvidia_smi() == {"absent": "nvidia-smi not found"}
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ -n "$1" ]; then echo "0, NVIDIA H100 80GB HBM3, 550.54.15, 81559, 3, GPU-abc"; '
        'else echo "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4 |"; fi\n'
    )
    fake.chmod(0o755)
    got = nvidia_smi(str(fake))
    assert got["cuda_version"] == "12.4"
    assert got["devices"] == [{"index": "0", "name": "NVIDIA H100 80GB HBM3", "driver_version": "550.54.15",
                               "memory.total": "81559", "memory.used": "3", "uuid": "GPU-abc"}]  # fmt: skip
    broken = tmp_path / "broken-smi"
    broken.write_text("#!/bin/sh\nexit 9\n")
    broken.chmod(0o755)
    assert nvidia_smi(str(broken)) == {"absent": "nvidia-smi did not answer"}


def test_model_config_hash_of_a_local_folder_only(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    got = model_config_hash(str(tmp_path))
    assert got["sha256"] == hashlib.sha256((tmp_path / "config.json").read_bytes()).hexdigest()
    assert "absent" in model_config_hash("meta-llama/Llama-3.1-8B")
    whole = cell_fingerprint(str(tmp_path), source_root=tmp_path)
    assert whole["model_config"] == got and "absent" in whole["bench_git"] and whole["bench_version"]
