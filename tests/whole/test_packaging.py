"""bench installs as one import package, ``bench_llm``, and lives beside packages that own generic names.

The repository keeps its layers as top-level folders (core/, sim/, bench/, ...); pyproject.toml maps
them under ``bench_llm`` so that site-packages gets one name of ours, not nine generic ones that other
PyPI projects also install (``bench``, ``adapters``, ``results``, ``launch``, ``analysis``).
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("core", "bench", "loadgen", "adapters", "launch", "workloads", "analysis", "results", "sim")


def test_the_package_list_is_every_folder_with_an_init() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {
        "bench_llm." + ".".join(init.parent.relative_to(REPO).parts)
        for layer in LAYERS
        for init in (REPO / layer).rglob("__init__.py")
    }
    assert set(config["packages"]) == folders
    assert config["package-dir"] == {f"bench_llm.{layer}": layer for layer in LAYERS}


def _squatter(root: Path) -> Path:
    """A distribution that owns top-level ``bench``, ``adapters`` and ``results`` and a ``bench`` script,
    as frappe-bench and AdapterHub's adapters do."""
    for name in ("bench", "adapters", "results"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text("OWNER = 'squatter'\n")
    (root / "bench" / "cli.py").write_text("def main():\n    print('squatter bench')\n")
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "squatter"\nversion = "1.0"\n'
        '[project.scripts]\nbench = "bench.cli:main"\n'
        '[tool.setuptools]\npackages = ["bench", "adapters", "results"]\n'
    )
    return root


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"))}


def _wheel(source: Path, out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out), str(source)],
        check=True, capture_output=True, text=True, timeout=240,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_wheel_installs_one_package_and_runs_beside_a_squatter(tmp_path: Path) -> None:
    # Build from the tracked files only (a copy, so no build/ folder lands in the checkout).
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout: cannot list the tracked files to build from")
    src = tmp_path / "src"
    for rel in tracked:
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    ours = _wheel(src, tmp_path / "wheels")
    top_level = {name.split("/")[0] for name in zipfile.ZipFile(ours).namelist()}
    assert {t for t in top_level if not t.endswith((".dist-info", ".data"))} == {"bench_llm"}

    squat_src = _squatter(tmp_path / "squatter")
    squat = _wheel(squat_src, tmp_path / "squat-wheels")

    # A fresh venv whose dependencies come from this one's site-packages (a .pth line: no network);
    # the .pth files there (our editable finder) are not processed, so only the wheel provides bench_llm.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    for wheel in (squat, ours):
        subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)],
                       check=True, capture_output=True, text=True, timeout=240, env=_clean_env())
    assert sorted(p.name for p in Path(purelib).iterdir() if not p.name.endswith(".dist-info")) == [
        "adapters", "bench", "bench_llm", "results"]
    # written after the installs, so pip does not see this venv's editable bench-llm as already installed
    Path(purelib, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    env = _clean_env()
    ran = subprocess.run([str(venv / "bin" / "bench-llm"), "--version"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env=env)
    assert ran.returncode == 0 and "version" in ran.stdout, ran.stderr
    run = subprocess.run(
        [str(venv / "bin" / "bench-llm"), "run", "--requests", "6", "--concurrency", "2", "--input-tokens", "16",
         "--output-tokens", "4", "--out", str(tmp_path / "run"), "--no-progress"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "run" / "run.parquet").exists()
    # the squatter's packages are intact beside ours
    owner = subprocess.run([str(py), "-c", "import bench, adapters, results; print(bench.OWNER, adapters.OWNER, results.OWNER)"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert owner.stdout.split() == ["squatter"] * 3, owner.stderr
