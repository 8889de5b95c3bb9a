"""An output folder bench writes (a run's or a sweep's): what bench may delete in it, and one
writer at a time.

bench deletes only what it can prove it wrote. ``--overwrite`` replaces a folder only when it
holds a bench run (its ``run.parquet``) and nothing but the entries a run writes
(``RUN_ENTRIES``, the part files in its table folders, bench's own hidden temporary files);
anything else in it (a user's notes, a ``.git``) refuses the overwrite, naming the entry.
The current folder, the home folder and a filesystem root are refused by name, whatever they
hold.

While a run or a sweep writes a folder it holds the folder's lock (``LOCK_FILE``: an
``flock`` on a file that names its holder). A second writer is refused in one line naming the
holder's process id, command and start time; the kernel releases the lock of a process that
died, so a lock file left by a dead holder is taken over, with a note.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import re
import shutil
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_llm.core.errors import BenchError, SettingError
from bench_llm.core.redact import redact
from bench_llm.results.schema import (
    MONITOR_DIR,
    REQUESTS_DIR,
    RUN_FILE,
    SCHEDULE_FILE,
    SERVER_METRICS_DIR,
    SERVER_SPANS_FILE,
)

#: The lock file of a folder being written (hidden; removed when its writer ends).
LOCK_FILE = ".bench.lock"
#: Room kept in a run folder while the run writes (``reserve_room``): freed when a write fails
#: (a full disk) so that the run's metadata can still say it was interrupted, and why.
RESERVE_FILE = ".bench.reserve"
RESERVE_BYTES = 64 << 10
#: A run's table folders: they hold part files only.
_TABLE_DIRS = frozenset({REQUESTS_DIR, MONITOR_DIR, SERVER_METRICS_DIR})
#: The files a run writes at its top level (engine logs match ``_ENGINE_LOG``).
_RUN_FILES = frozenset({RUN_FILE, SCHEDULE_FILE, SERVER_SPANS_FILE, LOCK_FILE, RESERVE_FILE})
#: A launched engine's logs: ``engine.log``, ``engine.prefill0.log``, ...
_ENGINE_LOG = re.compile(r"engine(\.[A-Za-z0-9_-]+)?\.log\Z")
#: bench's own temporary names: ``.run.parquet.tmp`` (an atomic write), ``.requests.compact``
#: (a merge of part files).
_TEMPORARY = re.compile(r"\.(.+)\.(tmp|compact)\Z")
_PART = re.compile(r"\.?part-\d+-\d+\.parquet(\.tmp)?\Z")


def check_out(out: Path | str) -> Path:
    """``out`` as a path, or a ``SettingError`` for an empty one (an unset ``$OUT``: bench
    never reads it as the current folder)."""
    if str(out).strip() == "":
        raise SettingError("$out is empty: give the folder to write (an unset variable in the command?)")
    return Path(out)


def refuse_by_name(out: Path) -> None:
    """A ``SettingError`` when ``out`` is the current folder, the home folder or a filesystem
    root: bench never replaces those, whatever they hold."""
    where = out.resolve()
    names = {
        Path.cwd().resolve(): "the current folder",
        Path.home().resolve(): "the home folder",
        Path(where.anchor): "a filesystem root",
    }
    name = names.get(where)
    if name is not None:
        raise SettingError(f"$overwrite: {out} is {name}; bench replaces only a run folder of its own (choose another $out)")


def foreign_entry(run_dir: Path) -> str | None:
    """The first entry of ``run_dir`` (relative path) that a bench run does not write, or None
    when it holds nothing else."""
    for entry in sorted(run_dir.iterdir()):
        name = entry.name
        if entry.is_symlink():
            return name
        if name in _TABLE_DIRS and entry.is_dir():
            stray = next((p.name for p in sorted(entry.iterdir()) if p.is_symlink() or not p.is_file() or not _PART.match(p.name)), None)
            if stray is not None:
                return f"{name}/{stray}"
            continue
        if entry.is_file() and (name in _RUN_FILES or _ENGINE_LOG.match(name)):
            continue
        temporary = _TEMPORARY.match(name)
        if temporary and temporary[1] in _RUN_FILES | _TABLE_DIRS:
            continue
        return name
    return None


def clear_run(run_dir: Path) -> None:
    """Delete a previous run in ``run_dir`` for ``--overwrite``, entry by entry, once
    ``foreign_entry`` found nothing but a run's own entries (the lock is kept: its holder is
    the caller). ``BenchError`` naming the entry that is not bench's."""
    refuse_by_name(run_dir)
    if not (run_dir / RUN_FILE).is_file():
        return
    stray = foreign_entry(run_dir)
    if stray is not None:
        raise SettingError(
            f"$overwrite: {run_dir} holds {stray}, which a bench run does not write; bench replaces only a folder "
            "holding its own run and nothing else (move it, or choose another $out)"
        )
    for entry in run_dir.iterdir():
        if entry.name == LOCK_FILE:
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


