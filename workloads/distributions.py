"""Token-length distributions: fixed, uniform, normal, lognormal, empirical quantile tables.

Every distribution draws integer lengths >= 1 from a numpy ``Generator``; the same
generator state gives the same draws. ``LengthPair`` samples (input, output) pairs,
either independently or jointly (an input quantile table plus one output quantile
table per input bin: the conditional distribution, so correlation survives).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bench_llm.workloads.errors import WorkloadError


class LengthDist(Protocol):
    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray: ...

    def describe(self) -> dict[str, object]: ...


def stratified_uniform(n: int, rng: np.random.Generator) -> np.ndarray:
    """n uniforms, one in each interval [i/n, (i+1)/n), in random order.

    Each draw is still uniform on [0, 1), but the sample's quantiles sit within 1/n of
    the target's, so a run of a few hundred requests already follows the table closely
    (plain i.i.d. draws would leave the tails to chance).
    """
    return (rng.permutation(n) + rng.random(n)) / n


def _clip(x: np.ndarray, lo: int, hi: int | None) -> np.ndarray:
    out = np.rint(x)
    out = np.maximum(out, max(1, lo))
    if hi is not None:
        out = np.minimum(out, hi)
    return out.astype(np.int64)


@dataclass(frozen=True, slots=True)
class Fixed:
    value: int

    def __post_init__(self) -> None:
        if self.value < 1:
            raise WorkloadError(f"fixed length must be >= 1, got {self.value}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    def describe(self) -> dict[str, object]:
        return {"kind": "fixed", "value": self.value}


@dataclass(frozen=True, slots=True)
class Uniform:
    """Integers uniform on [low, high], both included."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise WorkloadError(f"uniform lengths need 1 <= low <= high, got low={self.low} high={self.high}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)

    def describe(self) -> dict[str, object]:
        return {"kind": "uniform", "low": self.low, "high": self.high}


@dataclass(frozen=True, slots=True)
class Normal:
    """Rounded normal, clipped to [min, max] (min at least 1)."""

    mean: float
    std: float
    min: int = 1
    max: int | None = None

    def __post_init__(self) -> None:
        if not (self.std >= 0 and np.isfinite(self.mean) and np.isfinite(self.std)):
            raise WorkloadError(f"normal lengths need a finite mean and std >= 0, got mean={self.mean} std={self.std}")
        _check_bounds(self.min, self.max)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return _clip(rng.normal(self.mean, self.std, size=n), self.min, self.max)

    def describe(self) -> dict[str, object]:
        return {"kind": "normal", "mean": self.mean, "std": self.std, "min": self.min, "max": self.max}


@dataclass(frozen=True, slots=True)
class LogNormal:
    """``ln X ~ N(mu, sigma^2)`` (median ``exp(mu)``), rounded and clipped."""

    mu: float
    sigma: float
    min: int = 1
    max: int | None = None

    def __post_init__(self) -> None:
        if not (self.sigma >= 0 and np.isfinite(self.mu) and np.isfinite(self.sigma)):
            raise WorkloadError(f"lognormal lengths need a finite mu and sigma >= 0, got mu={self.mu} sigma={self.sigma}")
        _check_bounds(self.min, self.max)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return _clip(rng.lognormal(self.mu, self.sigma, size=n), self.min, self.max)

    def describe(self) -> dict[str, object]:
        return {"kind": "lognormal", "mu": self.mu, "sigma": self.sigma, "min": self.min, "max": self.max}


@dataclass(frozen=True, slots=True)
class Empirical:
    """An empirical quantile table sampled by its piecewise-linear inverse CDF.

    ``probs`` rise from 0 to 1; ``values[i]`` is the ``probs[i]`` quantile. A uniform
    draw ``u`` maps to the straight line between the two surrounding knots, which is
    exactly how numpy's default (linear) percentile interpolates, so the table's knots
    are reproduced by large samples. Draws are stratified (``stratified_uniform``).
    """

    probs: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        p = np.asarray(self.probs, dtype=float)
        v = np.asarray(self.values, dtype=float)
        if len(p) < 2 or len(p) != len(v):
            raise WorkloadError("an empirical table needs at least 2 (prob, value) points of equal count")
        if abs(p[0]) > 1e-12 or abs(p[-1] - 1) > 1e-12 or np.any(np.diff(p) <= 0):
            raise WorkloadError("empirical quantile probabilities must rise strictly from 0 to 1")
        if np.any(np.diff(v) < 0) or v[0] < 1 or not np.all(np.isfinite(v)):
            raise WorkloadError("empirical quantile values must be finite, >= 1 and non-decreasing")

    def inverse_cdf(self, u: np.ndarray) -> np.ndarray:
        return np.interp(u, self.probs, self.values)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return _clip(self.inverse_cdf(stratified_uniform(n, rng)), 1, None)

    def quantile(self, q: float) -> float:
        return float(np.interp(q, self.probs, self.values))

    def describe(self) -> dict[str, object]:
        return {
            "kind": "empirical",
            "points": len(self.probs),
            "p5": self.quantile(0.05),
            "p50": self.quantile(0.5),
            "p95": self.quantile(0.95),
        }


