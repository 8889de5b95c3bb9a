"""``bench locust master --warmup-s/--cooldown-s`` (issue 20): the same option group as
``bench run`` (bench/run_options.py), the same checks, carried to every worker, which applies
``RunOptions.phase_at`` from the shared t0."""

from __future__ import annotations

import sys
from pathlib import Path

from click.testing import CliRunner

from bench_llm.analysis.slo import SLO
from bench_llm.bench.cli import cli
from bench_llm.bench.distributed.measure import worker_options
from bench_llm.bench.distributed.wire import ClientSettings
from bench_llm.bench.run_options import (
    ClientOptions,
    EngineTarget,
    LoadOptions,
    OutputOptions,
    PhaseOptions,
)


def test_both_commands_offer_the_phases() -> None:
    for argv in (["run", "--help"], ["locust", "master", "--help"]):
        out = CliRunner().invoke(cli, argv)
        assert out.exit_code == 0 and "--warmup-s" in out.output and "--cooldown-s" in out.output, out.output


def test_the_master_checks_the_phases_as_bench_run_does(tmp_path: Path) -> None:
    base = ["--url", "http://127.0.0.1:9", "--out", str(tmp_path / "r")]
    cases = [
        (["--cooldown-s", "2"], "cooldown_s needs duration_s"),
        (["--duration", "4", "--warmup-s", "2", "--cooldown-s", "2"], "leave nothing of duration_s"),
        (["--warmup-s", "-1"], "must be >= 0"),
    ]
    for extra, words in cases:
        for argv in (["run", *base, *extra], ["locust", "master", "--workers", "1", *base, *extra]):
            out = CliRunner().invoke(cli, argv)
            assert out.exit_code == 2 and "--warmup-s/--cooldown-s/--duration" in out.output and words in out.output, (argv, out.output)
            assert not (tmp_path / "r").exists()


def test_the_phases_reach_every_worker_and_the_run_description() -> None:
    from bench_llm.bench.commands.locust import _master_plan

    target = EngineTarget(url="http://127.0.0.1:9", engine="vllm", api="completions", model="m")
    load = LoadOptions(workload=None, requests=4, input_tokens=8, output_tokens=4, rate=None, arrival=None,
                       concurrency=2, warmup=0, seed=0, duration=10.0)
    client = ClientOptions(stall_timeout=5.0, api_key_env="NO_SUCH_KEY", api_key_file=None)
    output = OutputOptions(out=None, overwrite=False, save_text=False, slo=SLO(), percentiles=(50.0,), as_json=False)  # type: ignore[arg-type]
    argv = sys.argv
    sys.argv = ["bench", "locust", "master"]
    try:
        _, description, settings = _master_plan(2, target, load, client, output, 1, PhaseOptions(1.5, 2.0))
    finally:
        sys.argv = argv
    wired = ClientSettings.from_wire(settings.to_wire())
    assert (wired.warmup_s, wired.cooldown_s, wired.duration_s) == (1.5, 2.0, 10.0)
    opts = worker_options(wired, 1)
    t0 = 10**12
    assert opts.phase_at(t0, t0 + 1_400_000_000) == "warmup"
    assert opts.phase_at(t0, t0 + 1_600_000_000) is None
    assert opts.phase_at(t0, t0 + 7_900_000_000) is None
    assert opts.phase_at(t0, t0 + 8_000_000_000) == "cooldown"
    assert description["workload_json"]["warmup_s"] == 1.5 and description["workload_json"]["cooldown_s"] == 2.0
