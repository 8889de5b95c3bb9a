"""The recommendation's one writer and one reader (analysis/recommend_types.py): a file read
back and written again is the same file, and the keys written only in some cases stay so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_llm.analysis.recommend import recommend
from bench_llm.analysis.recommend_text import format_recommendation
from bench_llm.analysis.recommend_types import Recommendation, read_recommendation, recommendation_json
from bench_llm.bench.sweep.store import write_recommendation
from tests.analysis.test_recommend import SLO, _point, _sweep, _two_plus_one


@pytest.fixture
def judged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bench_llm.analysis.recommend.sweep_settings", lambda s, p: {"slo": SLO, "attainment_pct": 90.0})


@pytest.mark.parametrize("target", [None, 3.0, 9.0])
def test_the_file_reads_back_into_the_same_file_and_text(tmp_path: Path, judged: None, target: float | None) -> None:
    sweep = _two_plus_one(tmp_path)
    rec = recommend(sweep, target_rate=target)
    write_recommendation(sweep, rec)
    text = (sweep / "recommendation.json").read_text()
    assert text == recommendation_json(rec)
    back = read_recommendation(sweep)
    assert recommendation_json(back) == text and back == Recommendation.from_json(json.loads(text))
    assert format_recommendation(Recommendation.from_json(rec.to_json())) == format_recommendation(rec)
    assert isinstance(back.workloads["w"].configurations[0].loads[0].load_value, float)


def test_keys_written_only_in_some_cases(tmp_path: Path, judged: None) -> None:
    # one configuration: judged for separation (no target) but no runner-up: the key is null
    alone = recommend(_sweep(tmp_path / "a", [_point("tp1", r, 1.0 if r <= 4 else 0.2) for r in (2.0, 4.0, 5.0)]))
    wr = alone.to_json()["workloads"]["w"]
    assert alone.workloads["w"].recommendation is not None
    assert "separation" in wr and wr["separation"] is None
    assert "short_of_target" not in wr and "provisional" not in wr and "resume_command" not in wr
    # with a target and nothing smaller short of it: no separation key at all
    with_target = recommend(_sweep(tmp_path / "b", [_point("tp1", r, 1.0) for r in (2.0, 4.0)]), target_rate=3.0)
    wr = with_target.to_json()["workloads"]["w"]
    assert "separation" not in wr and wr["short_of_target"] == []
    for rec in (alone, with_target):
        again = Recommendation.from_json(json.loads(recommendation_json(rec)))
        assert again.to_json() == json.loads(recommendation_json(rec))
    # a configuration's capacity is written flat, with the keys of its kind
    cfg = with_target.to_json()["workloads"]["w"]["configurations"][0]
    assert cfg["kind"] == "rate" and "max_concurrency" not in cfg and "unknown_below_rps" not in cfg
    # no SLO: the answer has no tradeoffs key
    free = recommend(_sweep(tmp_path / "c", [_point("tp1", 2.0, 1.0)]), slo={})
    assert "same_gpus_tradeoffs" not in free.to_json()["workloads"]["w"]
