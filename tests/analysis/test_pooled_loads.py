"""``pooled_loads`` reads each column once and groups rows by position (issue 18, speed): its
groups, their order and every pooled figure must be those of ``DataFrame.groupby``."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from bench_llm.analysis.recommend_pooling import _group_positions, pooled_loads
from tests.analysis.test_recommend import _point


def _points() -> pd.DataFrame:
    rows = [
        _point("tp2", 20.0, 0.95, ttft50=120.0),
        _point("tp2", 10.0, 1.0),
        _point("tp2", 20.0, 0.80, sat=True, ttft50=300.0),  # a repeat of 20 req/s: pooled with the first
        _point("tp2", 1.0, 1.0, kind="concurrency", role="baseline"),
        _point("tp2", 10.0, 0.9, kind="concurrency"),  # same value as a rate load, another group
        _point("tp2", 15.0, 0.5),
        _point("tp2", 30.0, 0.2),
    ]
    rows[1]["requests"] = 70
    rows[2]["requests"] = 30
    rows[5]["status"] = "failed"  # not measured: left out
    rows[6]["load_kind"] = None  # a missing key: left out, as groupby drops it
    return pd.DataFrame(rows)


def test_groups_follow_groupby_order_and_members() -> None:
    df = _points()
    df["_base"] = df["role"].eq("baseline")
    keys = ["_base", "load_kind", "load_value"]
    expected = [list(g.index) for _, g in df.groupby(keys, sort=True)]
    got = [list(p) for p in _group_positions(*(df[k].tolist() for k in keys))]
    assert got == expected and len(got) == 5  # the row with no load kind is in none


def test_pooled_figures_are_weighted_by_requests() -> None:
    pooled = pooled_loads(_points(), 90.0, 0.95)
    order = list(zip(pooled["_base"], pooled["load_kind"], pooled["load_value"]))
    # the baseline first, then by load; at equal values in groupby's key order (concurrency < rate)
    assert order == [(True, "concurrency", 1.0), (False, "concurrency", 10.0), (False, "rate", 10.0), (False, "rate", 20.0)]
    twenty: dict[str, Any] = pooled.iloc[3].to_dict()
    assert twenty["requests"] == 80 and twenty["saturated"] is True
    assert math.isclose(twenty["ttft_p50_ms"], np.average([120.0, 300.0], weights=[50, 30]))
    assert twenty["runs"] == ["cell=tp2/load=rate-20", "cell=tp2/load=rate-20"]
    assert twenty["saturation_reason"] == "queueing grew" and twenty["verdict"] == "fail"
    assert pooled.iloc[2]["requests"] == 70 and pooled.iloc[2]["runs"] == ["cell=tp2/load=rate-10"]
