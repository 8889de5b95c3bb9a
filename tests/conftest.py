"""Shared test helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"

# Tests start `python -m bench ...` subprocesses: make sure they import this checkout.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the test saying why."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not present (../shared is only beside the developers' and CI's checkouts)")
    return p


def bench_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "bench", *args]
