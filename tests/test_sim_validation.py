"""The cost model reproduces the reference's single-stream and small-batch rows within ±20 %."""

from __future__ import annotations

from sim.validation import rows, table


def test_validation_rows_within_20_percent() -> None:
    print()
    print(table())
    for r in rows():
        assert abs(r.error) <= 0.20, f"{r.name} {r.metric}: predicted {r.predicted:.1f} vs {r.published:.1f}"


def test_load_rows_itl_tracks_published_and_the_knee_shows() -> None:
    from sim.validation import load_rows

    rows_ = load_rows()
    print()
    print(table(rows_))
    itl = [r for r in rows_ if r.metric == "ITL ms"]
    assert all(abs(r.error) <= 0.20 for r in itl)
    ttft = {r.name.rsplit(" ", 1)[1]: r.predicted for r in rows_ if r.metric == "TTFT ms"}
    assert ttft["100"] > 4 * ttft["50"]  # past the KV/batch knee, TTFT is queue time
