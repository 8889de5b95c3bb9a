"""Placing a launch plan on nodes (launch/placement.py, launch/multinode.py): an instance that
outgrows a node becomes rank 0 plus headless ranks with the rendezvous filled in, with each
engine's documented multi-node flags; routers reach their instances on their nodes; what
cannot be placed is refused with the reason; the local launcher's plans are untouched."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from bench_llm.bench.sweep.cluster import ClusterLauncher
from bench_llm.launch import engines
from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.launcher import LaunchSpec, UnsupportedConfigError, plan_launch
from bench_llm.launch.placement import ClusterSpec
from bench_llm.launch.slurm import placed_plan, sbatch_argv, srun_argv

VLLM_FLAGS = {
    line.strip()
    for line in (Path(__file__).parent / "data" / "vllm_0.32.0_serve_flags.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
}
#: SGLang's multi-node fields (python/sglang/srt/arg_groups/fields/parallel.py: nnodes, node_rank,
#: dist_init_addr), beside the flags bench already passes (tests/bench/test_sweep_dryrun.py)
SGLANG_FLAGS = {"model-path", "host", "port", "tp-size", "pp-size", "dp-size", "ep-size", "enable-metrics",
                "nnodes", "node-rank", "dist-init-addr", "disaggregation-mode", "disaggregation-bootstrap-port"}  # fmt: skip


@pytest.fixture(autouse=True)
def _programs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engines' programs as a host without them spells them (vllm; python3 for SGLang)."""
    monkeypatch.setattr(engines, "vllm_command", lambda: ["vllm"])
    monkeypatch.setenv("BENCH_SGLANG_PYTHON", "python3")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _spec(engine: str, axes: str) -> LaunchSpec:
    return LaunchSpec(engine=engine, model="org/M", parallel=ParallelConfig.parse(axes))


def _flags(argv: tuple[str, ...]) -> set[str]:
    return {a[2:].split("=", 1)[0] for a in argv if a.startswith("--")}


def _value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


NODES8 = ClusterSpec(gpus_per_node=8)


def test_vllm_pp_across_nodes() -> None:
    placed = placed_plan(_spec("vllm", "tp=8,pp=2"), NODES8)
    assert placed.nodes == 2 and placed.gpus_per_node == 8 and placed.processes_per_node == 1
    lead, worker = placed.processes
    assert (lead.node, lead.rank, worker.node, worker.rank) == (0, 0, 1, 1)
    for p in placed.processes:
        assert _flags(p.argv) <= VLLM_FLAGS, _flags(p.argv) - VLLM_FLAGS
        assert (_value(p.argv, "--nnodes"), _value(p.argv, "--master-addr")) == ("2", "<node0>")
        assert _value(p.argv, "--node-rank") == str(p.rank) and p.gpus == 8
    assert _value(lead.argv, "--master-port") == _value(worker.argv, "--master-port")
    assert "--headless" in worker.argv and "--headless" not in lead.argv
    assert worker.ready_path is None and lead.ready_path == "/health"
    assert _value(lead.argv, "--host") == "<node0>" and _value(worker.argv, "--host") == "<node1>"


def test_vllm_dp_ep_across_nodes() -> None:
    placed = placed_plan(_spec("vllm", "tp=2,dp=8,ep=16"), NODES8)
    assert placed.nodes == 2
    for p in placed.processes:
        assert _flags(p.argv) <= VLLM_FLAGS, _flags(p.argv) - VLLM_FLAGS
        assert "--enable-expert-parallel" in p.argv and _value(p.argv, "--data-parallel-size") == "8"
        assert _value(p.argv, "--data-parallel-size-local") == "4"
        assert _value(p.argv, "--data-parallel-start-rank") == str(4 * p.rank)
        assert _value(p.argv, "--data-parallel-address") == "<node0>"
        assert "--nnodes" not in p.argv  # DP ranks rendezvous through the DP address, not torch's master
    assert [("--headless" in p.argv) for p in placed.processes] == [False, True]


def test_sglang_across_nodes() -> None:
    placed = placed_plan(_spec("sglang", "tp=16"), NODES8)
    lead, worker = placed.processes
    for p in placed.processes:
        assert _flags(p.argv) <= SGLANG_FLAGS, _flags(p.argv) - SGLANG_FLAGS
        assert _value(p.argv, "--tp-size") == "16" and _value(p.argv, "--nnodes") == "2"
        assert _value(p.argv, "--node-rank") == str(p.rank)
    assert _value(lead.argv, "--dist-init-addr") == _value(worker.argv, "--dist-init-addr")
    assert _value(lead.argv, "--dist-init-addr").startswith("<node0>:")
    assert worker.ready_path is None


