"""Slurm: one cell's engine as one job.

``launch_on_slurm`` places the launch plan on nodes (``launch.placement``), asks Slurm for
them as one job (``sbatch`` with the user's own options passed through, ``--time`` as a
dead-man limit, ``--gres=gpu:N`` and ``--ntasks-per-node`` per node; the job's own script only
holds the allocation), records the job id in the cell folder at once, waits until the job
runs, reads its nodes' addresses (``scontrol show node``), and starts each process as a job
step on its node (``srun --jobid J --exact -N1 -n1 -w NODE --gres=gpu:K``, so Slurm gives each
its own GPUs in ``CUDA_VISIBLE_DEVICES``), the step's output streamed by ``srun`` into the
process's log in the cell folder. ``stop()`` ends the steps and cancels the job (``scancel``
ends every process under it) and waits until Slurm has let it go; so does any failure during
start. If bench itself dies (SIGTERM, SIGKILL), a watcher process it started beside the job
(``watch_submitter``) cancels the job; a job left all the same (the launching host went down)
is cancelled by ``--resume`` (``cancel_recorded``), or by Slurm at its time limit.

Ports are chosen free on the launching host (where the test cluster's nodes are; on a real
cluster a port taken on the node fails the cell with the engine's log). Nothing here needs a
shared file system: logs come back through ``srun``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench_llm.launch.launcher import (
    EngineHandle,
    LaunchSpec,
    UnsupportedConfigError,
    client_round_trip,
    engine_environment,
    engine_info,
)
from bench_llm.launch.placement import (
    NODE_HOST,
    ClusterSpec,
    Node,
    NodeClock,
    Placed,
    PlacementError,
    place,
    placeholder,
)
from bench_llm.launch.process import EngineStartError, ManagedProcess, free_port
from bench_llm.launch.profiles import plan_engine, unsupported_axes

#: The job record in the cell folder (job id, cluster config, released or not).
JOB_RECORD = "slurm_job.json"
#: The job's own script: it only holds the allocation; the engine runs in job steps.
HOLD = "exec sleep infinity"
#: How long a cancelled job may take to leave Slurm's queue.
RELEASE_TIMEOUT_S = 30.0


class SlurmError(EngineStartError):
    """A Slurm command failed; the message carries Slurm's own words."""


def slurm_available() -> str | None:
    """None when sbatch, srun, squeue, scontrol and scancel are on PATH; else what is missing."""
    missing = [c for c in ("sbatch", "srun", "squeue", "scontrol", "scancel") if shutil.which(c) is None]
    return f"Slurm commands not found: {', '.join(missing)}" if missing else None


def _slurm(argv: Sequence[str], timeout_s: float = 30.0) -> str:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{argv[0]}: {exc}") from None
    if out.returncode != 0:
        said = (out.stderr or out.stdout).strip().splitlines()
        raise SlurmError(f"{' '.join(argv[:2])}: {said[-1] if said else f'exit code {out.returncode}'}")
    return out.stdout


def placed_plan(spec: LaunchSpec, cluster: ClusterSpec, nodes: Sequence[Node] | None = None,
                pick_port: Callable[[], int] | None = None) -> Placed:  # fmt: skip
    """``spec`` placed on ``cluster``'s nodes: with ``nodes`` None a dry run's (addresses
    ``<nodeI>``, ports counted from the spec's, 8000, as ``plan_launch`` counts them); else on
    those nodes with ports from ``pick_port``. The engine's host is ``NODE_HOST``, rewritten
    per process. Raises UnsupportedConfigError for what the engine or the cluster cannot run."""
    reasons = unsupported_axes(spec.engine, spec.parallel)
    if reasons:
        raise UnsupportedConfigError(f"{spec.engine} cannot run {spec.parallel.cell_id}: " + "; ".join(reasons))
    # the programs run on the nodes, not here: one missing on this host is not an error
    # (``vllm`` then stands for the node's), and no port is bound here to test it
    spec = replace(spec, host=NODE_HOST, plan_only=True)
    if pick_port is None:
        first = spec.port or 8000
        counted = iter(range(first + 1, first + 1000))
        layout = plan_engine(spec, first, lambda _host: next(counted))
    else:
        layout = plan_engine(spec, pick_port(), lambda _host: pick_port())
    address = placeholder if nodes is None else (lambda i: nodes[i].address)
    try:
        placed = place(spec.engine, layout, spec.parallel.gpus, cluster.gpus_per_node, address, pick_port, spec.env)
    except PlacementError as exc:
        raise UnsupportedConfigError(f"{spec.engine} cannot run {spec.parallel.cell_id} on this cluster: {exc}") from None
    if cluster.max_nodes is not None and placed.nodes > cluster.max_nodes:
        raise UnsupportedConfigError(
            f"{spec.parallel.cell_id} needs {placed.nodes} nodes of {cluster.gpus_per_node} GPUs; "
            f"the cluster allows {cluster.max_nodes}"
        )
    return placed


