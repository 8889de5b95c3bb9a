"""Paged KV blocks with a prefix cache by block hashing (as vLLM's block pool).

A request holds *private* blocks (being filled) and *shared* blocks (full prompt blocks
registered under their chained hash). Freed shared blocks stay cached until a new
allocation evicts them, least recently freed first.
"""

from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    __slots__ = ("num_blocks", "prefix_caching", "free", "refs", "evictable", "queries", "hits")

    def __init__(self, num_blocks: int, prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.prefix_caching = prefix_caching
        self.free = num_blocks  # blocks holding nothing
        self.refs: dict[int, int] = {}  # cached block hash -> reference count
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, refcount 0
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # prompt tokens found

    @property
    def available(self) -> int:
        return self.free + len(self.evictable)

    @property
    def used(self) -> int:
        return self.num_blocks - self.available

    @property
    def usage(self) -> float:
        return self.used / self.num_blocks if self.num_blocks else 0.0

    def alloc(self, n: int) -> bool:
        if n <= 0:
            return True
        if self.available < n:
            return False
        take = min(n, self.free)
        self.free -= take
        for _ in range(n - take):
            h, _ = self.evictable.popitem(last=False)
            del self.refs[h]
        return True

    def free_private(self, n: int) -> None:
        self.free += n

    def lookup(self, hashes: tuple[int, ...], limit_blocks: int) -> int:
        """Leading blocks of ``hashes`` present in the cache (at most ``limit_blocks``)."""
        if not self.prefix_caching:
            return 0
        n = 0
        refs = self.refs
        for h in hashes[:limit_blocks]:
            if h not in refs:
                break
            n += 1
        return n

    def acquire(self, h: int) -> None:
        c = self.refs[h]
        if c == 0:
            del self.evictable[h]
        self.refs[h] = c + 1

    def register(self, h: int) -> bool:
        """Turn one private block of the caller into the cached block ``h``."""
        if not self.prefix_caching or h in self.refs:
            return False
        self.refs[h] = 1
        return True

    def release(self, h: int) -> None:
        c = self.refs[h] - 1
        self.refs[h] = c
        if c == 0:
            self.evictable[h] = None

    def release_all(self, hashes: list[int]) -> None:
        """``release`` each of ``hashes`` in order (a finished request's shared blocks)."""
        refs = self.refs
        evictable = self.evictable
        for h in hashes:
            c = refs[h] - 1
            refs[h] = c
            if c == 0:
                evictable[h] = None

    def reset_prefix_cache(self) -> None:
        for h in list(self.evictable):
            del self.refs[h]
        self.free += len(self.evictable)
        self.evictable.clear()
