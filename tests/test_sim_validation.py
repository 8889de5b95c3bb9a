"""The cost model reproduces the reference's single-stream and small-batch rows within ±20 %."""

from __future__ import annotations

from sim.validation import rows, table


def test_validation_rows_within_20_percent() -> None:
    print()
    print(table())
    for r in rows():
        assert abs(r.error) <= 0.20, f"{r.name} {r.metric}: predicted {r.predicted:.1f} vs {r.published:.1f}"