def test_pd_pair_on_two_nodes_router_reaches_each() -> None:
    placed = placed_plan(_spec("vllm", "tp=8,disagg=1:1"), NODES8)
    roles = [(p.role, p.node) for p in placed.processes]
    assert roles == [("prefill", 0), ("decode", 1), ("proxy", 0)]
    prefill, decode, proxy = placed.processes
    assert f"http://<node0>:{prefill.port}" in proxy.argv and f"http://<node1>:{decode.port}" in proxy.argv
    assert dict(decode.env)["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "<node1>"
    assert placed.front == 2 and placed.processes_per_node == 2  # node 0 holds prefill + proxy
    # a step per process, its own GPUs; the job asks per node what the busiest node holds
    assert "--gres=gpu:8" in sbatch_argv("c", placed, NODES8) and "--ntasks-per-node=2" in sbatch_argv("c", placed, NODES8)
    assert "--gres=none" in srun_argv("1", "n1", proxy.gpus, proxy.argv)


def test_small_cells_share_a_node_and_the_user_options_pass_through() -> None:
    cluster = ClusterSpec(gpus_per_node=8, sbatch_args=("--partition=gpu", "--account=a", "--qos=q"), gres_type="h100",
                          time_limit_min=30)  # fmt: skip
    placed = placed_plan(_spec("vllm", "tp=2,disagg=1:1"), cluster)
    assert placed.nodes == 1 and {p.node for p in placed.processes} == {0}
    argv = sbatch_argv("tp2", placed, cluster)
    assert {"--partition=gpu", "--account=a", "--qos=q", "--time=30", "--gres=gpu:h100:4", "--nodes=1"} <= set(argv)


@pytest.mark.parametrize(
    ("engine", "axes", "cluster", "why"),
    [
        ("vllm", "tp=16,dp=2", NODES8, "a DP rank must fit on one node"),
        ("tgi", "tp=16", NODES8, "tgi has no multi-node launch"),
        ("vllm", "tp=12", NODES8, "not a whole number of 8-GPU nodes"),
        ("vllm", "tp=8,pp=4", replace(NODES8, max_nodes=2), "needs 4 nodes of 8 GPUs; the cluster allows 2"),
        ("tgi", "tp=2,pp=2", NODES8, "TGI has no pipeline parallelism"),
    ],
)
def test_refused_before_anything_starts(engine: str, axes: str, cluster: ClusterSpec, why: str) -> None:
    with pytest.raises(UnsupportedConfigError, match=why):
        placed_plan(_spec(engine, axes), cluster)
    reasons = ClusterLauncher(cluster).unsupported(engine, ParallelConfig.parse(axes))
    assert len(reasons) == 1 and why in reasons[0]


def test_the_simulated_engine_stands_for_its_gpus_and_rejoins_as_ranks() -> None:
    placed = placed_plan(replace(_spec("sim", "tp=4,pp=2"), model="llama-3.1-8b"), ClusterSpec(gpus_per_node=4))
    assert [(p.node, p.gpus, p.rank) for p in placed.processes] == [(0, 4, 0), (1, 4, 1)]
    assert "--headless" in placed.processes[1].argv


def test_local_plans_are_unchanged() -> None:
    """The local launcher does not place: one host, no multi-node flag, no rewritten host."""
    for engine, axes in (("vllm", "tp=8,pp=2"), ("sglang", "tp=16"), ("vllm", "tp=2,disagg=1:1")):
        for p in plan_launch(_spec(engine, axes), base_env={}):
            line = shlex.join(p.argv)
            assert "--nnodes" not in line and "--headless" not in line and "@node@" not in line
            assert "127.0.0.1" in line


@pytest.mark.parametrize(
    ("engine", "axes"),
    [("vllm", "tp=4,dp=2"), ("vllm", "tp=2,disagg=1:2"), ("sglang", "tp=2,disagg=2:1"), ("sglang", "tp=8"),
     ("tgi", "tp=4"), ("vllm", "tp=2,dp=2,ep=4")],
)  # fmt: skip
def test_one_node_placement_is_the_local_plan(engine: str, axes: str) -> None:
    """The seam: a plan placed on one node whose address is the local host runs the very argv
    the local launcher runs (same processes, order, ports and flags)."""
    spec = _spec(engine, axes)
    local = plan_launch(spec, base_env={})
    placed = placed_plan(spec, ClusterSpec(gpus_per_node=64))
    assert placed.nodes == 1
    here = [tuple(a.replace("<node0>", "127.0.0.1") for a in p.argv) for p in placed.processes]
    assert here == [p.argv for p in local]
    assert [p.role for p in placed.processes] == [p.role for p in local]
