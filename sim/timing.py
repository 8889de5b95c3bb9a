"""Timing models for the simulated engine.

``FixedTiming``: every request gets the same TTFT and ITL (the instrument-check mode).
The full performance model (batching, KV capacity, parallelism) plugs in beside it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FixedTiming:
    ttft_s: float = 0.05
    itl_s: float = 0.01
    tokens_per_chunk: int = 1

    def __post_init__(self) -> None:
        if self.ttft_s < 0 or self.itl_s < 0:
            raise ValueError("ttft and itl must be >= 0")
        if self.tokens_per_chunk < 1:
            raise ValueError("tokens_per_chunk must be >= 1")
