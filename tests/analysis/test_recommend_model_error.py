"""A simulated sweep's capacities carry the model's error (issue 36), and "too close to call"
uses it on the recommendation's own path: capacity intervals that overlap once widened by the
model's error tie (the smaller configuration is preferred), and a configuration short of the
target whose model interval reaches it keeps the answer open. A measured configuration (no
model error) is judged as before."""

from __future__ import annotations

from bench_llm.analysis.recommend_choice import choose, model_target_call, per_gpu_separation, target_separation
from bench_llm.analysis.recommend_types import CellCapacity, Configuration, Lightest

SOURCE = "the shipped validation rows' held-out median |error| per metric"


def _config(cid: str, gpus: int, cap: float, lo: float, hi: float, upper: float, error: float | None) -> Configuration:
    capacity = CellCapacity(kind="rate", capacity_rps=cap, upper_rps=upper, interval_low_rps=lo, interval_high_rps=hi)
    return Configuration(cid, gpus, 0, None, capacity, cap / gpus, "decode", "", {}, Lightest(None, None, None), [],
                         model_error=error, model_error_source=SOURCE if error is not None else None)  # fmt: skip


def test_without_a_target_overlapping_model_intervals_tie_and_the_smaller_configuration_wins() -> None:
    # per GPU: a 100 [95, 104], b 108 [105, 111]: apart by 8 %, their brackets separated
    measured = [_config("a", 1, 100, 95, 104, 104, None), _config("b", 2, 216, 210, 222, 222, None)]
    pick, why = choose(measured, None, None)
    assert pick is not None and pick.cell_id == "b" and "too close to call" not in why
    sep = per_gpu_separation(measured, pick)
    assert sep is not None and sep.separated
    # the same figures from the simulated engine at ±12.5 %: a [87.5, 112.5], b [94.5, 121.5] per GPU
    simulated = [_config("a", 1, 100, 95, 104, 104, 0.125), _config("b", 2, 216, 210, 222, 222, 0.125)]
    pick, why = choose(simulated, None, None)
    assert pick is not None and pick.cell_id == "a" and "too close to call with b" in why
    sep = per_gpu_separation(simulated, pick)
    assert sep is not None and not sep.separated
    assert "the model's error ±12.5%" in sep.text and SOURCE in sep.text


def test_with_a_target_a_smaller_configuration_whose_model_interval_reaches_it_keeps_it_open() -> None:
    # a (1 GPU) passed 90 and failed at 95, below the target 100: decided short; b (2 GPUs) meets it
    measured = [_config("a", 1, 90, 88, 95, 95, None), _config("b", 2, 150, 140, 160, 160, None)]
    pick, _ = choose(measured, 100.0, None)
    assert pick is not None and pick.cell_id == "b"
    sep = target_separation(measured, pick, 100.0)
    assert sep is not None and sep.separated
    simulated = [_config("a", 1, 90, 88, 95, 95, 0.125), _config("b", 2, 150, 140, 160, 160, 0.125)]
    sep = target_separation(simulated, pick, 100.0)
    assert sep is not None and not sep.separated and sep.runner_up == "a"
    assert "too close to call against the target 100 req/s: a [78.75, 101.2] at the simulated engine's error ±12.5%" in sep.text
    assert model_target_call("a", 90, 0.125, 100.0) in sep.text  # the sweep's model-error lines say the same words
    # an error too small to reach the target leaves it decided
    small = [_config("a", 1, 90, 88, 95, 95, 0.05), _config("b", 2, 150, 140, 160, 160, 0.05)]
    decided = target_separation(small, pick, 100.0)
    assert decided is not None and decided.separated


def test_the_model_error_round_trips_through_the_recommendation_file() -> None:
    c = _config("a", 1, 100, 95, 104, 104, 0.125)
    again = Configuration.from_json(c.to_json())
    assert again.model_error == 0.125 and again.model_error_source == SOURCE
    assert again.model_interval_rps == (87.5, 112.5)
    measured = _config("m", 1, 100, 95, 104, 104, None)
    assert "model_error" not in measured.to_json() and measured.model_interval_rps is None
