"""Fitting the modelled engine's constants to measured loads, and scoring it on loads it did not see.

A measured load is what an engine did with a known stream of requests: each request's send time,
prompt and output length, and the TTFT and TPOT measured for it. ``fit`` replays the loads'
sends through the modelled engine in virtual time (the very sends the engine received, warm-up
included, open loop at their recorded times, so a closed loop's pacing is reproduced as it
happened) and moves a few constants, one at a time on a log scale, to minimise the squared log
error of each load's mean TTFT and mean TPOT. The constants (``KNOBS``) are the ones a
deployment changes and a preset cannot know: the per-step fixed time, the CPU time per sequence
in a step, the serving stack's time before a request is scheduled, and the effective compute
and memory rates of the hardware, weights and KV cache apart (for hardware the simulator has no preset for, these are the
rates that matter). What calibration cannot learn: a limit it never saw exercised (an admission
limit, a KV-cache size at a load that never filled it), and anything outside the measured range,
which ``Coverage`` records so predictions beyond it are marked as extrapolation.

Layering: this module knows the simulator only (core and sim); reading run folders is bench's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench_llm.sim.backend import ModelBackend
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.virtual import OK, Plan, Send, run

#: A golden-section search on each knob stops at this relative width (log scale).
_TOLERANCE = 0.02
_GOLDEN = (math.sqrt(5) - 1) / 2


@dataclass(frozen=True, slots=True)
class Knob:
    """One fitted constant: a field of the GPU spec (``gpu``) or of the engine profile (``profile``),
    searched on a log scale within [low, high] (the unit of the field itself)."""

    table: str
    name: str
    low: float
    high: float


#: The constants calibration fits, with the range each may take (wide: a CPU-only host is three
#: orders of magnitude slower than an H100; a busy serving stack adds tens of ms per request).
KNOBS: tuple[Knob, ...] = (
    Knob("profile", "t_fixed_ms", 0.05, 200.0),
    Knob("profile", "per_seq_us", 0.1, 20000.0),
    Knob("profile", "request_overhead_ms", 0.05, 500.0),
    Knob("gpu", "mfu_gemm", 1e-5, 1.0),
    Knob("gpu", "mbu", 1e-5, 1.0),
)
#: For hardware without a preset (a CPU host, a new accelerator): the attention and KV-cache rates
#: too. They trade off against the per-step time unless the loads vary the context length widely.
HARDWARE_KNOBS: tuple[Knob, ...] = (
    *KNOBS,
    Knob("gpu", "mfu_attn", 1e-6, 1.0),
    Knob("gpu", "mbu_kv", 1e-5, 1.0),
)


@dataclass(frozen=True, slots=True)
class MeasuredLoad:
    """One measured load: the sends (virtual-time ``Send`` objects, ``at_ns`` relative to the first
    send; warm-up sends flagged) and, for the measured ones that succeeded, their TTFT and TPOT.

    ``timing``: the modelled engine's configuration this load ran at (parallel layout, limits) before
    calibration. ``measured``: indices into ``sends`` of the requests compared.
    """

    name: str
    timing: ModelTiming
    sends: tuple[Send, ...]
    measured: tuple[int, ...]
    ttft_ms: tuple[float, ...]
    tpot_ms: tuple[float, ...]
    e2e_ms: tuple[float, ...]
    duration_s: float

    @property
    def mean_ttft_ms(self) -> float:
        return _mean(self.ttft_ms)

    @property
    def mean_tpot_ms(self) -> float:
        return _mean(self.tpot_ms)

    @property
    def mean_e2e_ms(self) -> float:
        return _mean(self.e2e_ms)

    @property
    def throughput_rps(self) -> float:
        return len(self.measured) / self.duration_s if self.duration_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Prediction:
    """The modelled engine's figures for one load (means over the same requests)."""

    ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    throughput_rps: float


