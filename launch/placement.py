"""Where each process of a launch runs: the placement seam under the launcher.

A launch plan (``launch.engines``) lists an engine's processes as if one host held them all.
Placing it on a cluster of nodes with ``gpus_per_node`` GPUs each gives every process a node:
a process that fits on one node goes on one (first fit, in plan order); an instance that
outgrows a node becomes one rank per node, rank 0 serving HTTP and the others headless, with
the engine's own multi-node flags and the rendezvous address (rank 0's node) filled in
(``launch.multinode``); a process with no GPU (a router, bench's P/D proxy) goes on the first
node. The same function places a dry run (node addresses are placeholders such as ``<node1>``)
and a real launch (the addresses the cluster manager gives), so what a dry run prints is what
runs.

The plan is made with ``NODE_HOST`` as the engine's host; placing rewrites it per process: a
URL to another process of the plan (a router's to its instances, found by port) gets that
process's node address, every other occurrence (``--host``, the NIXL side-channel host) the
process's own. The local launcher (``launch.launcher.launch``) is the one-node case: a plan
placed on one node whose address is the local host is, argv for argv, the plan the local
launcher runs (tests/launch/test_placement.py); the local launcher keeps its own path (it
also assigns CUDA_VISIBLE_DEVICES itself, where a cluster's manager does), so its plans and
dry runs are unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench_llm.launch.engines import EngineLayout, ProcessPlan
from bench_llm.launch.multinode import PlacementError, multinode_ranks

#: The host a cluster plan is made with; replaced by node addresses when it is placed.
NODE_HOST = "@node@"
#: The managers bench places cells on (docs/sweeps.md, "On a cluster").
MANAGERS = ("slurm", "kubernetes")
#: Where the load generator runs: the host bench runs on (it must reach the nodes), the only
#: placement bench runs for real; on Kubernetes the load generator Job runs on a CPU node.
CLIENT_PLACES = ("launching-host",)


@dataclass(frozen=True)
class ClusterSpec:
    """A sweep's cluster (``bench sweep --cluster``; TOML ``[cluster]``)."""

    manager: str = "slurm"
    #: GPUs each node offers (Slurm ``--gres=gpu:N`` per node; Kubernetes ``nvidia.com/gpu``).
    gpus_per_node: int = 8
    #: Most nodes a cell may take (None: as many as it needs; the manager may still refuse).
    max_nodes: int | None = None
    #: Slurm: the GPU type in the gres request (``gpu:h100:4``); None: any.
    gres_type: str | None = None
    #: Slurm: the user's own sbatch options, passed through (``--partition=gpu``, ``--account=A``, ``--qos=Q``).
    sbatch_args: tuple[str, ...] = ()
    #: Slurm ``--time`` in minutes: the dead-man limit after which the manager ends a cell's job
    #: even if bench died and nobody resumed.
    time_limit_min: int = 120
    #: Where the load generator runs (CLIENT_PLACES).
    client: str = "launching-host"
    #: Slurm: may a cell's engine run on a node of the launching host (where the load generator
    #: runs)? By default not: such nodes are excluded from every job (``sbatch --exclude``), so
    #: the client never shares a node, its CPUs or its NIC with an engine.
    client_shares_node: bool = False
    #: Kubernetes: the namespace, the engine's container image and the load generator's.
    namespace: str = "default"
    image: str | None = None
    client_image: str | None = None
    #: Kubernetes: node labels of the CPU nodes the load generator Job is scheduled on.
    client_node_selector: tuple[str, ...] = ("node-role.kubernetes.io/cpu=true",)

    def __post_init__(self) -> None:
        if self.manager not in MANAGERS:
            raise ValueError(f"cluster manager {self.manager!r}: use one of {', '.join(MANAGERS)}")
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ValueError(f"cluster gpus_per_node {self.gpus_per_node!r}: a positive integer")
        if self.max_nodes is not None and self.max_nodes < 1:
            raise ValueError(f"cluster max_nodes {self.max_nodes!r}: a positive integer")
        if self.time_limit_min < 1:
            raise ValueError(f"cluster time_limit_min {self.time_limit_min!r}: at least 1 minute")
        if self.client not in CLIENT_PLACES:
            raise ValueError(f"cluster client {self.client!r}: use one of {', '.join(CLIENT_PLACES)}")
        for item in self.client_node_selector:
            if "=" not in item:
                raise ValueError(f"cluster client_node_selector {item!r}: expected LABEL=VALUE")


@dataclass(frozen=True)
class Node:
    """A node of an allocation: its name and the address other nodes and the client reach it at."""

    name: str
    address: str
    #: the host name it runs on (Slurm ``NodeHostname``), where known
    hostname: str = ""


@dataclass(frozen=True)
class NodeClock:
    """A node's wall clock against the launching host's (``bench.sweep.cluster_clock``):
    ``offset_ns`` node minus launching host, ``bound_ns`` its error bound, from ``samples``
    exchanges; or ``error`` when the node's step did not answer (no offset then)."""

    node: str
    samples: int
    offset_ns: int | None = None
    bound_ns: int | None = None
    error: str | None = None
    #: what was compared (recorded with each measured offset)
    CLOCK = "time.time_ns (wall clock), node minus launching host"

    def as_json(self) -> dict[str, object]:
        """As ``engine_info.placement.nodes[].clock`` records it."""
        if self.error is not None:
            return {"node": self.node, "error": self.error, "samples": self.samples}
        return {"node": self.node, "offset_ns": self.offset_ns, "bound_ns": self.bound_ns, "samples": self.samples,
                "clock": self.CLOCK}  # fmt: skip


