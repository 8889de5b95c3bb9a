"""TPOT and ITL of requests of several sequences (n > 1), docs/metrics.md: TPOT per sequence,
no ITL, chunk gap or max ITL; the one-sequence requests of the same run unchanged."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from bench_llm.analysis.load import load_run
from bench_llm.analysis.metrics import itl_ms, request_metrics
from bench_llm.analysis.summary import summarize
from tests.helpers_records import record, write_run


def _records(chunks: list[tuple[float, int]]) -> list:  # type: ignore[type-arg]
    one = record("one", 0.0, [(10.0 + 5 * i, 1) for i in range(8)])  # 8 tokens, 5 ms apart
    # 2 sequences x 4 tokens, one step every 10 ms, the choices' chunks interleaved
    two = dataclasses.replace(record("two", 0.0, chunks, max_output_tokens=4), n=2)  # 4 per sequence asked
    return [one, two]


@pytest.mark.parametrize("shape", ["one token a chunk", "a zero-token frame", "two tokens a chunk"])
def test_tpot_per_sequence_and_no_itl_for_several(tmp_path: Path, shape: str) -> None:
    steps = [10.0, 20.0, 30.0, 40.0]
    if shape == "two tokens a chunk":  # each step's two tokens in one chunk (the general path)
        chunks = [(t, 2) for t in steps]
    else:
        chunks = [(t + d, 1) for t in steps for d in (0.0, 0.1)]
        if shape == "a zero-token frame":  # a usage-only frame at the end
            chunks.append((40.5, 0))
    run = write_run(tmp_path / "run", _records(chunks))
    table = load_run(run).requests
    df = request_metrics(table).set_index("request_id")
    assert df.loc["one", "tpot_ms"] == pytest.approx(5.0)
    end = chunks[-1][0]
    assert df.loc["two", "tpot_ms"] == pytest.approx((end - 10.0) / (8 / 2 - 1))  # not / (8 - 1)
    assert np.isnan(df.loc["two", "max_itl_ms"]) and df.loc["one", "max_itl_ms"] == pytest.approx(5.0)
    assert list(itl_ms(table)) == pytest.approx([5.0] * 7)  # the one-sequence request's only
    s = summarize(table)
    assert s.latency["itl_ms"]["n"] == 7 and s.latency["itl_ms"]["mean"] == pytest.approx(5.0)
    assert s.latency["chunk_gap_ms"]["n"] == 7
    assert s.timing.several_sequences == 1
    assert s.tokens.shorter_than_requested == s.tokens.longer_than_requested == 0
