"""Kernel receive timestamps for the raw transport (``loadgen.rawhttp``).

Clocks:
``user``   ``perf_counter_ns()`` taken right after ``recv`` returned.
``kernel`` the kernel's receive timestamp of the data (``SO_TIMESTAMPNS`` read with
           ``recvmsg``): when the last packet of the read reached the socket, however
           late the client gets round to reading it. The kernel stamps CLOCK_REALTIME;
           it is converted to the monotonic ``perf_counter_ns`` timeline with an offset
           re-measured every second. Where the platform gives no timestamp for a read,
           that read falls back to the user stamp and is counted (``describe()``).
"""

from __future__ import annotations

import socket
import struct
import sys
import time

_now = time.perf_counter_ns

#: Linux values (not exported by Python's socket module).
SO_TIMESTAMPNS = 35
#: The ancillary data of a stamped read: one struct timespec, and the room ``recvmsg`` needs for it.
TIMESPEC = struct.Struct("@qq")
ANC_SIZE = socket.CMSG_SPACE(TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0


def kernel_timestamps_supported() -> bool:
    """True when this platform can stamp received TCP data in the kernel."""
    if not sys.platform.startswith("linux") or not hasattr(socket.socket, "recvmsg"):
        return False
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return True
    except OSError:
        return False
    finally:
        s.close()


def realtime_offset_ns(samples: int = 5) -> int:
    """CLOCK_REALTIME minus the perf_counter clock, from the tightest of a few reads."""
    best_width = None
    offset = 0
    for _ in range(samples):
        a = _now()
        r = time.time_ns()
        b = _now()
        if best_width is None or b - a < best_width:
            best_width = b - a
            offset = r - (a + b) // 2
    return offset