def launching_host_nodes() -> tuple[str, ...]:
    """The cluster's nodes that run on this host (Slurm ``NodeHostname``, short names compared)."""
    me = socket.gethostname().split(".")[0]
    out = []
    for line in _slurm(["scontrol", "-o", "show", "node"]).splitlines():
        name, host = re.search(r"\bNodeName=(\S+)", line), re.search(r"\bNodeHostName=(\S+)", line)
        if name and host and host.group(1).split(".")[0] == me:
            out.append(name.group(1))
    return tuple(out)


def client_exclusion(cluster: ClusterSpec) -> tuple[str, ...]:
    """The nodes no cell's job may take: the launching host's, where the load generator runs
    (none with ``client_shares_node``, or when Slurm cannot say)."""
    if cluster.client_shares_node or slurm_available() is not None:
        return ()
    try:
        return launching_host_nodes()
    except SlurmError:
        return ()


def sbatch_argv(cell_id: str, placed: Placed, cluster: ClusterSpec, exclude: Sequence[str] = ()) -> list[str]:
    """The job that holds a cell's nodes (``exclude``: nodes it may not take, ``client_exclusion``)."""
    gres = []
    if placed.gpus_per_node:
        kind = f"gpu:{cluster.gres_type}" if cluster.gres_type else "gpu"
        gres = [f"--gres={kind}:{placed.gpus_per_node}"]
    return [
        "sbatch", "--parsable", f"--job-name=bench-{cell_id}", f"--nodes={placed.nodes}",
        f"--ntasks-per-node={placed.processes_per_node}", *gres, f"--time={cluster.time_limit_min}",
        "--output=/dev/null", *([f"--exclude={','.join(exclude)}"] if exclude else []), *cluster.sbatch_args,
        f"--wrap={HOLD}",
    ]  # fmt: skip


