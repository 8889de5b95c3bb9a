"""A memo of work a process repeats (the same prompts drawn and hashed for each load of a
sweep), bounded by the total size of what it keeps."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SizedMemo(Generic[K, V]):
    """Values by key, each with a size given when it is put; at most ``limit`` in total. The
    oldest go first to make room, and a value larger than ``limit`` is not kept."""

    __slots__ = ("_items", "limit", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: the total size of what is kept
        self.size = 0
        self._items: dict[K, tuple[V, int]] = {}

    def get(self, key: K) -> V | None:
        hit = self._items.get(key)
        return None if hit is None else hit[0]

    def put(self, key: K, value: V, size: int) -> None:
        old = self._items.pop(key, None)  # replaced, or forgotten when the new value is not kept
        if old is not None:
            self.size -= old[1]
        if size > self.limit:
            return
        items = self._items
        while items and self.size + size > self.limit:
            self.size -= items.pop(next(iter(items)))[1]
        items[key] = (value, size)
        self.size += size

    def clear(self) -> None:
        self._items.clear()
        self.size = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)