@dataclass(frozen=True, slots=True)
class Coverage:
    """The range the loads measured: a prediction outside it is an extrapolation."""

    max_in_flight: int
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    tp: tuple[int, int]
    max_num_seqs: tuple[int, int]

    def outside(self, load: MeasuredLoad, in_flight: int) -> list[str]:
        """What about ``load`` lies outside the measured range (empty: inside)."""
        prompts = [load.sends[i].prompt_len for i in load.measured]
        outputs = [load.sends[i].max_tokens for i in load.measured]
        seqs = load.timing.limits()[0]
        out = []
        if in_flight > self.max_in_flight:
            out.append(f"{in_flight} requests in flight (measured up to {self.max_in_flight})")
        if prompts and not self.prompt_tokens[0] <= max(prompts) <= self.prompt_tokens[1]:
            out.append(f"prompts of {max(prompts)} tokens (measured {self.prompt_tokens[0]}-{self.prompt_tokens[1]})")
        if outputs and not self.output_tokens[0] <= max(outputs) <= self.output_tokens[1]:
            out.append(f"outputs of {max(outputs)} tokens (measured {self.output_tokens[0]}-{self.output_tokens[1]})")
        if not self.tp[0] <= load.timing.tp <= self.tp[1]:
            out.append(f"tp {load.timing.tp} (measured {self.tp[0]}-{self.tp[1]})")
        if not self.max_num_seqs[0] <= seqs <= self.max_num_seqs[1]:
            out.append(f"max_num_seqs {seqs} (measured {self.max_num_seqs[0]}-{self.max_num_seqs[1]})")
        return out


def coverage(loads: Sequence[MeasuredLoad]) -> Coverage:
    prompts = [ld.sends[i].prompt_len for ld in loads for i in ld.measured]
    outputs = [ld.sends[i].max_tokens for ld in loads for i in ld.measured]
    return Coverage(
        max(max_in_flight(ld) for ld in loads),
        (min(prompts), max(prompts)), (min(outputs), max(outputs)),
        (min(ld.timing.tp for ld in loads), max(ld.timing.tp for ld in loads)),
        (min(ld.timing.limits()[0] for ld in loads), max(ld.timing.limits()[0] for ld in loads)),
    )


def max_in_flight(load: MeasuredLoad) -> int:
    """The most measured requests in flight at once, from their send and end times."""
    events = []
    for k, i in enumerate(load.measured):
        start = load.sends[i].at_ns or 0
        events += [(start, 1), (start + int(load.e2e_ms[k] * 1e6), -1)]
    level = peak = 0
    for _, step in sorted(events):
        level += step
        peak = max(peak, level)
    return peak


def with_values(timing: ModelTiming, values: dict[Knob, float]) -> ModelTiming:
    """``timing`` with the knobs' values written into its GPU spec and engine profile."""
    gpu: dict[str, Any] = {k.name: v for k, v in values.items() if k.table == "gpu"}
    profile: dict[str, Any] = {k.name: v for k, v in values.items() if k.table == "profile"}
    return dataclasses.replace(
        timing,
        gpu_spec=dataclasses.replace(timing.gpu_model, **gpu) if gpu else timing.gpu_spec,
        profile_spec=dataclasses.replace(timing.engine_profile, **profile) if profile else timing.profile_spec,
    )


def current_values(timing: ModelTiming, knobs: Sequence[Knob] = KNOBS) -> dict[Knob, float]:
    return {k: float(getattr(timing.gpu_model if k.table == "gpu" else timing.engine_profile, k.name)) for k in knobs}


def predict(timing: ModelTiming, load: MeasuredLoad) -> Prediction:
    """Replay ``load``'s sends through the modelled engine at ``timing``; the means over the measured
    requests (a request the model did not complete counts with its TTFT/E2E at the replay's end)."""
    result = run(ModelBackend(timing), load.sends, Plan(warmup_concurrency=1))
    ttft, tpot, e2e = [], [], []
    for i in load.measured:
        out = load.sends[i]
        o = result.outcomes[i]
        start = result.t0_ns + (out.at_ns or 0)
        if o.state != OK or not o.token_ns or o.end_ns is None:
            ttft.append((result.end_ns - start) / 1e6)
            e2e.append((result.end_ns - start) / 1e6)
            continue
        ttft.append((o.token_ns[0] - o.intended_ns) / 1e6)
        e2e.append((o.end_ns - o.intended_ns) / 1e6)
        if len(o.token_ns) > 1:
            tpot.append((o.token_ns[-1] - o.token_ns[0]) / (len(o.token_ns) - 1) / 1e6)
    span_s = max((result.end_ns - result.t0_ns) / 1e9, 1e-9)
    return Prediction(_mean(ttft), _mean(tpot), _mean(e2e), len(load.measured) / span_s)


@dataclass(frozen=True)
class Fit:
    """The fitted constants, what they were, and the error before and after on the fitting loads."""

    before: dict[Knob, float]
    after: dict[Knob, float]
    error_before: float
    error_after: float
    evaluations: int


