"""Built-in workloads reproduce their traces' length percentiles; distributions behave."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench_llm.workloads.builder import plan_workload
from bench_llm.workloads.definition import FITTED, builtins, fitted_document
from bench_llm.workloads.distributions import ConditionalPair, Empirical, Fixed, LogNormal, Normal, Uniform
from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.fit import BUILTIN_SOURCES, spearman
from bench_llm.workloads.readers import read_trace
from tests.conftest import shared_path

N = 100_000
QS = (5, 50, 95)


def _sample(name: str) -> tuple[np.ndarray, np.ndarray]:
    plan = plan_workload(builtins()[name], requests=N, rate=None, arrival=None, concurrency=1, warmup=0, seed=42)
    return plan.input_tokens, plan.output_tokens


def _close(got: float, want: float, what: str) -> None:
    assert abs(got - want) <= 0.02 * want, f"{what}: sampled {got:.1f} vs {want:.1f} ({(got / want - 1) * 100:+.2f} %)"


@pytest.mark.parametrize("name", FITTED)
def test_builtin_matches_shipped_figures(name: str) -> None:
    """100k samples reproduce p5/p50/p95 of the fitted summary shipped with the package."""
    summary = fitted_document(name)["lengths"]["summary"]  # type: ignore[index]
    inputs, outputs = _sample(name)
    for side, x in (("input", inputs), ("output", outputs)):
        for q in QS:
            _close(float(np.percentile(x, q)), float(summary[side][f"p{q}"]), f"{name} {side} p{q}")


@pytest.mark.parametrize("name", FITTED)
def test_builtin_matches_raw_trace(name: str) -> None:
    """Same check against percentiles computed now from the raw trace in ../shared/traces."""
    path = shared_path("traces", BUILTIN_SOURCES[name][0])
    table = read_trace(path)
    inputs, outputs = _sample(name)
    for side, x, ref in (("input", inputs, table.input_tokens), ("output", outputs, table.output_tokens)):
        for q in QS:
            _close(float(np.percentile(x, q)), float(np.percentile(ref, q)), f"{name} {side} p{q}")


def test_shipped_figures_name_source_and_licence() -> None:
    for name in FITTED:
        doc = fitted_document(name)
        assert doc["source"] and doc["licence"] in ("CC-BY-4.0", "Apache-2.0", "MIT")
        assert len(doc["lengths"]["input"]["values"]) <= 201  # type: ignore[index]


def test_joint_table_keeps_negative_correlation() -> None:
    """arXiv summarisation is sampled jointly: Spearman near the trace's (-0.11), not 0."""
    pair = builtins()["arxiv-summarization"].lengths
    assert isinstance(pair, ConditionalPair)
    i, o = pair.sample(N, np.random.default_rng(3))
    rho = spearman(i, o)
    want = fitted_document("arxiv-summarization")["lengths"]["summary"]["spearman"]  # type: ignore[index]
    assert abs(rho - want) < 0.03, (rho, want)


def test_spearman_ranks_ties_alike_in_any_order() -> None:
    """Tied lengths take their mid-rank: the coefficient does not depend on the order the pairs
    come in (ranks from an unstable argsort did, and moved the shipped tables on AVX-512 CPUs)."""
    i = np.array([1, 2, 2, 2, 3, 4, 4, 5])
    o = np.array([5, 3, 4, 1, 2, 2, 6, 1])
    # by hand: mid-ranks of i (1, 3, 3, 3, 5, 6.5, 6.5, 8), of o (7, 5, 6, 1.5, 3.5, 3.5, 8, 1.5)
    ri = np.array([1, 3, 3, 3, 5, 6.5, 6.5, 8])
    ro = np.array([7, 5, 6, 1.5, 3.5, 3.5, 8, 1.5])
    assert spearman(i, o) == pytest.approx(np.corrcoef(ri, ro)[0, 1], abs=1e-12)
    rng = np.random.default_rng(1)
    big_i, big_o = rng.integers(0, 20, 5000), rng.integers(0, 20, 5000)  # many ties
    first = spearman(big_i, big_o)
    for _ in range(3):
        p = rng.permutation(len(big_i))
        assert spearman(big_i[p], big_o[p]) == pytest.approx(first, abs=1e-12)


def test_parametric_distributions() -> None:
    rng = np.random.default_rng(0)
    assert set(Fixed(7).sample(10, rng)) == {7}
    u = Uniform(10, 20).sample(50_000, rng)
    assert u.min() == 10 and u.max() == 20 and abs(u.mean() - 15) < 0.1
    x = Normal(1000, 100, max=1100).sample(50_000, rng)
    assert x.max() == 1100 and abs(np.median(x) - 1000) < 5
    ln = LogNormal(6.0, 0.5).sample(50_000, rng)
    assert abs(np.median(ln) / np.exp(6.0) - 1) < 0.02
    e = Empirical((0.0, 0.5, 1.0), (1.0, 100.0, 300.0)).sample(100_000, rng)
    assert abs(np.percentile(e, 50) - 100) < 2 and abs(np.percentile(e, 75) - 200) < 3


@pytest.mark.parametrize(
    "make",
    [
        lambda: Fixed(0),
        lambda: Uniform(5, 2),
        lambda: Normal(10, -1),
        lambda: LogNormal(1, 1, min=5, max=2),
        lambda: Empirical((0.0, 0.7), (1.0, 5.0)),
        lambda: Empirical((0.0, 1.0), (5.0, 1.0)),
    ],
)
def test_nonsense_distributions_are_rejected(make: object) -> None:
    with pytest.raises(WorkloadError):
        make()  # type: ignore[operator]


def test_shipped_tables_are_what_fit_produces(tmp_path: Path) -> None:
    """Regenerating the tables from ../shared/traces gives the shipped files exactly."""
    from bench_llm.workloads.fit import regenerate

    traces = shared_path("traces")
    out = tmp_path
    for f in regenerate(traces, out):
        shipped = Path(__file__).resolve().parents[2] / "workloads" / "builtin" / f.name
        assert f.read_text() == shipped.read_text(), f.name
