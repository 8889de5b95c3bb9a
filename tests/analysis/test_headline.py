"""The sweep's headline (analysis/headline.py): the same answer in the report and the terminal."""

from __future__ import annotations

from bench_llm.analysis.headline import build_headline, headline_lines
from bench_llm.analysis.recommend_text import format_recommendation
from bench_llm.analysis.recommend_types import Recommendation


def _rec(tp1_per_gpu: float = 3.5, upper: float | None = 8.5) -> Recommendation:
    pick = {"cell_id": "tp2", "gpus": 2, "capacity_rps": 7.9, "capacity_rps_per_gpu": 3.95, "evidence": {}}
    configs = [
        {"cell_id": "tp1", "gpus": 1, "axes": 0, "capacity_rps": tp1_per_gpu, "capacity_rps_per_gpu": tp1_per_gpu, "upper_rps": 4.0,
         "limiting_factor": "queueing", "diagnosis": "queue", "loads": []},
        {"cell_id": "tp2", "gpus": 2, "axes": 1, "capacity_rps": 7.9, "capacity_rps_per_gpu": 3.95, "upper_rps": upper,
         "limiting_factor": "kv_cache", "diagnosis": "KV cache full", "loads": []},
    ]  # fmt: skip
    return Recommendation.from_json({
        "slo": {"ttft_ms": 80.0}, "attainment_pct": 90.0, "target_rate": None, "message": "why", "cells": [],
        "recommendation": pick, "definitions": {"capacity_rps": "c", "goodput_rps": "g"},
        "workloads": {"w": {"configurations": configs, "recommendation": pick, "message": "why"}},
    })  # fmt: skip


def test_headline_has_interval_margin_limit_and_next_check() -> None:
    h = build_headline(_rec())
    assert h is not None
    assert (h.name, h.gpus, h.capacity_per_gpu) == ("tp2", 2, 3.95)
    assert h.interval_per_gpu == (3.95, 4.25)
    assert h.runner_up == "tp1" and h.margin_pct is not None and round(h.margin_pct) == 13
    assert h.limiting_factor == "kv_cache" and "preemption" in h.verify_next


def test_open_bracket_and_close_margin_are_said() -> None:
    lines = headline_lines(build_headline(_rec(tp1_per_gpu=3.9, upper=None)))
    assert lines[0].startswith("RECOMMENDED: tp2 (2 GPUs), 3.95 req/s per GPU ≥ 3.95 (lower bound")
    assert "too close to call" in lines[1]


def test_text_recommendation_starts_with_the_same_headline() -> None:
    text = format_recommendation(_rec())
    first = text.splitlines()[1:5]
    assert first == headline_lines(build_headline(_rec()))
    assert headline_lines(None, "no SLO") == ["RECOMMENDED: none: no SLO"]
