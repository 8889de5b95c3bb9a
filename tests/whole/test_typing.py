"""The packages type-check: mypy (settings in pyproject.toml's [tool.mypy]) finds no error.

Runs in-process with the repository root as working directory, the way a developer runs
``mypy --ignore-missing-imports core bench loadgen adapters launch workloads analysis results sim``
there. About 12 s on a cold cache on the development VM; incremental runs reuse
``.mypy_cache/`` (git-ignored).
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "bench", "loadgen", "adapters", "launch", "workloads", "analysis", "results", "sim")


@pytest.mark.timeout(240)
def test_packages_type_check(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        from mypy import api
    except ImportError:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    monkeypatch.chdir(REPO)
    stdout, stderr, status = api.run(
        ["--config-file", str(REPO / "pyproject.toml"), "--ignore-missing-imports", *PACKAGES]
    )
    report = f"{stdout}{stderr}"
    assert status == 0, f"mypy found errors:\n{report}"
    assert "Success: no issues found" in stdout, report
