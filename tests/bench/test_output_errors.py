"""Issue 33: every output path turns an operating-system error into one ``error:`` line naming
the path (no traceback), and a run interrupted by a full disk keeps what it wrote, marked
interrupted with the cause.

Tests run as root, where ``chmod`` stops nothing: a read-only or tiny file system is a tmpfs
mounted in a private mount namespace (``unshare -m``) around the one bench command; where the
namespace is not permitted those tests skip, saying so.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import bench_argv

VIRTUAL = ["--launch", "--engine", "sim", "--model", "llama-3.1-8b", "--requests", "6", "--concurrency", "2",
           "--input-tokens", "16", "--output-tokens", "4", "--no-progress"]  # fmt: skip
SWEEP = ["sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--tp", "1", "--rate", "1", "--requests", "4",
         "--jobs", "1"]  # fmt: skip


def _namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d && rmdir $d"],
                       capture_output=True, timeout=30)  # fmt: skip
    return p.returncode == 0


needs_mount = pytest.mark.skipif(not _namespaces(), reason="no private mount namespace here (unshare -m and mount "
                                 "need CAP_SYS_ADMIN): read-only and full file systems cannot be simulated for root")


def bench(*args: str, cwd: Path, mount: tuple[Path, str] | None = None, after: str = "") -> tuple[int, str]:
    """(exit code, stdout + stderr) of one bench command; with ``mount`` (folder, tmpfs options)
    the command sees a fresh tmpfs there, and ``after`` runs in the namespace after it."""
    argv = bench_argv(*args)
    if mount is not None:
        folder, options = mount
        folder.mkdir(parents=True, exist_ok=True)
        script = f"mount -t tmpfs -o {options} tmpfs {shlex.quote(str(folder))} && \"$@\"; rc=$?; {after} exit $rc"
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *argv]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=cwd)
    return p.returncode, p.stdout + p.stderr


def one_error_line(text: str) -> str:
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    return errors[0]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run (virtual time) and a results store holding it."""
    root = tmp_path_factory.mktemp("base")
    assert bench("run", "--out", "run", *VIRTUAL, cwd=root)[0] == 0
    assert bench("history", "run", "--store", "store", "--commit", "abc", cwd=root)[0] == 0
    return root


@needs_mount
@pytest.mark.parametrize(
    "args, path",
    [
        (["run", "--out", "ro/r", *VIRTUAL], "ro/r"),
        ([*SWEEP, "--out", "ro/s"], "ro/s"),
        (["report", "run", "-o", "ro/report.html"], "ro/report.html:"),
        (["history", "run", "--store", "ro/store", "--commit", "abc"], "ro/store"),
        (["trend", "store", "--html", "ro/trend.html"], "ro/trend.html:"),
    ],
    ids=["run", "sweep", "report", "history", "trend"],
)
def test_a_read_only_output_is_one_error_line(base: Path, args: list[str], path: str) -> None:
    code, text = bench(*args, cwd=base, mount=(base / "ro", "ro,size=64k"))
    line = one_error_line(text)
    assert code == 2 and path in line and "Read-only file system" in line, text


@needs_mount
def test_a_full_disk_interrupts_the_run_and_keeps_what_it_wrote(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    code, text = bench("run", "--out", str(disk / "r"), "--requests", "400", "--concurrency", "8", "--input-tokens",
                       "16", "--output-tokens", "64", "--no-progress", "--sim-ttft-ms", "1", "--sim-itl-ms", "2",
                       "--save-text", "--no-scrape", cwd=tmp_path, mount=(disk, "size=256k"),
                       after=f"cp -r {disk}/r {tmp_path}/kept;")  # fmt: skip
    line = one_error_line(text)
    assert code == 130 and "run interrupted: cannot write" in line and "No space left on device" in line, text
    assert str(disk / "r") in line
    meta = pq.read_table(tmp_path / "kept" / "run.parquet").to_pylist()[0]
    assert meta["status"] == "interrupted" and "No space left on device" in meta["notes_json"]
    kept = pq.ParquetDataset(tmp_path / "kept" / "requests").read().num_rows
    assert 0 < kept < 400
    assert not (tmp_path / "kept" / ".bench.reserve").exists() and not (tmp_path / "kept" / ".bench.lock").exists()


def test_sweep_into_an_existing_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("mine")
    code, text = bench(*SWEEP, "--out", "f", cwd=tmp_path)
    line = one_error_line(text)
    assert code == 2 and "--out f exists and is not a folder" in line, text
    assert (tmp_path / "f").read_text() == "mine"


def test_report_into_an_existing_folder_leaves_no_temporary_file(base: Path) -> None:
    (base / "folder").mkdir(exist_ok=True)
    before = set(base.iterdir())
    code, text = bench("report", "run", "-o", "folder", cwd=base)
    line = one_error_line(text)
    assert code == 2 and "folder: is a folder" in line, text
    assert set(base.iterdir()) == before and list((base / "folder").iterdir()) == []


def test_a_truncated_parquet_file_is_named(base: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(base / "run", run)
    part = sorted((run / "requests").glob("*.parquet"))[0]
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    code, text = bench("summary", str(run), cwd=tmp_path)
    line = one_error_line(text)
    assert code == 2 and str(part) in line and "not a readable Parquet file" in line, text


@needs_mount
def test_a_full_disk_during_a_sweep_is_one_error_line(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    code, text = bench("sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--tp", "1,2", "--rate", "1,2",
                       "--requests", "30", "--jobs", "2", "--out", str(disk / "s"), cwd=tmp_path,
                       mount=(disk, "size=200k"))  # fmt: skip
    line = one_error_line(text)
    assert code == 2 and str(disk / "s") in line and "No space left on device" in line, text
