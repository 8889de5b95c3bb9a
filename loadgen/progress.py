"""A one-line progress display on stderr (only when stderr is a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, label: str = "run", stream: TextIO | None = None, enabled: bool | None = None):
        self.total = max(total, 1)
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._start = time.monotonic()
        self._last_len = 0

    def update(self, done: int, in_flight: int, errors: int) -> None:
        if not self.enabled:
            return
        width = 24
        filled = min(width, int(width * done / self.total))
        elapsed = time.monotonic() - self._start
        rate = done / elapsed if elapsed > 0 else 0.0
        line = (
            f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} "
            f"in-flight {in_flight} errors {errors} {rate:.1f} req/s {elapsed:.0f}s"
        )
        pad = max(0, self._last_len - len(line))
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()
        self._last_len = len(line)

    def close(self) -> None:
        if self.enabled and self._last_len:
            self.stream.write("\n")
            self.stream.flush()
