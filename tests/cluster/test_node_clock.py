"""A node's clock against the launching host's (bench/sweep/cluster_clock.py) is a typed record
(launch.placement.NodeClock), recorded in engine_info as before. The node's step is a local
process here (no Slurm): the same clock, so the offset lies within its bound."""

from __future__ import annotations

import sys

import pytest

from bench_llm.bench.sweep import cluster_clock
from bench_llm.launch.placement import Node, NodeClock


def test_a_node_that_answers_gives_an_offset_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_clock, "clock_step_argv", lambda job, node: [sys.executable, "-u", "-c", cluster_clock._ECHO])
    clocks = cluster_clock.measure_clocks("7", [Node("n1", "127.0.0.1"), Node("n2", "127.0.0.1")])
    assert list(clocks) == ["n1", "n2"]
    clock = clocks["n1"]
    assert isinstance(clock, NodeClock) and clock.error is None and clock.samples == cluster_clock.SAMPLES
    assert clock.bound_ns is not None and clock.offset_ns is not None and abs(clock.offset_ns) <= clock.bound_ns
    assert clock.as_json() == {"node": "n1", "offset_ns": clock.offset_ns, "bound_ns": clock.bound_ns,
                               "samples": cluster_clock.SAMPLES, "clock": NodeClock.CLOCK}  # fmt: skip


def test_a_node_whose_step_does_not_answer_records_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_clock, "clock_step_argv", lambda job, node: [sys.executable, "-c", "pass"])
    clock = cluster_clock.measure_node_clock("7", "n1")
    assert clock == NodeClock("n1", 0, error="the clock step did not answer")
    assert clock.as_json() == {"node": "n1", "error": "the clock step did not answer", "samples": 0}
