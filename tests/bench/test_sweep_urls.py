"""``bench sweep --url NAME=URL@GPUS``: running deployments bench did not start, each one
configuration with its declared GPUs, measured and recommended between (issue 22)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench_llm.analysis.recommend import recommend
from bench_llm.analysis.recommend_io import load_points
from bench_llm.bench.cli import cli
from bench_llm.bench.commands.sweep import _endpoints
from bench_llm.bench.sweep.orchestrate import run_sweep
from bench_llm.bench.sweep.spec import EndpointSpec, LoadSpec, MatrixSpec, SweepSpec, SweepSpecError, WorkloadSpec
from bench_llm.bench.sweep.store import read_cells
from bench_llm.core.errors import BenchError
from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.process import ManagedProcess, free_port
from bench_llm.results.reader import read_run_meta


def _serve(tmp: Path, name: str, ttft_ms: float, flavor: str = "vllm") -> Iterator[tuple[str, ManagedProcess]]:
    port = free_port()
    argv = [sys.executable, "-m", "bench_llm.bench", "sim", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--model", "m", "--ttft-ms", str(ttft_ms), "--itl-ms", "2", "--flavor", flavor]  # fmt: skip
    proc = ManagedProcess(argv, tmp / f"{name}.log")
    proc.start()
    try:
        proc.wait_ready(f"http://127.0.0.1:{port}/health", 60.0)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.stop()


_PROCS: list[ManagedProcess] = []


@pytest.fixture
def two_deployments(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A fast simulated engine and a slow one (TTFT 20 ms and 1.5 s), running before the sweep.
    The slow one's TTFT is a server-side floor above the 1 s SLO, so no host noise lets it pass."""
    fast = _serve(tmp_path, "fast", 20.0)
    slow = _serve(tmp_path, "slow", 1500.0)
    (fast_url, fast_proc), (slow_url, slow_proc) = next(fast), next(slow)
    _PROCS[:] = [fast_proc, slow_proc]
    yield {"fast": fast_url, "slow": slow_url}
    for gen in (fast, slow):
        next(gen, None)


def _spec(urls: dict[str, str]) -> SweepSpec:
    return SweepSpec(
        model="m",
        engine="sim",
        # the slow deployment is the smaller one: it is picked only if it meets the SLOs
        endpoints=(EndpointSpec("big", urls["fast"], 2), EndpointSpec("small", urls["slow"], 1)),
        loads=LoadSpec(rates=(8.0, 16.0), requests=10, warmup=1),
        workloads=(WorkloadSpec(input_tokens=32, output_tokens=8),),
        # a bound far above what a busy shared host adds to the client's timings (50x the fast TTFT)
        slo={"ttft_ms": 1000.0},
        attainment_pct=50.0,
    ).with_clock()


def test_two_running_deployments_are_measured_and_the_one_meeting_the_slos_is_recommended(
    tmp_path: Path, two_deployments: dict[str, str]
) -> None:
    out = tmp_path / "sweep"
    spec = _spec(two_deployments)
    assert spec.effective_clock == "auto"  # a running simulated engine is measured live
    res = run_sweep(spec, out, echo=lambda s: None, progress=False)
    assert sorted(res.ran) == ["big", "small"] and not res.failed
    cells = {r["cell_id"]: r for r in read_cells(out)}
    assert cells["big"]["gpus"] == 2 and cells["small"]["gpus"] == 1
    assert cells["small"]["capacity_rps"] is None and cells["big"]["capacity_rps"] == 16.0
    assert recommend(out).to_json()["recommendation"]["cell_id"] == "big"
    # what each server says about itself, read through the engine profile's routes
    info = json.loads(cells["big"]["engine_info"])
    assert info["url"] == two_deployments["fast"] and info["started_by_bench"] is False
    assert info["version"].endswith("bench-sim") and cells["big"]["engine_version"] == info["version"]
    assert info["/v1/models"]["data"][0]["id"] == "m" and "/version" in info
    meta = read_run_meta(out / "cell=big" / "load=rate-8")
    assert meta["extra"]["cell"]["deployment"] == "big" and meta["extra"]["cell"]["gpus"] == 2
    assert meta["extra"]["engine_info"]["url"] == two_deployments["fast"]
    # the deployments were measured, not stopped
    assert len(_PROCS) == 2 and all(p.alive() for p in _PROCS)
    assert "not started by bench" in (out / "cell=small" / "engine.log").read_text()
    fingerprint = json.loads(cells["small"]["fingerprint"])
    assert fingerprint["bench_version"] and "gpus" in fingerprint and "absent" in fingerprint["model_config"]