def fit(
    loads: Sequence[MeasuredLoad],
    knobs: Sequence[Knob] = KNOBS,
    rounds: int = 3,
    progress: Callable[[str], None] | None = None,
    restarts: int = 8,
) -> Fit:
    """Coordinate descent: each knob in turn by golden-section search on a log scale, ``rounds`` times,
    then up to ``restarts`` simplex searches (0: none; a planned sweep's cheap re-fit).

    The same knob values apply to every load (one engine, one host); each load keeps its own
    layout and limits. Deterministic: the loads' replays are, and so is the search.
    """
    before = current_values(loads[0].timing, knobs)
    # searched on a log scale: a shipped 0 (no per-sequence time) starts at the range's floor
    values = {k: min(max(v, k.low), k.high) for k, v in before.items()}
    count = 0

    def error(v: dict[Knob, float]) -> float:
        nonlocal count
        count += 1
        return log_error_many(loads, v)

    best = start = error(values)
    for r in range(rounds):
        for knob in knobs:
            lo, hi = math.log(knob.low), math.log(knob.high)

            def at(x: float, knob: Knob = knob) -> float:
                return error({**values, knob: math.exp(x)})

            x, e = _golden(at, lo, hi, math.log(min(max(values[knob], knob.low), knob.high)), best)
            if e < best:
                values[knob], best = math.exp(x), e
        if progress:
            progress(f"round {r + 1}: log error {best:.4f}")
    # Constants that trade off (a per-step fixed time against the weights' read time) leave the
    # coordinate search crawling along a valley: a simplex search in log space follows it.
    for _ in range(restarts):  # restarted: a collapsed simplex stalls short of the valley's floor
        values, improved = _simplex(values, best, list(knobs), error)
        if improved > best * 0.99:
            best = min(best, improved)
            break
        best = improved
    if progress and restarts:
        progress(f"simplex: log error {best:.4f}")
    return Fit(before, values, start, best, count)


def _simplex(values: dict[Knob, float], best: float, knobs: list[Knob],
             error: Callable[[dict[Knob, float]], float], iterations: int = 300) -> tuple[dict[Knob, float], float]:
    """Nelder-Mead on the knobs' logarithms (clamped to their ranges), from ``values``."""
    def point(x: list[float]) -> dict[Knob, float]:
        return {**values, **{k: math.exp(min(max(v, math.log(k.low)), math.log(k.high))) for k, v in zip(knobs, x)}}

    x0 = [math.log(values[k]) for k in knobs]
    simplex = [(best, x0)]
    for i, k in enumerate(knobs):
        x = list(x0)
        x[i] += 0.2 if x0[i] + 0.2 <= math.log(k.high) else -0.2  # stay inside the range
        simplex.append((error(point(x)), x))
    for _ in range(iterations):
        simplex.sort(key=lambda s: s[0])
        if simplex[-1][0] - simplex[0][0] < 1e-7:
            break
        centroid = [sum(s[1][i] for s in simplex[:-1]) / len(knobs) for i in range(len(knobs))]
        worst_f, worst = simplex[-1]

        def toward(a: float) -> list[float]:
            return [c + a * (w - c) for c, w in zip(centroid, worst)]

        xr = toward(-1.0)
        fr = error(point(xr))
        if fr < simplex[0][0]:
            xe = toward(-2.0)
            fe = error(point(xe))
            simplex[-1] = (fe, xe) if fe < fr else (fr, xr)
        elif fr < simplex[-2][0]:
            simplex[-1] = (fr, xr)
        else:
            xc = toward(0.5)
            fc = error(point(xc))
            if fc < worst_f:
                simplex[-1] = (fc, xc)
            else:
                lead = simplex[0][1]
                simplex = [simplex[0]] + [
                    (error(point(y)), y) for y in ([lw + 0.5 * (v - lw) for lw, v in zip(lead, s[1])] for s in simplex[1:])
                ]
    simplex.sort(key=lambda s: s[0])
    f, x = simplex[0]
    return (point(x), f) if f < best else (values, best)


def log_error_many(loads: Sequence[MeasuredLoad], values: dict[Knob, float]) -> float:
    total = 0.0
    for load in loads:
        p = predict(with_values(load.timing, values), load)
        total += _sq_log(p.ttft_ms, load.mean_ttft_ms) + _sq_log(p.tpot_ms, load.mean_tpot_ms)
    return total / max(1, 2 * len(loads))


