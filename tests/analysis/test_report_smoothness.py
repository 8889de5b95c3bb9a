"""Streaming smoothness: fluidity (deadline schedule, slack carried, a miss re-bases) and longest gap."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from bench_llm.analysis.smoothness import Deadlines, fluidity_reference, smoothness_metrics

MS = 1_000_000


def _table(rows: list[tuple[int | None, list[int], list[int]]]) -> pa.Table:
    return pa.table(
        {
            "send_ns": pa.array([r[0] for r in rows], pa.int64()),
            "chunk_ns": pa.array([r[1] for r in rows], pa.list_(pa.int64())),
            "chunk_tokens": pa.array([r[2] for r in rows], pa.list_(pa.int32())),
        }
    )


D = Deadlines(ttft_ms=100, token_interval_ms=10)


def test_on_time_stream_is_fully_fluid() -> None:
    ts = [50 * MS + i * 10 * MS for i in range(20)]
    out = smoothness_metrics(_table([(0, ts, [1] * 20)]), D)
    assert out["fluidity"][0] == 1.0 and out["missed_deadlines"][0] == 0
    assert out["longest_gap_ms"][0] == pytest.approx(10.0)


def test_early_tokens_bank_slack_for_a_later_gap() -> None:
    # first token at 10 ms (due 100), then a 90 ms gap: token 2 due at 110 ms, arrives 100 ms -> on time
    ts = [10 * MS, 100 * MS, 105 * MS]
    out = smoothness_metrics(_table([(0, ts, [1, 1, 1])]), D)
    assert out["fluidity"][0] == 1.0
    assert out["longest_gap_ms"][0] == pytest.approx(90.0)


def test_a_stall_counts_once_and_the_schedule_restarts() -> None:
    # on time until a 200 ms stall; after it tokens come every 10 ms again: one miss only
    ts = [50 * MS, 60 * MS, 70 * MS, 270 * MS, 280 * MS, 290 * MS, 300 * MS]
    out = smoothness_metrics(_table([(0, ts, [1] * 7)]), D)
    assert out["missed_deadlines"][0] == 1
    assert out["fluidity"][0] == pytest.approx(6 / 7)
    assert out["longest_gap_ms"][0] == pytest.approx(200.0)


def test_late_first_token_and_multi_token_chunks() -> None:
    # first chunk (3 tokens) at 150 ms > 100 ms: token 1 misses and re-bases the schedule at 150;
    # tokens 2 and 3 arrive at 150 too (due 160, 170) -> on time; next chunk at 175 (due 180) on time
    out = smoothness_metrics(_table([(0, [150 * MS, 175 * MS], [3, 1])]), D)
    assert out["missed_deadlines"][0] == 1
    assert out["fluidity"][0] == pytest.approx(3 / 4)
    assert out["longest_gap_ms"][0] == pytest.approx(25.0)


def test_rows_without_tokens_or_send_time_are_nan() -> None:
    out = smoothness_metrics(_table([(0, [], []), (None, [5 * MS], [1]), (0, [5 * MS, 6 * MS], [0, 1])]), D)
    assert np.isnan(out["fluidity"][0]) and np.isnan(out["fluidity"][1])
    assert out["fluidity"][2] == 1.0 and np.isnan(out["longest_gap_ms"][2])  # one token: no gap


def test_vectorised_form_matches_the_definition_on_random_streams() -> None:
    rng = np.random.default_rng(7)
    rows, expected = [], []
    for _ in range(300):
        n = int(rng.integers(1, 40))
        send = int(rng.integers(0, 10**9))
        gaps = rng.choice([5, 9, 11, 30, 150], size=n, p=[0.3, 0.3, 0.2, 0.15, 0.05]) * MS
        gaps[0] = int(rng.choice([40, 99, 101, 300])) * MS
        ts = (send + np.cumsum(gaps)).tolist()
        k = rng.integers(1, 3, n).tolist()
        rows.append((send, ts, k))
        expected.append(fluidity_reference(send, [t for t, kk in zip(ts, k) for _ in range(kk)], D))
    out = smoothness_metrics(_table(rows), D)
    assert np.allclose(out["fluidity"].to_numpy(), expected)
    assert (out["fluidity"] < 1).sum() > 50  # the sample does exercise misses


def test_deadlines_from_slo_and_validation() -> None:
    d = Deadlines.from_slo({"ttft_ms": 500, "tpot_ms": 40})
    assert (d.ttft_ms, d.token_interval_ms) == (500, 40)
    assert Deadlines.from_slo({}) == Deadlines()
    with pytest.raises(ValueError):
        Deadlines(0, 10)
