"""Issue 33: bench deletes only what it can prove it wrote, and one writer at a time per
output folder (``results/outdir.py``), through ``bench run`` and ``bench sweep``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench_llm.bench.cli import cli
from bench_llm.core.errors import BenchError, SettingError
from bench_llm.results.outdir import LOCK_FILE, FolderLock, claim_run_folder, clear_run, took_over_note

#: A virtual-time run: no server, no client, a fraction of a second.
VIRTUAL = ["--launch", "--engine", "sim", "--model", "llama-3.1-8b", "--requests", "6", "--concurrency", "2",
           "--input-tokens", "16", "--output-tokens", "4", "--no-progress"]


def bench(*args: str, cwd: Path | None = None) -> tuple[int, str]:
    """(exit code, stdout and stderr) of one in-process ``bench`` command."""
    runner = CliRunner()
    old = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = runner.invoke(cli, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)
    return result.exit_code, result.output


def user_files(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text("mine")
    (folder / "docs").mkdir()
    (folder / "docs" / "thesis.txt").write_text("years of work")
    return [folder / "notes.txt", folder / "docs" / "thesis.txt"]


def test_overwrite_refuses_a_folder_of_user_files(tmp_path: Path) -> None:
    files = user_files(tmp_path / "d")
    (tmp_path / "d" / "run.parquet").write_bytes(b"PAR1")  # looks like a run, holds more
    code, out = bench("run", "--out", str(tmp_path / "d"), "--overwrite", *VIRTUAL)
    assert code == 2, out
    assert "error: --overwrite" in out and "docs" in out and "a bench run does not write" in out
    assert all(f.exists() for f in files)
    assert not (tmp_path / "d" / LOCK_FILE).exists()  # released


def test_overwrite_of_a_folder_without_a_run_deletes_nothing(tmp_path: Path) -> None:
    files = user_files(tmp_path / "d")
    code, out = bench("run", "--out", str(tmp_path / "d"), "--overwrite", *VIRTUAL)
    assert code == 0, out  # written beside the files, none deleted
    assert all(f.exists() for f in files) and (tmp_path / "d" / "run.parquet").exists()


@pytest.mark.parametrize("out", [".", ""])
def test_overwrite_of_the_current_folder_or_an_empty_path_is_refused(tmp_path: Path, out: str) -> None:
    files = user_files(tmp_path)
    code, text = bench("run", "--out", out, "--overwrite", *VIRTUAL, cwd=tmp_path)
    assert code == 2, text
    assert ("current folder" in text) if out else ("--out is empty" in text), text
    assert all(f.exists() for f in files) and not (tmp_path / "run.parquet").exists()


def test_an_empty_out_is_bad_input(tmp_path: Path) -> None:
    code, text = bench("run", "--out", "", *VIRTUAL, cwd=tmp_path)
    assert code == 2 and "error: --out is empty" in text, text
    assert list(tmp_path.iterdir()) == []
    code, text = bench("sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--tp", "1", "--rate", "1", "--out", "",
                       cwd=tmp_path)  # fmt: skip
    assert code == 2 and "error: --out is empty" in text, text


def test_home_and_root_are_refused_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(SettingError, match="home folder"):
        claim_run_folder(tmp_path, overwrite=True)
    with pytest.raises(SettingError, match="filesystem root"):
        claim_run_folder(Path("/"), overwrite=True)


def test_overwrite_replaces_a_real_previous_run(tmp_path: Path) -> None:
    out = tmp_path / "r"
    assert bench("run", "--out", str(out), *VIRTUAL)[0] == 0
    first = (out / "run.parquet").read_bytes()
    (out / "engine.log").write_text("a launched engine's log")
    (out / ".run.parquet.tmp").write_bytes(b"")  # an atomic write a crash left behind
    code, text = bench("run", "--out", str(out), *VIRTUAL)
    assert code == 2 and "already holds a run" in text and "--overwrite" in text
    code, text = bench("run", "--out", str(out), "--overwrite", *VIRTUAL)
    assert code == 0, text
    assert (out / "run.parquet").read_bytes() != first
    assert not (out / "engine.log").exists() and not (out / ".run.parquet.tmp").exists()
    assert not (out / LOCK_FILE).exists()


def test_clear_run_keeps_a_stray_file_inside_a_table_folder(tmp_path: Path) -> None:
    (tmp_path / "run.parquet").write_bytes(b"PAR1")
    (tmp_path / "requests").mkdir()
    (tmp_path / "requests" / "part-000-000000.parquet").write_bytes(b"PAR1")
    (tmp_path / "requests" / "mine.csv").write_text("x")
    with pytest.raises(SettingError, match="requests/mine.csv"):
        clear_run(tmp_path)
    assert (tmp_path / "requests" / "mine.csv").exists() and (tmp_path / "run.parquet").exists()


def test_a_second_writer_is_refused_naming_the_holder(tmp_path: Path) -> None:
    out = tmp_path / "same"
    out.mkdir()
    with FolderLock(out, ("bench", "run", "--out", str(out))):
        code, text = bench("run", "--out", str(out), *VIRTUAL)
        assert code == 2, text
        line = text.strip().splitlines()[-1]
        assert line.startswith("error:") and f"pid {os.getpid()}" in line
        assert "started 20" in line and "command: bench run --out" in line
        assert not (out / "run.parquet").exists()
        code, text = bench("sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--tp", "1", "--rate", "1",
                           "--requests", "4", "--out", str(out))  # fmt: skip
        assert code == 2 and f"pid {os.getpid()}" in text, text
    assert not (out / LOCK_FILE).exists()
    assert bench("run", "--out", str(out), *VIRTUAL)[0] == 0  # free again


def test_a_stale_lock_is_taken_over_with_a_note(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 999999999, "command": "bench run --out x",
                                                  "started_utc": "2026-01-01T00:00:00+00:00"}))  # fmt: skip
    lock = FolderLock(tmp_path).acquire()
    try:
        note = took_over_note(lock)
        assert note is not None and "pid 999999999" in note and "no longer running" in note
    finally:
        lock.release()
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / LOCK_FILE).write_text(json.dumps({"pid": 999999999, "command": "bench run"}))
    code, text = bench("run", "--out", str(tmp_path / "r"), *VIRTUAL)
    assert code == 0 and "note: " in text and "took over the lock" in text and "pid 999999999" in text, text
    assert not (tmp_path / "r" / LOCK_FILE).exists()


def test_a_lock_is_held_while_writing(tmp_path: Path) -> None:
    lock = claim_run_folder(tmp_path / "r", overwrite=False, command=("bench", "run"))
    try:
        with pytest.raises(BenchError, match="being written by another bench"):
            claim_run_folder(tmp_path / "r", overwrite=False)
    finally:
        lock.release()
    claim_run_folder(tmp_path / "r", overwrite=False).release()