def manager_refusal(argv: Sequence[str]) -> str | None:
    """What Slurm says against the job ``argv`` would submit, asked before anything starts
    (``sbatch --test-only``: no job is made); None when it would queue it."""
    test = [a for a in argv if a != "--parsable"]
    test.insert(1, "--test-only")
    try:
        out = subprocess.run(test, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sbatch --test-only: {exc}"
    if out.returncode == 0:
        return None
    lines = [ln.removeprefix("sbatch: error: ").strip() for ln in (out.stderr or out.stdout).splitlines() if ln.strip()]
    return "; ".join(lines) or f"sbatch --test-only: exit code {out.returncode}"


def srun_argv(job: str, node: str, gpus: int, argv: Sequence[str]) -> list[str]:
    """One process as a job step on ``node`` with its own ``gpus`` GPUs (``--exact``: only what
    the step asks for, so steps on one node get disjoint GPUs)."""
    gres = f"--gres=gpu:{gpus}" if gpus else "--gres=none"
    return ["srun", f"--jobid={job}", "--exact", "--nodes=1", "--ntasks=1", f"--nodelist={node}", gres,
            "--export=ALL", *argv]  # fmt: skip


def dry_run_commands(spec: LaunchSpec, cell_id: str, cluster: ClusterSpec) -> list[str]:
    """What the Slurm backend runs for a cell, as argv lists joined for reading: the job, then
    one step per process (node addresses ``<nodeI>``, the job id ``$JOB``)."""
    import shlex

    placed = placed_plan(spec, cluster)
    lines = [shlex.join(sbatch_argv(cell_id, placed, cluster))]
    for p in placed.processes:
        head = f"# {p.role}" + (f" rank {p.rank}/{p.ranks}" if p.ranks > 1 else "") + f" on <node{p.node}>"
        head += f", {p.gpus} GPU{'s' if p.gpus != 1 else ''}" + ("" if p.ready_path else ", headless")
        env = " ".join(f"{k}={v}" for k, v in p.env)
        lines.append(head + (f"; env {env}" if env else ""))
        lines.append(shlex.join(srun_argv("$JOB", f"<node{p.node}>", p.gpus, p.argv)))
    return lines


#: The dead man's switch: waits for the process that submitted a job to end (a pidfd), then
#: cancels the job. Started in its own session, so bench's death (SIGKILL included) does not end it.
_WATCH = """
import os, select, subprocess, sys
pid, job = int(sys.argv[1]), sys.argv[2]
try:
    fd = os.pidfd_open(pid)
    select.select([fd], [], [])
except OSError:
    pass
subprocess.run(["scancel", job], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
"""


def watch_submitter(job: str) -> subprocess.Popen[bytes] | None:
    """Cancel ``job`` as soon as this process ends, however it ends (None where pidfds are
    not available: then ``--resume`` or the job's time limit ends it)."""
    if not hasattr(os, "pidfd_open"):
        return None
    return subprocess.Popen([sys.executable, "-c", _WATCH, str(os.getpid()), job], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip


@dataclass
class SlurmJob:
    """A cell's job: its id, record file and nodes, and the watcher that cancels it if bench dies."""

    job_id: str
    record: Path
    nodes: list[Node]
    watcher: subprocess.Popen[bytes] | None = None

    def release(self, timeout_s: float = RELEASE_TIMEOUT_S) -> None:
        """Cancel the job (every step and process under it) and wait until Slurm lets it go."""
        cancel_job(self.job_id, timeout_s)
        _mark_released(self.record)
        if self.watcher is not None:
            self.watcher.kill()
            self.watcher.wait()


def submit(argv: Sequence[str], record: Path, cluster: ClusterSpec) -> str:
    job = _slurm(argv).strip().split(";")[0]
    if not job.isdigit():
        raise SlurmError(f"sbatch answered {job!r}, not a job id")
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"job_id": job, "released": False, "sbatch": list(argv),
                                  "slurm_conf": os.environ.get("SLURM_CONF"), "submitted_unix_s": time.time()},
                                 indent=1) + "\n")  # fmt: skip
    return job


def job_state(job: str) -> tuple[str, str, str]:
    """(state, reason, node list); state "" when Slurm no longer lists the job."""
    out = _slurm(["squeue", "-h", "-j", job, "-o", "%T|%r|%N"]).strip()
    if not out:
        return "", "", ""
    state, reason, nodelist = (out.splitlines()[0].split("|") + ["", ""])[:3]
    return state, reason, nodelist


def wait_running(job: str, timeout_s: float) -> str:
    """The job's node list once it runs; SlurmError if it ends or is still pending at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            state, reason, nodelist = job_state(job)
        except SlurmError:
            state, reason, nodelist = "UNKNOWN", "squeue failed", ""
        if state == "RUNNING" and nodelist:
            return nodelist
        if state not in ("PENDING", "CONFIGURING", "UNKNOWN"):
            raise SlurmError(f"Slurm job {job} ended before it ran ({state or 'gone'}{': ' + reason if reason else ''})")
        if time.monotonic() > deadline:
            raise SlurmError(f"Slurm job {job} still {state.lower()} after {timeout_s:g} s ({reason})")
        time.sleep(0.1)


def node_addresses(nodelist: str) -> list[Node]:
    """The job's nodes in order, each with its ``NodeAddr`` (``scontrol show node``)."""
    names = _slurm(["scontrol", "show", "hostnames", nodelist]).split()
    out = []
    for name in names:
        text = _slurm(["scontrol", "show", "node", name])
        addr = re.search(r"\bNodeAddr=(\S+)", text)
        host = re.search(r"\bNodeHostName=(\S+)", text)
        out.append(Node(name, addr.group(1) if addr else name, host.group(1) if host else ""))
    return out


def cancel_job(job: str, timeout_s: float = RELEASE_TIMEOUT_S) -> None:
    try:
        _slurm(["scancel", job])
    except SlurmError:
        pass  # already gone
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if job_state(job)[0] == "":
                return
        except SlurmError:
            return
        time.sleep(0.1)


def _mark_released(record: Path) -> None:
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return
    data["released"] = True
    record.write_text(json.dumps(data, indent=1) + "\n")


def cancel_recorded(cell_dir: Path) -> str | None:
    """Cancel the job a cell folder records and bench did not release (bench was killed):
    the job id cancelled, or None."""
    record = cell_dir / JOB_RECORD
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if data.get("released"):
        return None
    job = str(data["job_id"])
    cancel_job(job)
    _mark_released(record)
    return job


