"""A nanosecond-precise wake-up for the event loop: Linux ``timerfd`` on CLOCK_MONOTONIC.

asyncio's and uvloop's timers have millisecond granularity (uvloop's may even fire early);
``perf_counter_ns`` is CLOCK_MONOTONIC on Linux, so an absolute timerfd deadline wakes the
loop at the intended nanosecond (plus the kernel's wake-up latency, typically < 0.1 ms).
``DeadlineTimer.create()`` returns None where timerfd is unavailable (callers fall back).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
from collections.abc import Callable

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class DeadlineTimer:
    """One timerfd registered with the running loop; ``arm(t_ns)`` calls ``on_fire`` at ``t_ns``."""

    def __init__(self, libc: ctypes.CDLL, fd: int, on_fire: Callable[[], None]) -> None:
        self._libc = libc
        self.fd = fd
        self._on_fire = on_fire
        self._spec = _Itimerspec()
        self._settime = libc.timerfd_settime
        asyncio.get_running_loop().add_reader(fd, self._ready)

    @classmethod
    def create(cls, on_fire: Callable[[], None]) -> "DeadlineTimer | None":
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        try:
            return cls(libc, fd, on_fire)
        except (OSError, NotImplementedError, RuntimeError):
            os.close(fd)
            return None

    def arm(self, t_ns: int) -> None:
        v = self._spec.it_value
        v.tv_sec, v.tv_nsec = divmod(max(t_ns, 1), 1_000_000_000)
        self._settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None)

    def disarm(self) -> None:
        v = self._spec.it_value
        v.tv_sec = v.tv_nsec = 0
        self._settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None)

    def _ready(self) -> None:
        try:
            os.read(self.fd, 8)
        except BlockingIOError:
            return
        self._on_fire()

    def close(self) -> None:
        try:
            asyncio.get_running_loop().remove_reader(self.fd)
        except RuntimeError:
            pass
        os.close(self.fd)