def _golden(f: Callable[[float], float], lo: float, hi: float, x0: float, f0: float) -> tuple[float, float]:
    """Minimum of ``f`` on [lo, hi] by golden-section search; (x0, f0) is kept if nothing beats it.
    The bracket is first narrowed around x0 by a coarse scan (the error is not unimodal over
    three orders of magnitude: a knob that stops mattering leaves a plateau)."""
    grid = [lo + (hi - lo) * k / 8 for k in range(9)]
    scores = [f(x) for x in grid]
    k = min(range(len(grid)), key=scores.__getitem__)
    best_x, best_f = (grid[k], scores[k]) if scores[k] < f0 else (x0, f0)
    a, b = grid[max(0, k - 1)], grid[min(len(grid) - 1, k + 1)]
    c, d = b - _GOLDEN * (b - a), a + _GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    while b - a > _TOLERANCE:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - _GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _GOLDEN * (b - a)
            fd = f(d)
    for x, fx in ((c, fc), (d, fd)):
        if fx < best_f:
            best_x, best_f = x, fx
    return best_x, best_f


@dataclass(frozen=True, slots=True)
class MetricScore:
    """Held-out accuracy of one metric over loads: median |relative error|, median signed error
    (bias: > 0 means the model predicts too high), and Pearson's r between predicted and measured."""

    metric: str
    loads: int
    median_abs_error: float
    bias: float
    correlation: float | None


def score(loads: Sequence[MeasuredLoad], timing_for: Callable[[MeasuredLoad], ModelTiming]) -> list[MetricScore]:
    """Per metric (TTFT, TPOT, E2E, throughput), how the model at ``timing_for(load)`` does on ``loads``."""
    pairs: dict[str, list[tuple[float, float]]] = {"ttft_ms": [], "tpot_ms": [], "e2e_ms": [], "throughput_rps": []}
    for load in loads:
        p = predict(timing_for(load), load)
        pairs["ttft_ms"].append((p.ttft_ms, load.mean_ttft_ms))
        pairs["tpot_ms"].append((p.tpot_ms, load.mean_tpot_ms))
        pairs["e2e_ms"].append((p.e2e_ms, load.mean_e2e_ms))
        pairs["throughput_rps"].append((p.throughput_rps, load.throughput_rps))
    out = []
    for metric, pts in pairs.items():
        rel = sorted((pred - meas) / meas for pred, meas in pts if meas > 0)
        out.append(MetricScore(metric, len(rel), _median([abs(r) for r in rel]), _median(rel), _pearson(pts)))
    return out


def _sq_log(pred: float, meas: float) -> float:
    if meas <= 0 or pred <= 0 or not math.isfinite(pred):
        return 25.0 if meas > 0 else 0.0  # a failed prediction: as bad as a 150x miss
    return math.log(pred / meas) ** 2


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def _pearson(pts: Sequence[tuple[float, float]]) -> float | None:
    if len(pts) < 3:
        return None
    xs, ys = [p for p, _ in pts], [m for _, m in pts]
    mx, my = _mean(xs), _mean(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / (sx * sy)


def profile_toml(fitted: Fit, cov: Coverage, held_out: Sequence[MetricScore], source: str) -> str:
    """The calibrated profile as a ``bench sim serve --config`` file: [gpu] and [profile] overrides,
    with what it was fitted on, its coverage and its held-out accuracy as comments."""
    lines = [
        "# bench sim calibrate: the simulated engine's constants fitted to measured loads.",
        f"# fitted on: {source}",
        f"# coverage: up to {cov.max_in_flight} requests in flight, prompts {cov.prompt_tokens[0]}-"
        f"{cov.prompt_tokens[1]} tokens, outputs {cov.output_tokens[0]}-{cov.output_tokens[1]} tokens, "
        f"tp {cov.tp[0]}-{cov.tp[1]}, max_num_seqs {cov.max_num_seqs[0]}-{cov.max_num_seqs[1]}",
        f"# log error on the fitting loads: {fitted.error_before:.4f} before, {fitted.error_after:.4f} after",
    ]
    for s in held_out:
        r = "n/a" if s.correlation is None else f"{s.correlation:.3f}"
        lines.append(f"# held out, {s.metric}: median |error| {s.median_abs_error:.1%}, bias {s.bias:+.1%}, r {r} "
                     f"({s.loads} loads)")
    for table in ("gpu", "profile"):
        lines += ["", f"[{table}]"]
        for k, v in fitted.after.items():
            if k.table == table:
                lines.append(f"{k.name} = {v:.6g}  # was {fitted.before[k]:.6g}")
    return "\n".join(lines) + "\n"
