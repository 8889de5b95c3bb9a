"""How a bench process hands memory back to the OS (docs/metrics.md, Memory).

Two allocators hold a bench process's heap: glibc's (Python objects, numpy) and the one Arrow
allocates its buffers from. pyarrow's default, mimalloc, keeps the pages a thread freed for
that thread; the writer threads of a recording and the reader and summary threads at its end
each kept their own, and nothing returned them (measured, a 60 s run at 1024 streams:
226 MB during the recording with mimalloc, 186 MB with glibc's allocator).
``use_system_allocator`` makes Arrow allocate from glibc, whose free pages
``return_freed_memory`` returns from every thread's arena at once.
"""

from __future__ import annotations

import os
from typing import Any

#: The variable Arrow reads, once, when it first allocates.
ARROW_POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"


#: Whether this process set the variable itself (the user did not): engines it launches
#: must not inherit a setting bench made for its own memory.
_SET_HERE = False


def use_system_allocator() -> None:
    """Make Arrow allocate from the system allocator in this process (and bench's own child
    processes), unless ``ARROW_DEFAULT_MEMORY_POOL`` is set already. Takes effect only before
    Arrow's first allocation: call it before pyarrow is imported."""
    global _SET_HERE
    if ARROW_POOL_VARIABLE not in os.environ:
        os.environ[ARROW_POOL_VARIABLE] = "system"
        _SET_HERE = True


def user_environment() -> dict[str, str]:
    """This process's environment as the user gave it: without what bench set for its own
    memory. An engine bench launches is measured, so it gets the user's environment."""
    env = dict(os.environ)
    if _SET_HERE:
        env.pop(ARROW_POOL_VARIABLE, None)
    return env


def _libc() -> Any:
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


_LIBC = _libc()


def return_freed_memory() -> None:
    """Give the pages of freed heap blocks back to the OS (glibc ``malloc_trim``, every
    arena: worker threads allocate in their own); a no-op where glibc is absent."""
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)
