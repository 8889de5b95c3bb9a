"""The most frequent error messages of failed requests (summary, sweep lines, report).

The error type alone (``http_error``) hides the cause; the message holds it ("The model
`m` does not exist", a context-length 400). Messages that differ only in their numbers
(request ids, token counts) are counted together and shown by their first example.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

#: Messages listed per run (summary, report) and per load (one on a sweep line).
TOP_ERRORS = 3
#: Characters of a message shown (the record keeps 500).
MESSAGE_CHARS = 200

_NUMBER = re.compile(r"\d+")


def top_errors(
    error_types: Iterable[Any], messages: Iterable[Any], limit: int = TOP_ERRORS
) -> list[dict[str, Any]]:
    """``[{"error_type", "message", "count"}]`` of the failed requests given (their
    ``error_type`` and ``error_message`` columns), most frequent first."""
    counts: dict[tuple[str, str], int] = {}
    example: dict[tuple[str, str], str] = {}
    for etype, message in zip(error_types, messages):
        t = str(etype) if isinstance(etype, str) else "unknown"
        m = " ".join(message.split()) if isinstance(message, str) else ""
        key = (t, _NUMBER.sub("#", m))
        counts[key] = counts.get(key, 0) + 1
        example.setdefault(key, m)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    return [{"error_type": k[0], "message": _cut(example[k]), "count": n} for k, n in ranked]


def error_line(top: list[dict[str, Any]]) -> str:
    """One line for a terminal: ``3 x http_error: HTTP 404: ...; 1 x timeout: ...``."""
    return "; ".join(
        f"{e['count']} x {e['error_type']}" + (f": {e['message']}" if e["message"] else "") for e in top
    )


def _cut(message: str) -> str:
    return message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 3] + "..."