@dataclass(frozen=True)
class PlacedProcess:
    """One process of a placed launch."""

    role: str
    argv: tuple[str, ...]
    #: The environment bench sets for it (the plan's and the user's; no CUDA_VISIBLE_DEVICES:
    #: the cluster manager gives each process its GPUs).
    env: tuple[tuple[str, str], ...]
    gpus: int
    #: index of its node in the allocation
    node: int
    port: int
    #: rank within its instance (0 serves; >0: headless, never probed)
    rank: int = 0
    #: ranks of its instance (1: it fits on one node)
    ranks: int = 1
    #: the plan process it comes from (``EngineLayout.processes`` index)
    source: int = 0
    ready_path: str | None = "/health"
    extra_ready_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placed:
    """A launch placed on nodes."""

    processes: tuple[PlacedProcess, ...]
    #: nodes the launch takes
    nodes: int
    #: the most GPUs / processes any one node holds (what a Slurm job asks per node)
    gpus_per_node: int
    processes_per_node: int
    #: the process clients talk to, and its port
    front: int
    front_port: int


def placeholder(i: int) -> str:
    """A dry run's address of node ``i``."""
    return f"<node{i}>"


def process_gpus(layout: EngineLayout, plan: ProcessPlan, engine_gpus: int) -> int:
    """GPUs a process takes on a node. The simulated engine's one process stands for an engine
    that occupies the configuration's GPUs (it is given none locally, ``assign_gpus=False``)."""
    if not layout.assign_gpus and len(layout.processes) == 1:
        return engine_gpus
    return plan.gpus


def place(
    engine: str,
    layout: EngineLayout,
    engine_gpus: int,
    gpus_per_node: int,
    address: Callable[[int], str] = placeholder,
    rendezvous_port: Callable[[], int] | None = None,
    user_env: Sequence[tuple[str, str]] = (),
) -> Placed:
    """Place ``layout`` (planned with ``NODE_HOST``) on nodes of ``gpus_per_node`` GPUs;
    ``address(i)``: node i's address; ``rendezvous_port()``: a port for a multi-node instance's
    rendezvous (default: its rank 0's HTTP port + 1000). Raises PlacementError."""
    used: list[int] = []  # GPUs used per node
    procs_on: list[int] = []  # processes per node
    slots: list[tuple[int, ProcessPlan, int, int, int]] = []  # (source, plan, node, rank, ranks)
    for i, plan in enumerate(layout.processes):
        gpus = process_gpus(layout, plan, engine_gpus)
        if gpus == 0:
            continue
        if gpus <= gpus_per_node:
            node = next((n for n, u in enumerate(used) if u + gpus <= gpus_per_node), len(used))
            if node == len(used):
                used.append(0)
                procs_on.append(0)
            used[node] += gpus
            procs_on[node] += 1
            slots.append((i, plan, node, 0, 1))
            continue
        if gpus % gpus_per_node:
            raise PlacementError(
                f"the {plan.role} instance needs {gpus} GPUs, not a whole number of {gpus_per_node}-GPU nodes"
            )
        n = gpus // gpus_per_node
        first = len(used)
        used += [gpus_per_node] * n
        procs_on += [1] * n
        slots += [(i, plan, first + r, r, n) for r in range(n)]
    for i, plan in enumerate(layout.processes):  # the GPU-less processes: on the first node
        if process_gpus(layout, plan, engine_gpus) == 0:
            if not used:
                used.append(0)
                procs_on.append(0)
            procs_on[0] += 1
            slots.append((i, plan, 0, 0, 1))
    slots.sort(key=lambda s: (s[0], s[3]))
    node_of_port = {plan.port: node for _, plan, node, rank, _ in slots if rank == 0}
    rendezvous = {
        source: rendezvous_port() if rendezvous_port is not None else plan.port + 1000
        for source, plan, _, rank, ranks in slots
        if ranks > 1 and rank == 0
    }
    out: list[PlacedProcess] = []
    for source, plan, node, rank, ranks in slots:
        gpus = process_gpus(layout, plan, engine_gpus) // ranks
        argv, ready, extra = list(plan.argv), plan.ready_path, plan.extra_ready_paths
        if ranks > 1:
            master = node_of_port[plan.port]
            argv = multinode_ranks(engine, argv, ranks, rank, address(master), rendezvous[source], gpus)
            if rank > 0:
                ready, extra = None, ()
        argv = _rewrite(argv, node, node_of_port, address)
        env = {**plan.env, **dict(user_env)}
        env = {k: _rewrite([v], node, node_of_port, address)[0] for k, v in env.items()}
        out.append(PlacedProcess(plan.role, tuple(argv), tuple(sorted(env.items())), gpus, node, plan.port, rank,
                                 ranks, source, ready, extra))  # fmt: skip
    front = next(k for k, p in enumerate(out) if p.source == layout.front_index and p.rank == 0)
    return Placed(tuple(out), len(used), max(used, default=0), max(procs_on, default=1), front, layout.front_port)


_URL = re.compile(r"(https?://)" + re.escape(NODE_HOST) + r":(\d+)")


def _rewrite(argv: Sequence[str], own: int, node_of_port: dict[int, int], address: Callable[[int], str]) -> list[str]:
    def url(m: re.Match[str]) -> str:
        return f"{m.group(1)}{address(node_of_port.get(int(m.group(2)), own))}:{m.group(2)}"

    return [_URL.sub(url, a).replace(NODE_HOST, address(own)) for a in argv]




