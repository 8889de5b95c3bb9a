"""Why a load did not simply pass is a code with a message (results/sweep_rows.ReasonCode),
and what sizes the next run of a too-short load is a number, never its message's wording."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench_llm.analysis.capacity import judge_load
from bench_llm.analysis.capacity_points import PointMetrics
from bench_llm.analysis.capacity_steady import long_enough, requests_needed
from bench_llm.results.sweep_rows import ReasonCode


def _row(met: int, n: int, **kw: Any) -> dict[str, Any]:
    return {"met": met, "requests": n, "attainment": met / n, "saturated": False, **kw}


def test_a_short_runs_missing_requests_are_a_number() -> None:
    # 40 requests over 10 s; long requests live 4 s: 16 s of sending needed, 24 more requests
    assert requests_needed(10.0, 4.0, 40) == 24 and requests_needed(16.0, 4.0, 40) == 0
    assert requests_needed(math.nan, 4.0, 40) == 0 and long_enough(math.nan, 4.0, 40) is None
    assert str(requests_needed(10.0, 4.0, 40)) in str(long_enough(10.0, 4.0, 40))
    assert PointMetrics.__dataclass_fields__["more_requests_needed"].default == 0


def test_the_judgement_carries_its_longest_short_runs_count_whatever_the_message_says() -> None:
    short = [_row(200, 200, under_sampled="too short (words that name no number)", more_requests_needed=150),
             _row(100, 100, under_sampled="undecided: 9 more requests needed", more_requests_needed=9)]  # fmt: skip
    j = judge_load(short, 90.0)
    assert j.verdict == "undecided" and j.more_requests == 150  # the longest run's, not a number in a message
    assert j.code is ReasonCode.UNDECIDED and j.why is not None and j.why.more_requests == 150
    # points of older sweeps: no such column (absent, or NaN read through pandas): no count
    assert judge_load([_row(200, 200, under_sampled="x", more_requests_needed=math.nan)], 90.0).more_requests == 0


@pytest.mark.parametrize(
    ("rows", "code"),
    [
        ([_row(200, 200)], None),
        ([_row(100, 200)], ReasonCode.FAILED),
        ([_row(200, 200, saturated=True, saturation_reason="queue grew")], ReasonCode.SATURATED),
        ([_row(200, 200, untrustworthy="client saturated: lag")], ReasonCode.UNTRUSTWORTHY),
        ([_row(20, 20)], ReasonCode.UNDECIDED),
    ],
)
def test_each_judgement_has_its_code(rows: list[dict[str, Any]], code: ReasonCode | None) -> None:
    j = judge_load(rows, 90.0)
    assert j.code is code and (j.why is None) == (code is None)
