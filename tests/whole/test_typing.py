"""The packages type-check: mypy (settings in pyproject.toml's [tool.mypy]) finds no error.

The import package ``bench_llm`` has no folder of its own (pyproject.toml maps its layers onto the
repository's top-level folders), and mypy does not follow setuptools' editable-install finder, so
the test lays out ``bench_llm/<layer>`` as symlinks to the folders in a scratch directory and runs
``mypy -p bench_llm`` there, in-process. About 12 s on a cold cache; incremental runs reuse the
repository's ``.mypy_cache/`` (git-ignored).
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "bench", "loadgen", "adapters", "launch", "workloads", "analysis", "results", "sim")


@pytest.mark.timeout(240)
def test_packages_type_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    try:
        from mypy import api
    except ImportError:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    (tmp_path / "bench_llm").mkdir()
    for layer in PACKAGES:
        (tmp_path / "bench_llm" / layer).symlink_to(REPO / layer, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    stdout, stderr, status = api.run(
        ["--config-file", str(REPO / "pyproject.toml"), "--cache-dir", str(REPO / ".mypy_cache"),
         "--ignore-missing-imports", "-p", "bench_llm"]
    )
    report = f"{stdout}{stderr}"
    assert status == 0, f"mypy found errors:\n{report}"
    assert "Success: no issues found" in stdout, report