class FolderLock:
    """The lock of an output folder while one run or sweep writes it (``acquire``, ``release``;
    a context manager). The lock is an ``flock`` on ``LOCK_FILE`` (released by the kernel when
    its holder dies); the file names its holder for the message a second writer gets."""

    def __init__(self, folder: Path, command: Sequence[str] = (), created: bool = False) -> None:
        self.folder = Path(folder)
        #: The folder was made for this writer: left empty at release (refused before anything was
        #: written), it is removed again; a folder holding anything is never touched.
        self.created = created
        self.path = self.folder / LOCK_FILE
        self.command = redact(" ".join(command))
        self._fd: int | None = None
        #: The holder whose stale lock file was taken over (a dict of its record), if any.
        self.took_over: dict[str, Any] | None = None

    def acquire(self) -> FolderLock:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _holder(fd)
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                raise BenchError(f"{self.folder} is being written by another bench ({describe_holder(holder)}); "
                                 "wait for it to end or choose another output folder") from None  # fmt: skip
            try:
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # locked a file its holder had just removed at its end: lock the folder's own
        previous = _holder(fd)
        if previous:
            self.took_over = previous
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                  "started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}  # fmt: skip
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if _holder(fd).get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
                if self.created:
                    try:
                        self.folder.rmdir()  # only when empty: nothing was written
                    except OSError:
                        pass
        except OSError:
            pass  # a folder gone or read-only by now: the kernel drops the lock with the descriptor
        finally:
            os.close(fd)

    def __enter__(self) -> FolderLock:
        return self.acquire() if self._fd is None else self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder(fd: int) -> dict[str, Any]:
    try:
        data = os.pread(fd, 65536, 0)
        holder = json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def describe_holder(holder: dict[str, Any]) -> str:
    """``pid 123 on host, started 2026-..., command: bench run ...`` (what is known of it)."""
    if not holder:
        return "a process that left no record"
    parts = [f"pid {holder.get('pid', '?')}" + (f" on {holder['host']}" if holder.get("host") else "")]
    if holder.get("started_utc"):
        parts.append(f"started {holder['started_utc']}")
    if holder.get("command"):
        parts.append(f"command: {redact(str(holder['command']))}")
    return ", ".join(parts)


def claim_run_folder(out: Path | str, overwrite: bool, command: Sequence[str] = ()) -> FolderLock:
    """Lock a run's output folder (created when absent) and make it ready for a new run: a
    previous run in it is an error without ``overwrite`` and is replaced with it
    (``clear_run``). Returns the held lock (the caller releases it when the run ends)."""
    out = check_out(out)
    if overwrite:
        refuse_by_name(out)
    if out.exists() and not out.is_dir():
        raise SettingError(f"$out {out} exists and is not a folder")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    lock = FolderLock(out, command, created).acquire()
    try:
        if (out / RUN_FILE).exists():
            if not overwrite:
                raise SettingError(f"$out {out} already holds a run; choose another $out (or pass $overwrite)")
            clear_run(out)
    except BaseException:
        lock.release()
        raise
    return lock


def claim_sweep_folder(out: Path | str, command: Sequence[str] = ()) -> FolderLock:
    """Lock a sweep's output folder (created when absent); the sweep decides what its
    contents allow (a new sweep, a resumed one)."""
    out = check_out(out)
    if out.exists() and not out.is_dir():
        raise SettingError(f"$out {out} exists and is not a folder")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    return FolderLock(out, command, created).acquire()


def took_over_note(lock: FolderLock) -> str | None:
    """The note printed when a lock left by a writer that is no longer running was taken over."""
    if lock.took_over is None:
        return None
    return f"{lock.folder}: took over the lock of a writer that is no longer running ({describe_holder(lock.took_over)})"


def reserve_room(run_dir: Path) -> bool:
    """Keep ``RESERVE_BYTES`` of the disk for the run's last metadata write (``free_room``);
    False when even that much is not free (the run goes on without it)."""
    try:
        with open(Path(run_dir) / RESERVE_FILE, "wb") as f:
            f.write(b"\0" * RESERVE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        free_room(run_dir)
        return False
    return True


def free_room(run_dir: Path) -> None:
    """Give the reserved room back (at the run's end, or to write its metadata on a full disk)."""
    try:
        (Path(run_dir) / RESERVE_FILE).unlink(missing_ok=True)
    except OSError:
        pass
