"""A failed start carries what the launcher saw and the engine's log tail as fields: the sweep
reads them (bench/sweep/cell.py), never the message's wording."""

from __future__ import annotations

import pickle

from bench_llm.bench.sweep.cell import _start_failure
from bench_llm.launch.process import EngineStartError


def test_the_fields_and_the_message() -> None:
    e = EngineStartError("engine exited with code 2 during start-up", log="loading\nError: No such option")
    assert e.summary == "engine exited with code 2 during start-up" and e.log.endswith("No such option")
    assert str(e) == "engine exited with code 2 during start-up; last log lines:\nloading\nError: No such option"
    back = pickle.loads(pickle.dumps(e))  # a cell's process hands it back pickled
    assert (back.summary, back.log, str(back)) == (e.summary, e.log, str(e))
    assert EngineStartError("refused").log == "" and str(EngineStartError("refused")) == "refused"


def test_the_cells_reason_names_the_engines_last_line_then_what_the_launcher_saw() -> None:
    e = EngineStartError("engine exited with code 2 during start-up", log="loading\nError: No such option")
    assert _start_failure(e.summary, e.log) == (
        "engine failed to start: Error: No such option (engine exited with code 2 during start-up)"
    )
