"""SGLang's decode context parallelism, version-gated (``--dcp-size`` from 0.5.21, inside the TP
group), and its router started from whichever package is installed (``smg``, or the older
``sglang_router``; sglang 0.5.23 installs neither), found before the cell starts."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bench_llm.bench.sweep.dryrun import dry_run_lines
from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec
from bench_llm.launch.config import Disagg, ParallelConfig
from bench_llm.launch.launcher import LaunchSpec
from bench_llm.launch.process import EngineStartError
from bench_llm.launch.profiles import plan_engine


def _dry(matrix: MatrixSpec, version: str | None) -> list[str]:
    spec = SweepSpec(model="org/model", engine="sglang", gpus=8, matrix=matrix, loads=LoadSpec(rates=(1.0,)),
                     engine_version=version)  # fmt: skip
    spec.validate()
    return dry_run_lines(spec)


def _installed(monkeypatch: pytest.MonkeyPatch, *have: str) -> None:
    def probe(python: str, names: Sequence[str]) -> frozenset[str]:
        return frozenset(names) & set(have)

    monkeypatch.setattr("bench_llm.launch.engines.installed_modules", probe)


def test_dcp_is_planned_as_dcp_size_from_0_5_21_and_refused_with_the_version_before() -> None:
    lines = _dry(MatrixSpec(tp=(4,), dcp=(2,)), "0.5.23")
    assert lines[1] == "cell tp4-dcp2: 4 GPUs"  # dcp lives inside the TP group: no more GPUs
    argv = lines[3]
    assert "--tp-size 4" in argv and "--dcp-size 2" in argv
    lines = _dry(MatrixSpec(tp=(4,), dcp=(2,)), "0.5.8")
    assert lines[0].endswith("(0 to run, 1 skipped); nothing was started")
    assert "skipped" in lines[1] and "SGLang 0.5.8 has no decode context parallelism (--dcp-size arrived in 0.5.21)" in lines[1]


def test_dcp_must_divide_tp() -> None:
    with pytest.raises(ValueError, match="dcp \\(3\\) must divide tp \\(4\\)"):
        ParallelConfig(tp=4, dcp=3)


def test_a_pd_dry_run_shows_the_smg_router_when_only_smg_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    _installed(monkeypatch, "smg")
    lines = _dry(MatrixSpec(tp=(1,), disagg=("1:1",)), "0.5.23")
    router = lines[-1]
    assert lines[-2].startswith("  router:") and " -m smg.launch_router --pd-disaggregation --prefill " in router
    _installed(monkeypatch, "sglang_router")
    assert " -m sglang_router.launch_router --pd-disaggregation " in _dry(MatrixSpec(disagg=("1:1",)), "0.5.8")[-1]
    _installed(monkeypatch, "smg", "sglang_router")  # both: the current package
    assert " -m smg.launch_router " in _dry(MatrixSpec(disagg=("1:1",)), None)[-1]


def test_without_either_router_a_routed_cell_is_refused_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    _installed(monkeypatch)
    for parallel in (ParallelConfig(disagg=Disagg(1, 1)), ParallelConfig(dp=2, extra_args=("--policy=cache_aware",))):
        with pytest.raises(EngineStartError) as err:
            plan_engine(LaunchSpec("sglang", "m", parallel), 30000, lambda host: 0)
        message = str(err.value)
        assert "\n" not in message and "smg (pip install smg)" in message and "sglang_router (pip install sglang-router)" in message
    # a plain cell needs no router
    (plan,) = plan_engine(LaunchSpec("sglang", "m", ParallelConfig(tp=2)), 30000, lambda host: 0).processes
    assert plan.role == "engine"


def test_the_cli_dry_run_plans_or_refuses_dcp_by_version() -> None:
    import subprocess

    from tests.conftest import REPO, bench_argv

    def dry(version: str) -> str:
        p = subprocess.run(bench_argv("sweep", "--engine", "sglang", "--model", "org/m", "--gpus", "4", "--tp", "2",
                                      "--dcp", "2", "--rate", "1", "--engine-version", version, "--dry-run"),
                           capture_output=True, text=True, timeout=120, cwd=REPO)  # fmt: skip
        assert p.returncode == 0, p.stderr[-2000:]
        return p.stdout

    assert "--tp-size 2 --dcp-size 2" in dry("0.5.23")
    assert "skipped: sglang does not support it: SGLang 0.5.20 has no decode context parallelism" in dry("0.5.20")