def _check_bounds(lo: int, hi: int | None) -> None:
    if lo < 1:
        raise WorkloadError(f"min length must be >= 1, got {lo}")
    if hi is not None and hi < lo:
        raise WorkloadError(f"max length {hi} is below min {lo}")


@dataclass(frozen=True, slots=True)
class IndependentPair:
    """Input and output lengths drawn independently."""

    input: LengthDist
    output: LengthDist

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return self.input.sample(n, rng), self.output.sample(n, rng)

    def describe(self) -> dict[str, object]:
        return {"kind": "independent", "input": self.input.describe(), "output": self.output.describe()}


@dataclass(frozen=True, slots=True)
class ConditionalPair:
    """Joint (input, output) sampling through a binned empirical copula.

    The input comes from its quantile table at a uniform draw ``u``. ``bin_edges`` are
    input-quantile probabilities splitting ``u`` into bins; ``rank_values[b]`` is the
    quantile table (at ``rank_probs``) of the *output ranks* (output CDF values, 0..1)
    of requests in bin ``b``. The output is the output table's inverse CDF at a rank
    drawn from the bin's table. Working in rank space keeps the output marginal equal
    to its own fine table while the bins carry the dependence.
    """

    input: Empirical
    output: Empirical
    bin_edges: tuple[float, ...]
    rank_probs: tuple[float, ...]
    rank_values: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if len(self.bin_edges) != len(self.rank_values) + 1 or not self.rank_values:
            raise WorkloadError("a joint table needs one rank table per input bin")
        for table in self.rank_values:
            if len(table) != len(self.rank_probs) or np.any(np.diff(table) < 0):
                raise WorkloadError("joint rank tables must be non-decreasing with one value per probability")

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        u = stratified_uniform(n, rng)
        inputs = _clip(self.input.inverse_cdf(u), 1, None)
        bins = np.clip(np.searchsorted(self.bin_edges, u, side="right") - 1, 0, len(self.rank_values) - 1)
        v = stratified_uniform(n, rng)
        ranks = np.empty(n)
        for b, table in enumerate(self.rank_values):
            mask = bins == b
            if mask.any():
                ranks[mask] = np.interp(v[mask], self.rank_probs, table)
        # Re-spread the drawn ranks so their marginal is exactly stratified uniform while
        # their order (the dependence on the input) is kept.
        spread = np.empty(n)
        spread[np.argsort(ranks, kind="stable")] = (np.arange(n) + rng.random(n)) / n
        return inputs, _clip(self.output.inverse_cdf(spread), 1, None)

    def describe(self) -> dict[str, object]:
        return {
            "kind": "joint",
            "input": self.input.describe(),
            "output": self.output.describe(),
            "input_bins": len(self.rank_values),
        }


@dataclass(frozen=True, slots=True)
class Mixture:
    """A weighted mixture of pair distributions (e.g. a long/short mix)."""

    weights: tuple[float, ...]
    components: tuple[IndependentPair | ConditionalPair, ...]
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.components or len(self.weights) != len(self.components):
            raise WorkloadError("a mix needs one weight per component")
        if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
            raise WorkloadError("mix weights must be >= 0 with a positive sum")

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        inputs, outputs, _ = self.sample_labelled(n, rng)
        return inputs, outputs

    def label(self, i: int) -> str:
        return self.labels[i] if i < len(self.labels) and self.labels[i] else f"c{i}"

    def sample_labelled(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Lengths and each request's component label (its class: 'short', 'long' …); the same
        draws as ``sample``, so a seeded schedule does not change."""
        w = np.asarray(self.weights, dtype=float)
        which = rng.choice(len(self.components), size=n, p=w / w.sum())
        inputs = np.empty(n, dtype=np.int64)
        outputs = np.empty(n, dtype=np.int64)
        for c, comp in enumerate(self.components):
            mask = which == c
            k = int(mask.sum())
            if k:
                i, o = comp.sample(k, rng)
                inputs[mask], outputs[mask] = i, o
        return inputs, outputs, np.array([self.label(int(c)) for c in range(len(self.components))], dtype=object)[which]

    def describe(self) -> dict[str, object]:
        return {
            "kind": "mix",
            "components": [
                {"weight": w, "label": self.label(i), **c.describe()}
                for i, (w, c) in enumerate(zip(self.weights, self.components))
            ],
        }


PairDist = IndependentPair | ConditionalPair | Mixture
