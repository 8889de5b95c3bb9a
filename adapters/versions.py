"""Engine release numbers: parse them and compare them (version-gated flags and metric names)."""

from __future__ import annotations

import re


def release(version: str) -> tuple[int, ...] | None:
    """``"0.5.23"``, ``"v0.5.3.post1"``, ``"3.3.6-dev0"`` -> (0, 5, 23) ...; None when unreadable."""
    m = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def version_at_least(version: str | None, minimum: str) -> bool | None:
    """Whether ``version`` is at least ``minimum``; None when the version is unknown or unreadable."""
    have = release(version) if version else None
    need = release(minimum)
    if have is None or need is None:
        return None
    width = max(len(have), len(need))  # "3.3" is 3.3.0
    return have + (0,) * (width - len(have)) >= need + (0,) * (width - len(need))


def in_range(version: str, span: tuple[str | None, str | None]) -> bool:
    """Whether release ``version`` lies in ``span`` (post-releases count as their release)."""
    have = release(version)
    if have is None:
        return True
    first, last = (None if v is None else release(v) for v in span)
    if first is not None and have[: len(first)] < first:
        return False
    return last is None or have[: len(last)] <= last
