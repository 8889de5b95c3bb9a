"""A sweep on a cluster (``bench sweep --cluster slurm``): each cell's engine placed on the
cluster's nodes by its manager, cells side by side as concurrent jobs (``--jobs N``).

``ClusterLauncher`` is the sweep's ``Launcher`` for a cluster: ``unsupported`` refuses, before
anything starts, what the cluster cannot hold (a process larger than a node that its engine
cannot spread, more nodes than allowed); ``start`` launches the cell on Slurm
(``launch.slurm``) or Kubernetes (``bench.sweep.cluster_kube``); ``recover`` cancels the jobs
(deletes the objects) a killed sweep left (``--resume``). On Slurm the load generator runs on
the launching host (``ClusterSpec.client``), never on an engine node, and each cell records its
measured round trip to the engine (``engine_info.client``); on Kubernetes each load is a Job on
a CPU node whose run folder comes back through the pod log API. A dry run
prints the Slurm commands of each cell (``dry_run_lines``) or, for Kubernetes, the manifests
(``launch.kube``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.launcher import LaunchSpec, UnsupportedConfigError
from bench_llm.launch.placement import ClusterSpec
from bench_llm.launch.process import EngineStartError

if TYPE_CHECKING:
    from bench_llm.bench.sweep.engines import CellEngine, Handle
    from bench_llm.bench.sweep.matrix import PlannedCell
    from bench_llm.bench.sweep.spec import SweepSpec


def launch_spec(cell: CellEngine) -> LaunchSpec:
    return LaunchSpec(
        engine=cell.engine, model=cell.model, parallel=cell.parallel, gpu=cell.gpu,
        extra_args=tuple(cell.extra_args), env=tuple(cell.env), ready_timeout_s=cell.ready_timeout_s,
        engine_version=cell.engine_version,
    )  # fmt: skip


@dataclass(frozen=True)
class ClusterLauncher:
    """The sweep's launcher on a cluster (picklable: a cell's process gets its own copy)."""

    cluster: ClusterSpec
    #: Ask the manager too (``sbatch --test-only``) whether it would take each cell's job; a dry
    #: run does not (it prints the same text wherever it runs).
    ask_manager: bool = True

    def unsupported(self, engine: str, parallel: ParallelConfig) -> list[str]:
        from bench_llm.launch.slurm import placed_plan

        try:
            placed_plan(LaunchSpec(engine=engine, model="m", parallel=parallel), self.cluster)
        except UnsupportedConfigError as exc:
            return [str(exc).split(": ", 1)[-1]]
        except EngineStartError as exc:
            return [str(exc)]
        return []

    def manager_refusals(self, spec: SweepSpec, planned: list[PlannedCell]) -> list[PlannedCell]:
        """``planned`` with each cell Slurm would not take skipped with Slurm's own words
        (``sbatch --test-only`` of the cell's job: asked before anything starts, makes no job)."""
        from dataclasses import replace

        from bench_llm.launch.slurm import client_exclusion, manager_refusal, placed_plan, sbatch_argv, slurm_available

        if not self.ask_manager or self.cluster.manager != "slurm" or slurm_available() is not None:
            return planned
        exclude = client_exclusion(self.cluster)
        why = (f" (nodes {', '.join(exclude)} excluded: the load generator runs on their host; "
               "client_shares_node allows them)") if exclude else ""  # fmt: skip
        out = []
        for c in planned:
            if not c.skip_reason:
                placed = placed_plan(LaunchSpec(engine=spec.for_cell(c.config).engine, model=spec.model,
                                                parallel=c.config), self.cluster)  # fmt: skip
                said = manager_refusal(sbatch_argv(c.cell_id, placed, self.cluster, exclude))
                if said is not None:
                    c = replace(c, skip_reason=f"Slurm refuses its job ({placed.nodes} nodes of "
                                               f"{placed.gpus_per_node} GPUs): {said}{why}")  # fmt: skip
            out.append(c)
        return out

    def start(self, cell: CellEngine, log_path: Path) -> Handle:
        if self.cluster.manager == "kubernetes":
            from bench_llm.bench.sweep.cluster_kube import launch_on_kubernetes

            return launch_on_kubernetes(launch_spec(cell), log_path, self.cluster, cell.parallel.cell_id)
        from bench_llm.bench.sweep.cluster_clock import measure_clocks
        from bench_llm.launch.slurm import launch_on_slurm

        handle = launch_on_slurm(launch_spec(cell), log_path, self.cluster, cell.parallel.cell_id)
        try:  # engine-side times (spans, logs) are stamped on the nodes' clocks
            handle.clocks = measure_clocks(handle.job.job_id, handle.job.nodes)
        except BaseException:
            handle.stop()
            raise
        return handle

    def recover(self, sweep_dir: Path) -> list[str]:
        """Cancel every job a cell folder records and bench never released (a killed sweep);
        on Kubernetes, delete every object labelled with the sweep."""
        from bench_llm.bench.sweep import store
        from bench_llm.launch.slurm import JOB_RECORD, cancel_recorded, slurm_available

        if self.cluster.manager == "kubernetes":  # every object labelled with the sweep
            from bench_llm.bench.sweep.cluster_kube import delete_sweep

            return delete_sweep(sweep_dir, self.cluster)
        if slurm_available() is not None:
            return []
        out = []
        root = store.cell_dir(sweep_dir, "x").parent
        for record in sorted(root.glob(f"*/{JOB_RECORD}")):
            job = cancel_recorded(record.parent)
            if job is not None:
                out.append(job)
        return out


def otlp_refusal(cluster: ClusterSpec, jobs: int | None) -> str | None:
    """Why ``--otlp-receiver`` cannot serve a sweep on ``cluster`` (None: it can). On Slurm the
    receiver listens on the address by which this host reaches the nodes (``otlp_host``), and
    the spans' times are on the front node's clock, whose offset is in ``engine_info``."""
    if cluster.manager != "slurm":
        return ("--otlp-receiver: not on Kubernetes (the engines' pods would need a route to this host; "
                "docs/sweeps.md, On a cluster)")  # fmt: skip
    if (jobs or 1) > 1:  # cells side by side run in processes of their own
        return "--otlp-receiver on a cluster: with --jobs 1 only (one receiver cannot tell side-by-side cells' spans apart)"
    return None


def otlp_host(cluster: ClusterSpec | None) -> str:
    """Where the sweep's OTLP receiver listens: the loopback, or on Slurm this host's address on
    the route to the cluster's first node (a UDP socket connected toward it: no packet sent)."""
    import socket

    from bench_llm.launch.slurm import SlurmError, _slurm, slurm_available

    if cluster is None or cluster.manager != "slurm" or slurm_available() is not None:
        return "127.0.0.1"
    try:
        addrs = [f.split("=", 1)[1] for line in _slurm(["scontrol", "-o", "show", "node"]).splitlines()
                 for f in line.split() if f.startswith("NodeAddr=")]  # fmt: skip
    except SlurmError:
        return "127.0.0.1"
    if not addrs:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((addrs[0], 9))
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def dry_run_lines(spec: SweepSpec) -> list[str]:
    """``bench sweep --dry-run`` on a cluster: each cell's Slurm commands, or its manifests."""
    from bench_llm.bench.sweep.cell import cell_engine
    from bench_llm.bench.sweep.matrix import expand

    cluster = spec.cluster
    assert cluster is not None
    launcher = ClusterLauncher(cluster, ask_manager=False)
    planned = expand(spec, launcher.unsupported)
    skipped = sum(1 for c in planned if c.skip_reason)
    lines = [
        f"# bench sweep --dry-run on {cluster.manager} ({cluster.gpus_per_node} GPUs per node): engine {spec.engine}, "
        f"model {spec.model}, {len(planned)} cells ({len(planned) - skipped} to run, {skipped} skipped); "
        "nothing was started"
    ]
    for c in planned:
        head = f"cell {c.cell_id}: {c.config.gpus} GPU{'s' if c.config.gpus != 1 else ''}"
        if c.skip_reason:
            lines.append(f"{head}, skipped: {c.skip_reason}")
            continue
        lines.append(head)
        ls = launch_spec(cell_engine(spec, c.config, dry_run=True))
        if cluster.manager == "slurm":
            from bench_llm.launch.slurm import dry_run_commands

            lines += ["  " + line for line in dry_run_commands(ls, c.cell_id, cluster)]
        else:
            from bench_llm.launch.kube import manifests_yaml

            lines += manifests_yaml(ls, c.cell_id, cluster, _client_argv(spec)).rstrip("\n").splitlines()
    return lines


def _client_argv(spec: SweepSpec) -> list[str]:
    """What the load generator Job runs against the cell's Service (one measured load)."""
    w = spec.cell_workloads[0]
    argv = ["bench", "run", "--engine", spec.engine if spec.engine != "sim" else "vllm", "--model", spec.model,
            "--url", "$(ENGINE_URL)", "--input-tokens", str(w.input_tokens), "--output-tokens", str(w.output_tokens),
            "--requests", str(spec.loads.requests), "--out", "/results/$(CELL_ID)"]  # fmt: skip
    if spec.loads.rates:
        argv += ["--rate", f"{min(spec.loads.rates):g}"]
    return argv


def describe(cluster: ClusterSpec) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(cluster)