def test_a_deployment_that_does_not_answer_fails_its_cell_and_the_sweep_goes_on(
    tmp_path: Path, two_deployments: dict[str, str]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    spec = _spec({"fast": two_deployments["fast"], "slow": dead})
    res = run_sweep(spec, tmp_path / "sweep", echo=lambda s: None, progress=False)
    cells = {r["cell_id"]: r for r in read_cells(tmp_path / "sweep")}
    assert res.failed == ("small",) and "does not answer" in cells["small"]["reason"]
    assert cells["big"]["status"] == "complete"


def test_url_flags_parse_and_bad_definitions_are_refused() -> None:
    got = _endpoints(("a=http://10.0.0.5:8000@2", "b=http://u:p@host:9000", "c=https://h/v@1"))
    assert got == (
        EndpointSpec("a", "http://10.0.0.5:8000", 2),
        EndpointSpec("b", "http://u:p@host:9000", 1),
        EndpointSpec("c", "https://h/v", 1),
    )
    with pytest.raises(BenchError, match="NAME=URL"):
        _endpoints(("http://h:8000",))
    # each endpoint may name the engine it speaks; without one it speaks the sweep's --engine
    assert _endpoints(("a=vllm:http://h:1@2", "b=tgi:https://u:p@h:2", "c=http://h:3")) == (
        EndpointSpec("a", "http://h:1", 2, "vllm"),
        EndpointSpec("b", "https://u:p@h:2", 1, "tgi"),
        EndpointSpec("c", "http://h:3", 1, None),
    )
    one = (EndpointSpec("a", "http://h:1"),)

    def spec(**kw: object) -> SweepSpec:
        return SweepSpec(**{"model": "m", "loads": LoadSpec(rates=(1.0,)), "endpoints": one, **kw})  # type: ignore[arg-type]

    spec(engine="vllm").validate()
    spec(engine="generic").validate()  # an engine bench cannot launch can still be measured
    for bad, match in (
        (spec(endpoints=(EndpointSpec("a", "http://h:1"), EndpointSpec("a", "http://h:2"))), "differ"),
        (spec(endpoints=(EndpointSpec("a/b", "http://h:1"),)), "letters"),
        (spec(endpoints=(EndpointSpec("a", "h:1"),)), "http"),
        (spec(endpoints=(EndpointSpec("a", "http://h:1", 0),)), "positive"),
        (spec(matrix=MatrixSpec(tp=(2,))), "not both"),
        (spec(engine_args=("--x",)), "engine_args"),
        (spec(clock="virtual"), "live"),
        (spec(engine="nope"), "use one of"),
        (spec(endpoints=(EndpointSpec("a", "http://h:1", 1, "nope"),)), "endpoint a: engine 'nope': use one of"),
        (spec(endpoints=(), engine="generic"), "use one of"),  # launching needs a launch plan
    ):
        with pytest.raises(SweepSpecError, match=match):
            bad.validate()


def test_dry_run_lists_the_deployments_and_starts_nothing() -> None:
    res = CliRunner().invoke(cli, ["sweep", "--engine", "vllm", "--model", "m", "--url", "b=http://h:2@4",
                                   "--url", "a=http://h:1", "--gpus", "2", "--rate", "1", "--dry-run"])  # fmt: skip
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[1] == "cell a: 1 GPU, running deployment at http://h:1 (bench starts nothing)"
    assert lines[2] == "cell b: 4 GPUs, skipped: needs 4 GPUs, 2 available"


@pytest.fixture
def vllm_and_tgi(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Two simulated engines speaking different APIs: vLLM's (OpenAI + /version) and TGI's
    (/generate_stream + /info)."""
    a = _serve(tmp_path, "vllm", 20.0, "vllm")
    b = _serve(tmp_path, "tgi", 20.0, "tgi")
    (a_url, _), (b_url, _) = next(a), next(b)
    yield {"vllm": a_url, "tgi": b_url}
    for gen in (a, b):
        next(gen, None)


def test_each_deployment_is_measured_through_its_own_engine(tmp_path: Path, vllm_and_tgi: dict[str, str]) -> None:
    out = tmp_path / "mixed"
    res = CliRunner().invoke(cli, [
        "sweep", "--engine", "vllm", "--model", "m", "--url", f"v=vllm:{vllm_and_tgi['vllm']}@1",
        "--url", f"t=tgi:{vllm_and_tgi['tgi']}@1", "--rate", "4", "--requests", "8", "--warmup", "0",
        "--input-tokens", "32", "--output-tokens", "8", "--slo", "ttft_ms=2000", "--attainment", "50",
        "--confidence", "0", "--out", str(out), "--no-progress",
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    cells = {r["cell_id"]: r for r in read_cells(out)}
    assert {c: (r["status"], r["engine"]) for c, r in cells.items()} == {
        "v": ("complete", "vllm"), "t": ("complete", "tgi"),
    }  # fmt: skip
    # the info routes follow each endpoint's engine: vLLM's /version, TGI's /info
    v_info, t_info = json.loads(cells["v"]["engine_info"]), json.loads(cells["t"]["engine_info"])
    assert "/version" in v_info and "/info" not in v_info
    assert "/info" in t_info and "/version" not in t_info
    # and so does the adapter: every request of both succeeded, each recorded under its engine
    for cid, engine in (("v", "vllm"), ("t", "tgi")):
        meta = read_run_meta(out / f"cell={cid}" / "load=rate-4")
        assert meta["engine"] == engine and meta["extra"]["cell"]["engine"] == engine, meta
    points = load_points(out)
    assert sorted(points["cell_id"]) == ["t", "v"] and (points["ok"] == points["requests"]).all(), points
    assert {r["cell_id"] for r in recommend(out).to_json()["workloads"]["in32-out8"]["configurations"]} == {"v", "t"}
    dry = CliRunner().invoke(cli, ["sweep", "--engine", "vllm", "--model", "m", "--url", "t=tgi:http://h:1",
                                   "--url", "v=http://h:2", "--rate", "1", "--dry-run"])  # fmt: skip
    assert "cell t: 1 GPU, running tgi deployment at http://h:1" in dry.output
    assert "cell v: 1 GPU, running deployment at http://h:2" in dry.output


def test_a_toml_sweep_names_its_deployments(tmp_path: Path) -> None:
    from bench_llm.bench.sweep.spec import load_spec

    path = tmp_path / "two.toml"
    path.write_text(
        'engine = "tgi"\nmodel = "m"\nslo = { ttft_ms = 500 }\n[loads]\ncapacity = true\n'
        '[[endpoints]]\nname = "a"\nurl = "http://h:1"\ngpus = 2\n[[endpoints]]\nname = "b"\nurl = "http://h:2"\n'
        'engine = "vllm"\n'
    )
    spec = load_spec(path).with_clock()
    spec.validate()
    assert spec.endpoints == (EndpointSpec("a", "http://h:1", 2), EndpointSpec("b", "http://h:2", 1, "vllm"))
    assert spec.for_cell(ParallelConfig(deployment="b", deployment_gpus=1)).engine == "vllm"
    assert spec.for_cell(ParallelConfig(deployment="a", deployment_gpus=2)).engine == "tgi"  # the sweep's engine
    assert spec.effective_clock == "auto"
