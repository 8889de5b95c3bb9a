"""The sweep's cluster as settings: TOML ``[cluster]`` (unknown keys refused with their dotted
path), the cluster flags (refused without ``--cluster``), and what a cluster sweep refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bench_llm.bench.commands.sweep import command as sweep
from bench_llm.bench.sweep.spec import SweepSpecError, load_spec
from bench_llm.launch.placement import ClusterSpec


def test_toml_cluster_table(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('model = "m"\nengine = "vllm"\n[matrix]\ntp = [8]\npp = [2]\n'
                 '[cluster]\nmanager = "slurm"\ngpus_per_node = 8\nsbatch_args = ["--partition=gpu"]\n')
    spec = load_spec(f)
    assert spec.cluster == ClusterSpec(gpus_per_node=8, sbatch_args=("--partition=gpu",))
    assert spec.effective_clock == "auto"  # a cluster's engines are measured live
    f.write_text('model = "m"\n[cluster]\ngpus = 8\n')
    with pytest.raises(SweepSpecError, match="unknown key 'cluster.gpus'"):
        load_spec(f)
    f.write_text('model = "m"\n[cluster]\nmanager = "lsf"\n')
    with pytest.raises(SweepSpecError, match="cluster manager 'lsf': use one of slurm, kubernetes"):
        load_spec(f)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--gpus-per-node", "4"], "--gpus-per-node: a cluster setting; give --cluster slurm|kubernetes"),
        (["--cluster", "slurm", "--clock", "virtual"], "cluster: a sweep in virtual time runs no engine"),
        (["--cluster", "slurm", "--url", "a=http://127.0.0.1:1"], "cluster: running deployments are measured"),
    ],
)
def test_flags_refused(args: list[str], said: str) -> None:
    out = CliRunner().invoke(sweep, ["--model", "m", "--rate", "1", "--dry-run", *args])
    assert out.exit_code != 0 and said in f"{out.output}{out.exception}", (out.output, out.exception)


def test_dry_run_from_flags() -> None:
    out = CliRunner().invoke(sweep, ["--engine", "vllm", "--model", "m", "--tp", "8", "--pp", "1,2", "--rate", "1",
                                    "--cluster", "slurm", "--gpus-per-node", "8", "--sbatch-arg=--qos=high", "--dry-run"])
    assert out.exit_code == 0, out.output
    text = out.output
    assert "cell tp8-pp2: 16 GPUs" in text and "--nodes=2" in text and "--qos=high" in text
    assert text.count("srun ") == 3  # tp8 on one node, tp8-pp2 as two ranks


def test_the_launching_hosts_nodes_are_excluded_from_a_job() -> None:
    from bench_llm.launch.config import ParallelConfig
    from bench_llm.launch.launcher import LaunchSpec
    from bench_llm.launch.slurm import placed_plan, sbatch_argv

    cluster = ClusterSpec(gpus_per_node=4, sbatch_args=("--partition=gpu",))
    placed = placed_plan(LaunchSpec(engine="sim", model="m", parallel=ParallelConfig.parse("tp=2")), cluster)
    argv = sbatch_argv("tp2", placed, cluster, ("n1", "n2"))
    # placed before the user's own options
    assert argv.index("--exclude=n1,n2") < argv.index("--partition=gpu")
    assert not any(a.startswith("--exclude") for a in sbatch_argv("tp2", placed, cluster))
