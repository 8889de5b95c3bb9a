"""Kubernetes: one cell's engine as manifests (``bench sweep --cluster kubernetes --dry-run``).

Per process of the launch plan (``launch.engines``): an instance that fits on one node is a
``Deployment`` of one pod; one that outgrows a node (more GPUs than ``gpus_per_node``) is a
``LeaderWorkerSet`` (leaderworkerset.x-k8s.io/v1) of one group, its leader rank 0 serving HTTP
and its workers headless, the rendezvous address being ``$(LWS_LEADER_ADDRESS)`` and a
worker's node rank ``$(LWS_WORKER_INDEX)``, both injected by LWS (``RecreateGroupOnPodRestart``:
a lost rank restarts the group, as the instance cannot serve without it). Every process with
a port gets a ``Service`` (a LeaderWorkerSet's selects its leader), and a router's URLs to its
instances name those Services. The load generator is a ``batch/v1`` ``Job`` on a CPU node
(``client_node_selector``) that writes its run folder to the ``bench-results`` volume. A
variable whose name says it holds a secret (``core.redact.secret_name``; bench takes such a value
from its own environment only) goes into a ``Secret`` of the cell and reaches the pods through
``secretKeyRef``, never as a value in a pod's spec.
Everything carries the labels ``bench-llm/sweep`` and ``bench-llm/cell``, so a cell is deleted
by label.

The multi-node argv is ``launch.multinode``'s, as on Slurm. These manifests were checked
against the Kubernetes schemas (``kubernetes-validate --strict``) and the fields of the LWS
API bench uses; they have not run on a live cluster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from bench_llm.core.redact import secret_name
from bench_llm.launch.engines import EngineLayout, ProcessPlan
from bench_llm.launch.multinode import PlacementError, multinode_ranks
from bench_llm.launch.placement import NODE_HOST, ClusterSpec, process_gpus
from bench_llm.launch.profiles import plan_engine
from bench_llm.launch.spec import LaunchSpec

#: The port a multi-node instance's ranks meet at (inside the leader pod, so a fixed one).
RENDEZVOUS_PORT = 29500
LWS_API = "leaderworkerset.x-k8s.io/v1"
GPU_RESOURCE = "nvidia.com/gpu"
RESULTS_VOLUME = "bench-results"


def _name(text: str) -> str:
    """A DNS-1035 label (Service and pod names): lower case, digits and '-', at most 63."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not out or not out[0].isalpha():
        out = "c-" + out
    return out[:63].rstrip("-")


def label_value(text: str) -> str:
    """``text`` as the manifests' label values and names spell it (``bench-llm/sweep``, ``bench-llm/cell``)."""
    return _name(text)


def _in_image(argv: Sequence[str]) -> list[str]:
    """The program as the image has it: ``vllm serve ...``, ``python3 -m MODULE ...``."""
    argv = list(argv)
    if "serve" in argv and "-m" not in argv:
        return ["vllm", *argv[argv.index("serve"):]]
    if "-m" in argv:
        return ["python3", *argv[argv.index("-m"):]]
    return argv


def _rewrite(text: str, services: dict[int, str]) -> str:
    """URLs to another process (by port) name its Service; ``--host`` binds every interface;
    any other own-host mention is the pod's IP."""

    def url(m: re.Match[str]) -> str:
        port = int(m.group(2))
        return f"{m.group(1)}{services.get(port, '$(POD_IP)')}:{port}"

    text = re.sub(r"(https?://)" + re.escape(NODE_HOST) + r":(\d+)", url, text)
    return text.replace(NODE_HOST, "$(POD_IP)")


def _argv(argv: Sequence[str], services: dict[int, str]) -> list[str]:
    out = []
    for i, a in enumerate(argv):
        if a == NODE_HOST and i > 0 and argv[i - 1] in ("--host", "--hostname"):
            out.append("0.0.0.0")
        else:
            out.append(_rewrite(a, services))
    return out


