"""Process-wide tuning for a dedicated simulated-engine process (``bench sim serve``): no garbage
collector scans of start-up objects, short GIL slices, optionally every page locked in memory."""

from __future__ import annotations

import sys


def tune_process(mlock: bool = False) -> None:
    """Process-wide settings for a dedicated engine process (``bench sim serve``)."""
    import gc

    if mlock:
        _mlockall()
    gc.freeze()  # start-up objects (modules, presets) never need scanning again: shorter GC pauses
    sys.setswitchinterval(0.0005)  # the log-writer thread must not hold the GIL for 5 ms slices


def _mlockall() -> None:
    """Keep every page resident: proactive reclaim on a busy host otherwise stalls the engine
    for hundreds of milliseconds when it touches a reclaimed page. Needs CAP_IPC_LOCK/root."""
    try:
        import ctypes
        import os

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if libc.mlockall(3) != 0:  # MCL_CURRENT | MCL_FUTURE
            sys.stderr.write(f"bench sim: --mlock failed: {os.strerror(ctypes.get_errno())}\n")
    except OSError as exc:
        sys.stderr.write(f"bench sim: --mlock unavailable: {exc}\n")
