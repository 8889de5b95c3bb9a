"""Time-based warm-up and cool-down (issue 20): requests intended in the first ``warmup_s``
after t0, or in the last ``cooldown_s`` of ``duration_s``, are recorded with phase
"warmup" / "cooldown" and excluded from the metrics; the run metadata says both."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.analysis.load import load_run
from bench_llm.analysis.summary import summarize
from bench_llm.bench.execute import RunConfig, execute_run
from bench_llm.loadgen.options import RunOptions
from bench_llm.loadgen.transport import Timeouts
from bench_llm.sim.server import ServerConfig, create_app, serve_in_process
from bench_llm.sim.timing import FixedTiming
from bench_llm.workloads.spec import RequestSpec, Schedule


def test_phase_at_is_the_one_rule() -> None:
    o = RunOptions(duration_s=10.0, warmup_s=2.0, cooldown_s=3.0)
    s = 1_000_000_000
    assert [o.phase_at(5 * s, 5 * s + t) for t in (0, 2 * s - 1, 2 * s, 7 * s - 1, 7 * s, 12 * s)] == [
        "warmup", "warmup", None, None, "cooldown", "cooldown"]
    assert RunOptions().phase_at(0, 0) is None


@pytest.mark.parametrize("kwargs", [
    {"cooldown_s": 1.0},  # no duration: no known end
    {"duration_s": 2.0, "warmup_s": 1.0, "cooldown_s": 1.0},  # nothing left
    {"warmup_s": -1.0},
])
def test_bad_windows_are_refused_naming_the_setting(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="warmup_s|cooldown_s"):
        RunOptions(**kwargs)  # type: ignore[arg-type]


def test_a_run_records_and_excludes_its_warm_up_and_cool_down(tmp_path: Path) -> None:
    """Open loop, one request every 50 ms for 1.2 s; warm-up 0.3 s, cool-down 0.3 s: the
    rows intended before 0.3 s are "warmup", those at or after 0.9 s "cooldown", and the
    summary judges only the middle ones."""
    gap = 50_000_000
    specs = tuple(RequestSpec(f"r{i:02d}", 4, 3, prompt="p", send_offset_ns=i * gap) for i in range(24))
    sched = Schedule("w", 0, "open", specs, rate=20.0)
    options = RunOptions(progress=False, duration_s=1.2, drain_timeout_s=10.0, warmup_s=0.3, cooldown_s=0.3)

    async def main() -> Path:
        async with serve_in_process(create_app(ServerConfig(timing=FixedTiming(0.002, 0.001)))) as url:
            cfg = RunConfig(out=tmp_path / "run", url=url, engine="sim", model="sim-model", schedule=sched,
                            options=options, timeouts=Timeouts(stall=5.0))
            res = await execute_run(cfg, OpenAIAdapter(model="sim-model"), install_signals=False)
            return res.run_dir

    run = load_run(asyncio.run(main()))
    rows = run.requests.to_pylist()
    t0 = run.meta["notes"]["t0_ns"]
    assert len(rows) == 24 and all(r["ok"] for r in rows)
    for r in rows:
        offset = r["intended_send_ns"] - t0
        want = "warmup" if offset < 0.3e9 else "cooldown" if offset >= 0.9e9 else "measure"
        assert r["phase"] == want, (r["request_id"], offset, r["phase"])
    assert [r["phase"] for r in sorted(rows, key=lambda r: r["request_id"])].count("measure") == 12
    assert (run.meta["workload"]["warmup_s"], run.meta["workload"]["cooldown_s"]) == (0.3, 0.3)
    summary = summarize(run.requests, monitor=run.monitor)
    # the warm-up and the cool-down are counted apart (issue 20), in the summary and the notes
    assert summary.requests.measured == 12 and summary.requests.warmup_excluded + summary.requests.cooldown_excluded == 12
    assert (summary.requests.warmup_excluded, summary.requests.cooldown_excluded) == (6, 6)
    assert run.meta["notes"]["excluded"] == {"warmup": 6, "cooldown": 6}
    from bench_llm.analysis.format import format_summary

    assert "6 warm-up excluded; 6 cool-down excluded;" in format_summary(summary)