def _container(name: str, image: str, argv: list[str], env: dict[str, str], gpus: int, port: int | None,
               ready: str | None, secrets: Mapping[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """``secrets``: variable -> the cell's Secret that holds its value (``manifests``)."""

    def var(k: str, v: str) -> dict[str, Any]:
        if secrets and k in secrets:  # the value lives in the Secret, not in the pod's spec
            return {"name": k, "valueFrom": {"secretKeyRef": {"name": secrets[k], "key": k}}}
        return {"name": k, "value": v}

    c: dict[str, Any] = {
        "name": name,
        "image": image,
        "command": argv[:1],
        "args": argv[1:],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
        + [var(k, v) for k, v in sorted(env.items())],
    }
    if gpus:
        c["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}}  # a quantity, as the API spells it
    if port is not None:
        c["ports"] = [{"containerPort": port, "name": "http"}]
    if ready is not None and port is not None:
        c["readinessProbe"] = {"httpGet": {"path": ready, "port": port}, "periodSeconds": 5, "failureThreshold": 3}
    return c


def _meta(name: str, labels: dict[str, str], namespace: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(labels)}


def _pod(labels: dict[str, str], container: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"labels": dict(labels)}, "spec": {"containers": [container], "restartPolicy": "Always"}}


def _worker_argv(engine: str, argv: list[str], ranks: int, gpus: int) -> list[str]:
    """A headless rank's argv for every worker pod: its node rank from ``LWS_WORKER_INDEX``."""
    out = multinode_ranks(engine, argv, ranks, 1, "$(LWS_LEADER_ADDRESS)", RENDEZVOUS_PORT, gpus)
    if "--node-rank" in out:
        out[out.index("--node-rank") + 1] = "$(LWS_WORKER_INDEX)"
    if "--data-parallel-start-rank" in out:  # start rank = worker index × local DP ranks: a shell multiplies
        i = out.index("--data-parallel-start-rank")
        local = int(out[i + 1])
        rest = out[:i] + out[i + 2:]
        return ["sh", "-c", f'exec "$0" "$@" --data-parallel-start-rank "$((LWS_WORKER_INDEX * {local}))"', *rest]
    return out


def manifests(spec: LaunchSpec, cell_id: str, cluster: ClusterSpec, client_argv: Sequence[str],
              sweep: str = "sweep") -> list[dict[str, Any]]:  # fmt: skip
    """The cell's objects, in the order they are applied."""
    spec = replace(spec, host=NODE_HOST, plan_only=True)
    ports = iter(range(8001, 9000))
    layout: EngineLayout = plan_engine(spec, 8000, lambda _h: next(ports))
    cell = _name(cell_id)
    base = {"bench-llm/sweep": _name(sweep), "bench-llm/cell": cell}
    image = cluster.image or f"<{spec.engine} image>"
    names = [_name(f"{cell}-{p.role}{i}") for i, p in enumerate(layout.processes)]
    services = {p.port: names[i] for i, p in enumerate(layout.processes)}
    out: list[dict[str, Any]] = []
    hidden = {k: v for k, v in dict(spec.env).items() if secret_name(k)}
    secret = _name(f"{cell}-env")
    secrets = dict.fromkeys(hidden, secret)  # exactly the variables the Secret holds
    if hidden:  # a secret given by name (--engine-env HF_TOKEN) reaches the pods through a Secret
        out.append({"apiVersion": "v1", "kind": "Secret", "metadata": _meta(secret, base, cluster.namespace),
                    "type": "Opaque", "stringData": hidden})  # fmt: skip
    for i, plan in enumerate(layout.processes):
        out += _process_objects(spec, cluster, layout, i, plan, names[i], base, image, services, secrets)
    front = layout.processes[layout.front_index]
    out.append(_client_job(cell, base, cluster, client_argv, f"http://{names[layout.front_index]}:{front.port}", cell_id))
    return out


def _process_objects(spec: LaunchSpec, cluster: ClusterSpec, layout: EngineLayout, i: int, plan: ProcessPlan,
                     name: str, base: dict[str, str], image: str, services: dict[int, str],
                     secrets: Mapping[str, str] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    ns = cluster.namespace
    gpus = process_gpus(layout, plan, spec.parallel.gpus)
    if any(a.startswith("bench_llm.") for a in plan.argv):  # bench's own process (the vLLM P/D proxy)
        image = cluster.client_image or "<bench image>"
    argv = _argv(_in_image(plan.argv), services)
    env = {k: _rewrite(v, services) for k, v in {**plan.env, **dict(spec.env)}.items()}
    labels = {**base, "bench-llm/process": name}
    objs: list[dict[str, Any]] = []
    if gpus > cluster.gpus_per_node:
        if gpus % cluster.gpus_per_node:
            raise PlacementError(f"the {plan.role} instance needs {gpus} GPUs, not a whole number of "
                                 f"{cluster.gpus_per_node}-GPU nodes")  # fmt: skip
        ranks, per = gpus // cluster.gpus_per_node, cluster.gpus_per_node
        leader = multinode_ranks(spec.engine, argv, ranks, 0, "$(LWS_LEADER_ADDRESS)", RENDEZVOUS_PORT, per)
        worker = _worker_argv(spec.engine, argv, ranks, per)
        objs.append({
            "apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": _meta(name, labels, ns),
            "spec": {
                "replicas": 1,
                "startupPolicy": "LeaderCreated",
                "leaderWorkerTemplate": {
                    "size": ranks,
                    "restartPolicy": "RecreateGroupOnPodRestart",
                    "leaderTemplate": _pod(labels, _container("engine", image, leader, env, per, plan.port, plan.ready_path, secrets)),
                    "workerTemplate": _pod(labels, _container("engine", image, worker, env, per, None, None, secrets)),
                },
            },
        })  # fmt: skip
        selector = {"leaderworkerset.sigs.k8s.io/name": name, "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    else:
        objs.append({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(name, labels, ns),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"bench-llm/process": name}},
                "template": _pod(labels, _container("engine", image, argv, env, gpus, plan.port, plan.ready_path, secrets)),
            },
        })  # fmt: skip
        selector = {"bench-llm/process": name}
    objs.append({
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(name, labels, ns),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": plan.port, "targetPort": plan.port}]},
    })  # fmt: skip
    return objs


def _client_job(cell: str, base: dict[str, str], cluster: ClusterSpec, argv: Sequence[str], url: str,
                cell_id: str) -> dict[str, Any]:  # fmt: skip
    name = _name(f"{cell}-load")
    labels = {**base, "bench-llm/process": name}
    selector = dict(item.split("=", 1) for item in cluster.client_node_selector)
    container = {
        "name": "load",
        "image": cluster.client_image or "<bench image>",
        "command": list(argv[:1]),
        "args": list(argv[1:]),
        "env": [{"name": "ENGINE_URL", "value": url}, {"name": "CELL_ID", "value": cell_id}],
        "volumeMounts": [{"name": RESULTS_VOLUME, "mountPath": "/results"}],
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(name, labels, cluster.namespace),
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": selector,
                    "containers": [container],
                    "volumes": [{"name": RESULTS_VOLUME, "persistentVolumeClaim": {"claimName": RESULTS_VOLUME}}],
                },
            },
        },
    }  # fmt: skip


