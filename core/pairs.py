"""The one parser of ``key=value,key=value`` text (parallel layouts, SLOs, fault mixes, arrival parameters)."""

from __future__ import annotations

from typing import NamedTuple


class Pair(NamedTuple):
    item: str  # the item as written (stripped), for error messages
    key: str  # stripped
    value: str | None  # None: the item has no '='


def split_pairs(text: str) -> list[Pair]:
    """Comma-separated items, blanks skipped; each split at its first ``=``.

    The caller words its own error for an item without ``=`` or an unknown key, in the
    vocabulary of the setting it parses."""
    out = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        out.append(Pair(item, key.strip(), value if sep else None))
    return out
