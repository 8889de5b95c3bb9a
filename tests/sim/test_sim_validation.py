"""The simulator against published figures (sim/validation.py): fitted rows reproduce their
figure and held-out rows stay where they are. The whole table runs once per module in virtual
time (about 55 s of CPU: the issue asks for the table to validate, not a sample of it)."""

from __future__ import annotations

import math

import pytest

from bench_llm.sim import validation
from bench_llm.sim.validation import Row, load_rows, rows, summary, table

#: about 55 s of CPU for the table; a loaded 2-core host stretches that past pytest's default 300 s
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def all_rows() -> list[Row]:
    out = rows()
    print()
    print(table(out))
    return out


def test_fitted_rows_reproduce_their_figure(all_rows: list[Row]) -> None:
    for r in (r for r in all_rows if r.fitted):
        assert abs(r.error) <= 0.15, f"{r.config} {r.figure}: {r.simulated:.1f} vs {r.published:.1f}"


def test_held_out_rows_stay_near_the_bar(all_rows: list[Row]) -> None:
    # the bar is 85 % within ±20 % and none beyond 2x; the table holds 62 of 71 (87.3 %; 38 of
    # 44, 86.4 %, without the 27 seen rows) and a worst ratio of 1.79 (NIM TTFT at concurrency 100): this
    # guards against regressions from there rather than claiming the bar with a margin
    # (docs/simulator.md lists the misses)
    held = [r for r in all_rows if not r.fitted]
    within = sum(1 for r in held if abs(r.error) <= 0.20)
    assert within >= 0.84 * len(held), table(held)
    worst = max(held, key=lambda r: abs(math.log(r.ratio)))
    assert 0.5 <= worst.ratio <= 2.0, f"{worst.config} {worst.figure}: ratio {worst.ratio:.2f}"


def test_every_parallel_axis_and_kind_has_a_held_out_row(all_rows: list[Row]) -> None:
    held = " | ".join(f"{r.config} {r.figure}" for r in all_rows if not r.fitted)
    for needle in ("TP8", "PP8", "DP-attention", "MoE over 8", "P/D", "TPOT", "Mixtral".lower(), "DeepSeek"):
        assert needle in held, needle


def test_load_rows_itl_tracks_published_and_the_knee_shows() -> None:
    rows_ = load_rows()
    itl = [r for r in rows_ if r.figure == "ITL ms"]
    assert all(abs(r.error) <= 0.20 for r in itl)
    ttft = {r.config.rsplit(" ", 1)[1]: r.simulated for r in rows_ if r.figure == "TTFT ms"}
    assert ttft["100"] > 4 * ttft["50"]  # past the KV/batch knee, TTFT is queue time


def test_seen_rows_are_counted_apart_and_still_meet_the_bar(all_rows: list[Row]) -> None:
    # a held-out row is "seen" when a choice was made after its simulated figure had been looked at
    # (docs/simulator.md lists why for each); the bar is reported, and guarded here, without them too
    assert not any(r.fitted and r.seen for r in all_rows)
    unseen = [r for r in all_rows if not r.fitted and not r.seen]
    seen = [r for r in all_rows if r.seen]
    assert len(seen) == 27, [f"{r.config} {r.figure}" for r in seen]
    assert f"without the {len(seen)} seen rows" in summary(all_rows)
    within = sum(1 for r in unseen if abs(r.error) <= 0.20)
    assert within >= 0.84 * len(unseen), table(unseen)
    assert all(0.5 <= r.ratio <= 2.0 for r in unseen), table(unseen)


def test_dcp_rows_are_held_out_and_show_the_kv_capacity_gain(all_rows: list[Row]) -> None:
    dcp = {r.config.rsplit(" ", 3)[-3] if "over" in r.config else "TP8": r
           for r in all_rows if r.source == "vllm-25049"}
    assert set(dcp) == {"TP8", "TP8+DCP4", "TP8+DCP8"}, list(dcp)
    # held out; the two ratio rows seen (the DCP bandwidth term came after them), the TP8 row since issue 35
    # (the vllm profile's FP8 expert-GEMM ceiling was kept after it came out 1.73x without)
    assert not any(r.fitted for r in dcp.values()) and dcp["TP8"].seen
    assert dcp["TP8+DCP4"].seen and dcp["TP8+DCP8"].seen
    # striping the one MLA latent head over 4 and 8 GPUs lets the offline batch grow: more tokens/s
    assert 1.1 < dcp["TP8+DCP4"].simulated < dcp["TP8+DCP8"].simulated
    assert all(abs(r.error) <= 0.20 for r in dcp.values()), table(list(dcp.values()))


def test_ep_rows_fit_the_eager_term_and_ep_is_no_free_speed_up(all_rows: list[Row]) -> None:
    ep = {r.figure: r for r in all_rows if r.source == "sglang-3602"}
    # TP8's output tok/s fitted sglang-2024's eager-step term; the EP8-over-TP8 ratio was seen before it
    assert ep["output tok/s"].fitted and ep["speed-up x"].seen and not ep["speed-up x"].fitted, table(list(ep.values()))
    # published 1.05x: whole experts over 8 GPUs barely beat TP-sharded experts at this load
    assert 0.8 <= ep["speed-up x"].simulated <= 1.2 and abs(ep["speed-up x"].error) <= 0.20, table(list(ep.values()))


def test_rows_on_two_processes_equal_rows_in_one(monkeypatch: pytest.MonkeyPatch) -> None:
    cheap = (validation.nim_rows, validation.splitwise_rows, validation.vllm_ci_serving_rows)
    monkeypatch.setattr(validation, "GROUPS", cheap)
    assert rows(workers=2) == rows(workers=1) == [r for g in cheap for r in g()]


def test_the_shipped_rows_are_the_computed_rows(all_rows: list[Row]) -> None:
    # a sweep states the model's error from sim/validation_rows.json (issue 36): it must be this table,
    # row for row (python -m bench_llm.sim.validation --update-docs rewrites both)
    from bench_llm.sim import validation_figures

    shipped = validation_figures.load()
    assert [(r.source, r.config, r.figure, r.published, r.simulated, r.fitted, r.seen) for r in shipped] == [
        (r.source, r.config, r.figure, r.published, r.simulated, r.fitted, r.seen) for r in all_rows]
