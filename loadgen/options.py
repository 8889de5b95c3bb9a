"""What a run is told (``RunOptions``) and what it counts (``RunStats``): shared by the
runner's three parts (``loadgen/dispatch.py``, ``loadgen/recording.py``,
``loadgen/monitoring.py``) and by the worker pool."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from bench_llm.loadgen.recorder import MAX_EVENT_BYTES


@dataclass(frozen=True, slots=True)
class RunOptions:
    worker_id: int = 0
    #: Stop sending new requests this long after t0 (None: when the schedule is done).
    duration_s: float | None = None
    #: After ``duration_s``, how long in-flight requests may take before being cancelled
    #: (recorded as such). Without a duration every request runs to its end, bounded by the
    #: transport's per-request deadline (``Timeouts.total``).
    drain_timeout_s: float = 30.0
    #: Longest SSE event (or line) a response may carry (``RequestRecorder``).
    max_event_bytes: int = MAX_EVENT_BYTES
    warmup_concurrency: int = 4
    save_text: bool = False
    progress: bool | None = None
    monitor_interval_s: float = 0.1
    #: Delay between building the plan and t0, so the first sends are not late.
    start_lead_s: float = 0.05
    #: An explicit t0 (``perf_counter_ns``, CLOCK_MONOTONIC: shared by every process on the
    #: host) so several worker processes start their shares of one schedule together.
    start_at_ns: int | None = None
    #: Time-based warm-up and cool-down (docs/metrics.md, Which requests count): a measured
    #: request intended to be sent in the first ``warmup_s`` after t0 is recorded with phase
    #: "warmup", one intended in the last ``cooldown_s`` before ``duration_s`` ends with
    #: phase "cooldown"; both are recorded and excluded from every metric.
    warmup_s: float = 0.0
    cooldown_s: float = 0.0

    def __post_init__(self) -> None:
        if self.warmup_s < 0 or self.cooldown_s < 0:
            raise ValueError(f"warmup_s and cooldown_s must be >= 0 (got {self.warmup_s:g}, {self.cooldown_s:g})")
        if self.cooldown_s and self.duration_s is None:
            raise ValueError("cooldown_s needs duration_s: a run without a duration has no known end to count back from")
        if self.duration_s is not None and (self.warmup_s or self.cooldown_s) and self.warmup_s + self.cooldown_s >= self.duration_s:
            raise ValueError(
                f"warmup_s + cooldown_s ({self.warmup_s + self.cooldown_s:g} s) leave nothing of duration_s ({self.duration_s:g} s)"
            )

    def phase_at(self, t0_ns: int, intended_ns: int) -> str | None:
        """The phase a measured request intended at ``intended_ns`` is recorded with when the
        time-based warm-up or cool-down takes it ("warmup", "cooldown"), else None."""
        offset = intended_ns - t0_ns
        if offset < self.warmup_s * 1e9:
            return "warmup"
        if self.cooldown_s and self.duration_s is not None and offset >= (self.duration_s - self.cooldown_s) * 1e9:
            return "cooldown"
        return None


@dataclass(slots=True)
class RunStats:
    sent: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    t0_ns: int = 0
    end_ns: int = 0
    interrupted: bool = False
    #: SSE data payloads the compiled scan took itself, and those the adapter's Python
    #: parser read (on the Python read path, or handed over by the scan): the read-path share.
    payloads_compiled: int = 0
    payloads_python: int = 0
    #: Requests recorded and excluded: in the warm-up (its request count or its time window)
    #: and in the cool-down, counted apart (phase "warmup", "cooldown").
    warmup_excluded: int = 0
    cooldown_excluded: int = 0
    error_types: dict[str, int] = field(default_factory=lambda: defaultdict(int))