class ClusterHandle(EngineHandle):
    """A cell's engine on a cluster: its processes (``srun`` steps) and the job; ``stop()``
    ends the steps and releases the job."""

    def __init__(self, *, job: SlurmJob, placed: Placed, client: dict[str, Any], **kw: Any) -> None:
        super().__init__(**kw)
        self.job = job
        self.placed = placed
        self.client = client
        #: each node's clock against the launching host's, by node name (set by the sweep:
        #: ``bench.sweep.cluster_clock``)
        self.clocks: dict[str, NodeClock] = {}
        self._released = False

    @property
    def info(self) -> dict[str, Any]:
        out = super().info
        for rec, p in zip(out["processes"], self.placed.processes):
            rec.update(role=p.role, node=self.job.nodes[p.node].name, rank=p.rank, ranks=p.ranks, engine_argv=list(p.argv))
        out["placement"] = {
            "manager": "slurm",
            "job_id": self.job.job_id,
            "nodes": [{"name": n.name, "address": n.address, "hostname": n.hostname, "clock": _clock_json(self.clocks.get(n.name))}
                      for n in self.job.nodes],  # fmt: skip
        }
        out["client"] = self.client
        return out

    def stop(self, grace_s: float = 10.0) -> None:
        try:
            super().stop(grace_s)
        finally:
            if not self._released:
                self._released = True
                self.job.release()


def _clock_json(clock: NodeClock | None) -> dict[str, object] | None:
    return clock.as_json() if clock is not None else None


def _log_for(log_path: Path, i: int, role: str, rank: int, ranks: int) -> Path:
    if i == 0:
        return log_path
    name = f"{role}{i}" if ranks == 1 else f"{role}-rank{rank}"
    return log_path.with_name(f"{log_path.stem}.{name}{log_path.suffix or '.log'}")


def launch_on_slurm(spec: LaunchSpec, log_path: Path, cluster: ClusterSpec, cell_id: str) -> ClusterHandle:
    """Start ``spec``'s engine on Slurm (the module's docstring); return when it is ready."""
    missing = slurm_available()
    if missing:
        raise SlurmError(missing)
    shape = placed_plan(spec, cluster)
    record = log_path.parent / JOB_RECORD
    exclude = client_exclusion(cluster)
    job_id = submit(sbatch_argv(cell_id, shape, cluster, exclude), record, cluster)
    procs: list[ManagedProcess] = []
    job = SlurmJob(job_id, record, [], watch_submitter(job_id))
    deadline = time.monotonic() + spec.ready_timeout_s
    try:
        job.nodes = node_addresses(wait_running(job_id, spec.ready_timeout_s))
        placed = placed_plan(spec, cluster, job.nodes, free_port)
        if placed.nodes != len(job.nodes):
            raise SlurmError(f"Slurm job {job_id} got {len(job.nodes)} nodes; the plan takes {placed.nodes}")
        for i, p in enumerate(placed.processes):
            env = engine_environment(dict(p.env), {}, None)
            argv = srun_argv(job_id, job.nodes[p.node].name, p.gpus, p.argv)
            proc = ManagedProcess(argv, _log_for(log_path, i, p.role, p.rank, p.ranks), env=env)
            procs.append(proc)
            proc.start()
        for p, proc in zip(placed.processes, procs):
            for path in ((p.ready_path,) if p.ready_path else ()) + p.extra_ready_paths:
                remaining = max(1.0, deadline - time.monotonic())
                proc.wait_ready(f"http://{job.nodes[p.node].address}:{p.port}{path}", remaining)
    except BaseException:
        for proc in reversed(procs):
            proc.stop(grace_s=5.0)
        job.release()
        raise
    front = placed.processes[placed.front]
    url = f"http://{job.nodes[front.node].address}:{front.port}"
    server = engine_info(spec.engine, url)
    return ClusterHandle(
        job=job, placed=placed, client={**client_round_trip(url, spec.engine, "launching-host", engine_hosts=[n.hostname for n in job.nodes]).as_json(),
                                    "excluded_nodes": list(exclude)},
        url=url, argv=list(front.argv), gpus=spec.parallel.gpus, log_path=log_path, processes=procs,
        version=server.get("version"), layout=None, server=server,
    )  # fmt: skip
