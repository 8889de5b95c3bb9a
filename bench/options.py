"""Parsing the options several commands share (--percentiles, --slo, --out).

Kept apart from the commands so that ``bench summary`` and ``bench report`` do not import the
load generator just to parse them.
"""

from __future__ import annotations

from typing import Any

import click

from bench_llm.analysis.slo import SLO
from bench_llm.core.errors import BenchError


def parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        ps = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise BenchError(f"--percentiles {text!r}: expected numbers like 50,90,99") from None
    if not ps or any(not 0 <= p <= 100 for p in ps):
        raise BenchError("--percentiles: each value must be between 0 and 100")
    return ps


def parse_slo(text: str | None) -> SLO:
    return SLO.parse(text)


class OutPath(click.Path):
    """A folder or file bench writes (``--out``): an empty value (an unset ``$OUT``) is bad
    input, never read as the current folder (``click.Path`` alone turns "" into ".")."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            name = param.opts[0] if param is not None and param.opts else "the output path"
            raise BenchError(f"{name} is empty: give the folder to write (an unset variable in the command?)")
        return super().convert(value, param, ctx)
