"""Clock alignment between the master and each worker.

Every process timestamps with ``time.perf_counter_ns`` (CLOCK_MONOTONIC on Linux), whose
zero is arbitrary per machine. The master estimates each worker's offset with a few
ping-pongs over locust's messages (NTP-style: the sample with the smallest round trip
wins, its error is at most half that round trip) at the start, and again at the end to
measure drift. Processes on the same host (same kernel boot id) share the clock exactly,
so their offset is 0 by construction and the measured value only serves as a check.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ClockSample:
    master_send_ns: int
    worker_ns: int
    master_recv_ns: int

    @property
    def rtt_ns(self) -> int:
        return self.master_recv_ns - self.master_send_ns

    @property
    def offset_ns(self) -> int:
        """worker clock minus master clock, assuming a symmetric path."""
        return self.worker_ns - (self.master_send_ns + self.master_recv_ns) // 2


@dataclass(frozen=True, slots=True)
class OffsetEstimate:
    offset_ns: int  # worker minus master
    rtt_ns: int  # round trip of the sample used; the error bound is rtt_ns / 2
    samples: int

    def as_dict(self) -> dict[str, int]:
        return {"offset_ns": self.offset_ns, "rtt_ns": self.rtt_ns, "error_bound_ns": self.rtt_ns // 2, "samples": self.samples}


def estimate_offset(samples: list[ClockSample]) -> OffsetEstimate:
    if not samples:
        raise ValueError("no clock samples")
    best = min(samples, key=lambda s: s.rtt_ns)
    return OffsetEstimate(best.offset_ns, best.rtt_ns, len(samples))


#: Overrides the clock domain; set it to anything on one worker to exercise the
#: cross-machine path (measured offset applied) on a single host, e.g. in tests.
CLOCK_DOMAIN_ENV = "BENCH_CLOCK_DOMAIN"


def boot_id() -> str:
    """Identifies one running kernel (hence one CLOCK_MONOTONIC); hostname as a fallback."""
    if os.environ.get(CLOCK_DOMAIN_ENV):
        return "env:" + os.environ[CLOCK_DOMAIN_ENV]
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "host:" + socket.gethostname()
