"""Writing a text file bench produces (a report, a trend page, CI outputs) in one step.

``write_text_atomic`` writes a hidden temporary file beside the target and renames it into
place, so a reader never sees half a file; on any failure (a full disk, a read-only folder, a
target that is a folder) the temporary file is removed and the ``OSError`` names the target,
which the CLI prints as one ``error:`` line (``bench.errors.os_error_message``).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


def write_text_atomic(path: Path | str, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; its folder is created when absent."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder; give the name of the file to write", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        if exc.filename == str(tmp) and exc.filename2 is None:  # name the file asked for, not ours
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        _remove(tmp)
        raise
    return path


def _remove(tmp: Path) -> None:
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only folder holds no temporary file either
