"""Arrival processes: intended send offsets (seconds from t0) for n requests, seeded.

Written as ``NAME`` or ``NAME:key=value,key=value`` (lists separated by ``/``):

=========================================  ==============================================
``poisson``                                exponential gaps, mean rate ``--rate``
``gamma:cv=3``                             gamma gaps with coefficient of variation ``cv``
                                           (``burstiness=B`` is accepted too:
                                           ``cv = (1+B)/(1-B)``, 0 = Poisson; or
                                           the gamma ``shape=k``, ``cv = 1/sqrt(k)``)
``constant``                               exactly even spacing ``1/rate``
``onoff:on_s=5,off_s=10``                  Poisson bursts during ON, silence during OFF;
                                           ``--rate`` is the long-run mean rate;
                                           ``random=1``: exponential ON/OFF durations
                                           with those means (a two-state MMPP)
``ramp:start=1,end=20``                    Poisson with the rate rising linearly
                                           (requests/s) over the schedule
``steps:rates=1/2/4/8,step_s=30``          Poisson, piecewise-constant rate per step;
                                           the last rate holds after the last step
``trace:time_scale=0.5``                   the trace's own timestamps, multiplied by
                                           ``time_scale`` (0.5 = twice as fast)
=========================================  ==============================================

Closed-loop concurrency is not an arrival process (there are no send times); it is
chosen by giving ``--concurrency`` instead of ``--rate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from bench_llm.core.pairs import split_pairs
from bench_llm.workloads.errors import WorkloadError

PROCESSES = ("poisson", "gamma", "constant", "onoff", "ramp", "steps", "trace")

_PARAMS: dict[str, tuple[str, ...]] = {
    "poisson": (),
    "gamma": ("cv", "burstiness", "shape"),
    "constant": (),
    "onoff": ("on_s", "off_s", "random"),
    "ramp": ("start", "end"),
    "steps": ("rates", "step_s"),
    "trace": ("time_scale",),
}


@dataclass(frozen=True)
class ArrivalSpec:
    """A parsed arrival process with its parameters."""

    process: str
    params: dict[str, float | tuple[float, ...]] = field(default_factory=dict)

    @property
    def text(self) -> str:
        if not self.params:
            return self.process
        parts = []
        for k, v in self.params.items():
            parts.append(f"{k}={'/'.join(f'{x:g}' for x in v) if isinstance(v, tuple) else f'{v:g}'}")
        return f"{self.process}:{','.join(parts)}"

    def as_dict(self) -> dict[str, object]:
        return {"process": self.process, **{k: list(v) if isinstance(v, tuple) else v for k, v in self.params.items()}}


def parse_arrival(text: str) -> ArrivalSpec:
    """Parse ``NAME[:k=v,...]``; one-line ``WorkloadError`` on nonsense."""
    name, _, rest = text.strip().partition(":")
    name = name.strip().lower()
    if name not in _PARAMS:
        raise WorkloadError(f"arrival {text!r}: unknown process (use one of {', '.join(PROCESSES)})")
    params: dict[str, float | tuple[float, ...]] = {}
    for item, key, value in split_pairs(rest):
        if value is None or key not in _PARAMS[name]:
            known = ", ".join(_PARAMS[name]) or "none"
            raise WorkloadError(f"arrival {text!r}: unknown parameter {item!r} for {name} (known: {known})")
        try:
            nums = tuple(float(v) for v in value.split("/"))
        except ValueError:
            raise WorkloadError(f"arrival {text!r}: {key} needs a number, got {value!r}") from None
        if not all(math.isfinite(x) for x in nums):
            raise WorkloadError(f"arrival {text!r}: {key} must be finite")
        params[key] = nums if key == "rates" else nums[0]
        if key != "rates" and len(nums) != 1:
            raise WorkloadError(f"arrival {text!r}: {key} takes one number")
    return ArrivalSpec(name, params)


def _positive(spec: ArrivalSpec, key: str, value: float | None) -> float:
    if value is None or not (value > 0 and math.isfinite(value)):
        raise WorkloadError(f"arrival {spec.text}: {key} must be a positive number")
    return float(value)


def gamma_cv(spec: ArrivalSpec) -> float:
    if sum(k in spec.params for k in ("cv", "burstiness", "shape")) > 1:
        raise WorkloadError(f"arrival {spec.text}: give one of cv, burstiness, shape")
    if "shape" in spec.params:
        return 1.0 / math.sqrt(_positive(spec, "shape", float(spec.params["shape"])))  # type: ignore[arg-type]
    if "burstiness" in spec.params:
        b = float(spec.params["burstiness"])  # type: ignore[arg-type]
        if not -1 < b < 1:
            raise WorkloadError(f"arrival {spec.text}: burstiness must be in (-1, 1)")
        return (1 + b) / (1 - b)
    return _positive(spec, "cv", float(spec.params.get("cv", 1.0)))  # type: ignore[arg-type]


def offsets_s(spec: ArrivalSpec, n: int, rate: float | None, rng: np.random.Generator) -> np.ndarray:
    """Send offsets in seconds (first request at 0 unless the process says otherwise)."""
    if n <= 0:
        return np.zeros(0)
    p = spec.process
    if p == "trace":
        raise WorkloadError("arrival trace needs a trace file workload (it replays the file's timestamps)")
    if p == "ramp":
        start = float(spec.params.get("start", (rate or 0) / 10))  # type: ignore[arg-type]
        end = float(spec.params.get("end", rate or 0))  # type: ignore[arg-type]
        return _ramp(spec, n, start, end, rng)
    if p == "steps":
        rates = spec.params.get("rates")
        if not isinstance(rates, tuple) or not rates:
            raise WorkloadError(f"arrival {spec.text}: steps needs rates=r1/r2/...")
        step_s = _positive(spec, "step_s", float(spec.params.get("step_s", 0)))  # type: ignore[arg-type]
        for r in rates:
            _positive(spec, "each rate", r)
        return _steps(n, rates, step_s, rng)
    lam = _positive(spec, "rate", rate)
    if p == "poisson":
        gaps = rng.exponential(1.0 / lam, size=n)
    elif p == "gamma":
        cv = gamma_cv(spec)
        k = 1.0 / (cv * cv)
        gaps = rng.gamma(k, 1.0 / (lam * k), size=n)
    elif p == "constant":
        return np.arange(n, dtype=float) / lam
    elif p == "onoff":
        on = _positive(spec, "on_s", float(spec.params.get("on_s", 0)))  # type: ignore[arg-type]
        off = float(spec.params.get("off_s", 0))  # type: ignore[arg-type]
        if off < 0:
            raise WorkloadError(f"arrival {spec.text}: off_s must be >= 0")
        lam_on = lam * (on + off) / on
        on_time = np.cumsum(rng.exponential(1.0 / lam_on, size=n))
        if not spec.params.get("random"):
            return on_time + off * np.floor(on_time / on)
        # two-state MMPP-like: exponential ON and OFF durations with means on_s, off_s
        k = int(on_time[-1] / on * 1.5) + 16
        ons = rng.exponential(on, size=k)
        while ons.sum() < on_time[-1]:
            ons = np.concatenate([ons, rng.exponential(on, size=k)])
        offs = rng.exponential(off, size=len(ons)) if off > 0 else np.zeros(len(ons))
        period = np.searchsorted(np.cumsum(ons), on_time, side="right")
        off_before = np.concatenate([[0.0], np.cumsum(offs)])[period]
        return on_time + off_before
    else:  # pragma: no cover - parse_arrival guards the names
        raise WorkloadError(f"unknown arrival process {p!r}")
    gaps[0] = 0.0
    return np.cumsum(gaps)


def _ramp(spec: ArrivalSpec, n: int, start: float, end: float, rng: np.random.Generator) -> np.ndarray:
    """Inhomogeneous Poisson with rate start -> end over T, T chosen so n requests fit.

    Time rescaling: unit-rate Poisson event times E_i are mapped through the inverse of
    Lambda(t) = start*t + (end-start)*t^2/(2T), with T = 2n/(start+end) so Lambda(T) = n.
    """
    if start < 0 or end < 0 or start + end <= 0:
        raise WorkloadError(f"arrival {spec.text}: ramp needs start, end >= 0 and not both 0 (or give a rate)")
    total = 2.0 * n / (start + end)
    e = np.cumsum(rng.exponential(1.0, size=n))
    a = (end - start) / (2.0 * total)
    if abs(a) < 1e-15:
        return e / start
    # solve a t^2 + start t - e = 0 for t >= 0 (numerically stable form)
    return 2.0 * e / (start + np.sqrt(np.maximum(start * start + 4.0 * a * e, 0.0)))


def ramp_cumulative(t: np.ndarray, start: float, end: float, n: int) -> np.ndarray:
    """Lambda(t) of ``_ramp`` (expected number of arrivals by t); used to test the process."""
    total = 2.0 * n / (start + end)
    return start * t + (end - start) * t * t / (2.0 * total)


def _steps(n: int, rates: tuple[float, ...], step_s: float, rng: np.random.Generator) -> np.ndarray:
    """Piecewise-constant Poisson by time rescaling of unit-rate events."""
    e = np.cumsum(rng.exponential(1.0, size=n))
    edges_lambda = np.concatenate([[0.0], np.cumsum(np.asarray(rates) * step_s)])
    out = np.empty(n)
    k = np.searchsorted(edges_lambda, e, side="right") - 1
    last = len(rates) - 1
    for i in range(n):
        j = min(int(k[i]), last)
        out[i] = j * step_s + (e[i] - edges_lambda[j]) / rates[j]
    return out


def steps_cumulative(t: np.ndarray, rates: tuple[float, ...], step_s: float) -> np.ndarray:
    """Lambda(t) of ``_steps``."""
    edges_lambda = np.concatenate([[0.0], np.cumsum(np.asarray(rates) * step_s)])
    j = np.minimum((t // step_s).astype(int), len(rates) - 1)
    return edges_lambda[j] + (t - j * step_s) * np.asarray(rates)[j]


def spread_buckets(t: np.ndarray, bucket_s: float) -> np.ndarray:
    """Spread requests sharing a quantised timestamp evenly over [t, t + bucket_s).

    Requests keep their file order within a bucket; k requests in a bucket go out at
    t + bucket_s * i / k for i = 0..k-1.
    """
    if bucket_s <= 0 or len(t) == 0:
        return t.astype(float)
    out = t.astype(float).copy()
    order = np.argsort(t, kind="stable")
    ts = t[order]
    starts = np.flatnonzero(np.concatenate([[True], ts[1:] != ts[:-1]]))
    ends = np.concatenate([starts[1:], [len(ts)]])
    for s, e in zip(starts, ends):
        k = e - s
        out[order[s:e]] = ts[s] + bucket_s * np.arange(k) / k
    return out


def trace_offsets(timestamps_s: np.ndarray, time_scale: float, bucket_s: float = 0.0) -> np.ndarray:
    """Replay offsets: spread quantised buckets, start at 0, scale time."""
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise WorkloadError("arrival trace: time_scale must be a positive number")
    t = spread_buckets(np.asarray(timestamps_s, dtype=float), bucket_s)
    return (t - (t.min() if len(t) else 0.0)) * time_scale
