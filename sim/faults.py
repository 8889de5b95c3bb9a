"""Fault injection (``--faults``): seeded, per-request decisions.

Spec: comma-separated ``mode=rate`` items, e.g.
``reset=0.1,http500=0.05,http503=0.02,http429=0.02,stall=0.05:5s,malformed=0.01,
split_utf8=0.1,multi_token=0.2,no_done=0.01,slow_start=3s``.

* ``reset``: the connection is aborted mid-stream (after a random token).
* ``http500`` / ``http503`` / ``http429``: the request is answered with that status.
* ``stall=RATE:DURATION``: the stream stops sending for DURATION at a random token.
* ``malformed``: one stream event carries invalid JSON.
* ``split_utf8``: one token carries a multi-byte character whose bytes are sent in two
  separate writes (a correct client still records the request as a success).
* ``multi_token``: the stream's events carry several tokens each (success; exact
  counts come from usage).
* ``no_done``: the stream ends without its end marker (``[DONE]``; TGI: without the
  final event).
* ``stream_error``: after a random token the stream carries the engine's own in-stream error
  event (HTTP 200 already sent): SGLang ``{"error": {message, type, code, retryable}}`` then
  ``[DONE]``; TGI ``{"error", "error_type": "generation"}``; vLLM ``{"error": {...}}`` then
  ``[DONE]``.
* ``abort``: the engine aborts the request mid-stream: SGLang's last event has
  ``finish_reason {"type": "abort"}`` (its OpenAI routes: ``finish_reason: "abort"``); TGI,
  which has no abort, sends its generation error; vLLM's stream ends with ``finish_reason: "abort"``.
* ``slow_start=DURATION``: health checks (and requests) answer 503 for DURATION after start.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench_llm.core.errors import SettingError
from bench_llm.core.pairs import split_pairs

RATE_MODES = ("reset", "http500", "http503", "http429", "stall", "malformed", "split_utf8", "multi_token", "no_done",
              "stream_error", "abort")


class FaultSpecError(SettingError):
    """A malformed ``faults`` setting (named ``$faults``: the CLI shows its flag)."""


def _duration(text: str, what: str) -> float:
    t = text.strip().lower()
    try:
        if t.endswith("ms"):
            return float(t[:-2]) / 1000
        if t.endswith("s"):
            return float(t[:-1])
        return float(t)
    except ValueError:
        raise FaultSpecError(f"$faults {what}: bad duration {text!r} (e.g. 5s, 200ms)") from None


@dataclass(frozen=True, slots=True)
class FaultSpec:
    reset: float = 0.0
    http500: float = 0.0
    http503: float = 0.0
    http429: float = 0.0
    stall: float = 0.0
    stall_s: float = 5.0
    malformed: float = 0.0
    split_utf8: float = 0.0
    multi_token: float = 0.0
    no_done: float = 0.0
    stream_error: float = 0.0
    abort: float = 0.0
    slow_start_s: float = 0.0

    @classmethod
    def parse(cls, text: str | None) -> "FaultSpec":
        if not text:
            return cls()
        values: dict[str, float] = {}
        for item, key, val in split_pairs(text):
            if val is None:
                raise FaultSpecError(f"$faults item {item!r}: expected mode=rate")
            if key == "slow_start":
                values["slow_start_s"] = _duration(val, key)
                continue
            if key not in RATE_MODES:
                raise FaultSpecError(f"$faults: unknown mode {key!r} (known: {', '.join(RATE_MODES)}, slow_start)")
            rate_text = val
            if key == "stall":
                rate_text, _, dur = val.partition(":")
                if dur:
                    values["stall_s"] = _duration(dur, key)
            try:
                rate = float(rate_text)
            except ValueError:
                raise FaultSpecError(f"$faults {key}: rate {rate_text!r} is not a number") from None
            if not 0.0 <= rate <= 1.0:
                raise FaultSpecError(f"$faults {key}: rate must be between 0 and 1")
            values[key] = rate
        return cls(**values)

    @property
    def any(self) -> bool:
        return any(getattr(self, m) > 0 for m in RATE_MODES) or self.slow_start_s > 0


@dataclass(frozen=True, slots=True)
class RequestFaults:
    """What goes wrong for one request (token indices are 0-based; -1: never)."""

    http_status: int = 0
    reset_at: int = -1
    stall_at: int = -1
    stall_s: float = 0.0
    malformed_at: int = -1
    split_at: int = -1
    tokens_per_event: int = 1
    no_done: bool = False
    error_at: int = -1
    abort_at: int = -1

    @property
    def clean(self) -> bool:
        return self == _CLEAN


_CLEAN = RequestFaults()


class FaultPlanner:
    """Draws each request's faults from a seeded generator (reproducible per request order)."""

    def __init__(self, spec: FaultSpec, seed: int = 0) -> None:
        self.spec = spec
        self.rng = random.Random(seed ^ 0x5EED)

    def plan(self, max_tokens: int) -> RequestFaults:
        s = self.spec
        if not s.any:
            return _CLEAN
        r = self.rng.random
        for status, rate in ((500, s.http500), (503, s.http503), (429, s.http429)):
            if rate > 0 and r() < rate:
                return RequestFaults(http_status=status)
        last = max(0, max_tokens - 1)

        def at() -> int:
            return self.rng.randint(0, max(0, last - 1)) if last > 0 else 0

        return RequestFaults(
            reset_at=at() if s.reset > 0 and r() < s.reset else -1,
            stall_at=at() if s.stall > 0 and r() < s.stall else -1,
            stall_s=s.stall_s,
            malformed_at=at() if s.malformed > 0 and r() < s.malformed else -1,
            split_at=at() if s.split_utf8 > 0 and r() < s.split_utf8 else -1,
            tokens_per_event=self.rng.randint(2, 4) if s.multi_token > 0 and r() < s.multi_token else 1,
            no_done=bool(s.no_done > 0 and r() < s.no_done),
            error_at=at() if s.stream_error > 0 and r() < s.stream_error else -1,
            abort_at=at() if s.abort > 0 and r() < s.abort else -1,
        )
