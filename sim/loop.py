"""The real-time engine loop: one task drives a backend against absolute deadlines.

The loop sleeps until the backend's next event time (a simulated step boundary mapped
1:1 to ``perf_counter_ns``), then lets the backend emit everything due in one pass. A
late wake-up never shifts later deadlines: event times are computed from the previous
step's intended end, not from when the loop woke. On Linux the loop sleeps on a
``timerfd`` armed at the absolute CLOCK_MONOTONIC deadline (``sim.timerfd``), which wakes it
within tens of microseconds. Elsewhere the event loop's timers are used; they have
millisecond granularity (uvloop's can fire up to ~1 ms early), so the loop never sleeps
less than ``min_sleep_ns`` (1 ms): dense deadlines (thousands of streams' tokens per
second) are served in batches at most about a millisecond late, with ~1 000 wake-ups per
second at most; a wake-up that comes back less than a tick early waits out the remainder
on the spot. ``spin_ns`` (default 0) busy-waits the end of every sleep for the tightest
timing at the cost of CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import TYPE_CHECKING, Protocol

from bench_llm.sim.request import SimRequest

if TYPE_CHECKING:
    from bench_llm.sim.timerfd import DeadlineTimer

_now = time.perf_counter_ns


class Backend(Protocol):
    def submit(self, req: SimRequest) -> None: ...
    def abort(self, req: SimRequest) -> None: ...
    def next_event_ns(self) -> int | None: ...
    def advance(self, now: int) -> None: ...


class EngineLoop:
    def __init__(self, backend: Backend, spin_ns: int = 0, min_sleep_ns: int = 1_000_000, precise: bool = True) -> None:
        self.backend = backend
        self.precise = precise
        self._timer: DeadlineTimer | None = None
        self.spin_ns = spin_ns
        self.min_sleep_ns = min_sleep_ns
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.passes = 0
        self.max_lag_ns = 0  # worst lateness of a pass start (since start)
        self._warned_ns = 0

    def submit(self, req: SimRequest) -> None:
        self.backend.submit(req)
        self._kick()

    def abort(self, req: SimRequest) -> None:
        self.backend.abort(req)
        self._kick()

    def _kick(self) -> None:
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _sleep_until(self, t_ns: int) -> None:
        """Sleep until ``t_ns`` on the precise timer (or until a new request kicks the loop)."""
        timer = self._timer
        assert timer is not None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._wake = fut
        timer.arm(t_ns)
        try:
            await fut
        finally:
            self._wake = None

    async def _sleep(self, delay_s: float | None) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._wake = fut
        handle = None
        if delay_s is not None:
            handle = loop.call_later(delay_s, _resolve, fut)
        try:
            await fut
        finally:
            self._wake = None
            if handle is not None:
                handle.cancel()

    async def _run(self) -> None:
        from bench_llm.sim.timerfd import DeadlineTimer

        self._timer = DeadlineTimer.create(self._kick) if self.precise else None
        try:
            await self._run_loop()
        finally:
            if self._timer is not None:
                self._timer.close()
                self._timer = None

    async def _run_loop(self) -> None:
        backend = self.backend
        spin = self.spin_ns
        tick = self.min_sleep_ns
        timer = self._timer
        slept = False
        while True:
            t = backend.next_event_ns()
            if t is None:
                await self._sleep(None)
                continue
            delay = t - _now()
            if timer is not None and delay > spin:
                await self._sleep_until(t - spin)
                continue  # re-read: a new request may have created an earlier event
            if delay > spin:
                if slept and delay <= tick:
                    # woke a little early (millisecond timers): wait out the remainder here rather
                    # than in a chain of zero-delay timers
                    while _now() < t:
                        pass
                else:
                    # never sleep less than a tick: dense deadlines are served in batches, each at
                    # most about a tick late, at ~1/tick wake-ups per second
                    await self._sleep(max(delay - spin, tick) / 1e9)
                    slept = True
                    continue  # re-read: a new request may have created an earlier event
            slept = False
            while _now() < t:
                pass
            now = _now()
            lag = now - t
            if lag > self.max_lag_ns:
                self.max_lag_ns = lag
            if lag > 50_000_000 and now - self._warned_ns > 10_000_000_000:
                self._warned_ns = now
                sys.stderr.write(
                    f"bench sim: emission running {lag / 1e6:.0f} ms behind its deadlines (CPU-bound or host "
                    "busy): streamed timings lag the model; see the emission log\n"
                )
            try:
                backend.advance(now)
            except Exception as exc:  # noqa: BLE001 - keep serving; the error is logged
                sys.stderr.write(f"bench sim: engine step failed: {type(exc).__name__}: {exc}\n")
            self.passes += 1
            if self.passes % 64 == 0:
                await asyncio.sleep(0)  # let request handlers in even when every step is late


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
