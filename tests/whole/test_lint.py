"""The code passes ruff's lint and import-order rules, configured in pyproject.toml's [tool.ruff]."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing() -> None:
    try:
        import ruff  # noqa: F401  (only to know it is installed)
    except ImportError:
        if shutil.which("ruff") is None:
            pytest.skip("ruff is not installed (pip install -e '.[test]')")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"ruff check found problems (ruff check --fix . mends most):\n{out.stdout}{out.stderr}"