def to_yaml(obj: Any, indent: int = 0) -> str:
    """A small YAML writer for manifests: mappings, lists, and scalars (strings JSON-quoted,
    which YAML reads as the same strings)."""
    pad = "  " * indent
    if isinstance(obj, dict):
        if not obj:
            return pad + "{}\n"
        out = []
        for k, v in obj.items():
            if isinstance(v, (dict, list)) and v:
                out.append(f"{pad}{k}:\n{to_yaml(v, indent + 1)}")
            else:
                out.append(f"{pad}{k}: {_scalar(v)}\n")
        return "".join(out)
    if isinstance(obj, list):
        if not obj:
            return pad + "[]\n"
        out = []
        for v in obj:
            if isinstance(v, (dict, list)) and v:
                body = to_yaml(v, indent + 1)
                out.append(f"{pad}- {body.lstrip()}")
            else:
                out.append(f"{pad}- {_scalar(v)}\n")
        return "".join(out)
    return pad + _scalar(obj) + "\n"


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    if v is None:
        return "null"
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, list):
        return "[]"
    return json.dumps(str(v))


def manifests_yaml(spec: LaunchSpec, cell_id: str, cluster: ClusterSpec, client_argv: Sequence[str],
                   sweep: str = "sweep") -> str:  # fmt: skip
    return "".join("---\n" + to_yaml(m) for m in manifests(spec, cell_id, cluster, client_argv, sweep))
