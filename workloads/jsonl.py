"""Reading a JSONL file line by line, with errors that name the file and line (every JSONL
reader of the workload layer: traces, datasets)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from bench_llm.core.limits import MAX_LINE_BYTES, bounded_lines
from bench_llm.workloads.errors import WorkloadError


def file_lines(f: BinaryIO, path: Path) -> Iterator[bytes]:
    """The lines of a workload file, each within ``MAX_LINE_BYTES`` (``WorkloadError`` naming
    the first longer one)."""
    try:
        yield from bounded_lines(f, MAX_LINE_BYTES, str(path))
    except ValueError as exc:
        raise WorkloadError(str(exc)) from None


def not_utf8(path: Path) -> WorkloadError:
    """The error naming the first line of ``path`` that is not UTF-8 text."""
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return WorkloadError(f"{path}:{line_no}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the file as UTF-8")
    return WorkloadError(f"{path}: not UTF-8 text; save the file as UTF-8")


def jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    empty = True
    with open(path, "rb") as f:
        for line_no, raw in enumerate(file_lines(f, path), start=1):
            if not raw.strip():
                continue
            empty = False
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError:
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise not_utf8(path) from None
                raise WorkloadError(f"{path}:{line_no}: not valid JSON (truncated or malformed line)") from None
            if not isinstance(obj, dict):
                raise WorkloadError(f"{path}:{line_no}: expected a JSON object, got {type(obj).__name__}")
            yield line_no, obj
    if empty:
        raise WorkloadError(f"{path}: empty file, no requests")
