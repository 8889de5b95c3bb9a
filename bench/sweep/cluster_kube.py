"""A sweep's cell on Kubernetes, for real (``bench sweep --cluster kubernetes``).

``launch_on_kubernetes`` applies the cell's manifests (``launch.kube``: a Deployment or a
LeaderWorkerSet per engine process and a Service each) through the official Python client
(``launch.kube_apply``), waits until they are ready (a failing pod or the deadline fails the
cell with the reason), and returns a ``KubeHandle``. Its loads do not run on the launching
host: each is a Job on a CPU node (the manifests' load Job, its command replaced by the load's
own, ``bench.sweep.cluster_job``) whose run folder comes back through the pod log API and is
unpacked into the load's run folder (``KubeLoads.run_load``), where bench reads it as any
other. Whether the engine is still up between loads is asked of the API (its objects ready, no
pod failing), not of the engine. ``stop()`` (end of the cell, an error, Ctrl-C) deletes every
object labelled with the sweep and the cell; ``--resume`` deletes what a killed sweep left
(``delete_sweep``).

Tested against a fake API server speaking the parts of the Kubernetes API used here, whose
"kubelet" runs a load Job's container as a local process (tests/cluster/test_kube_sweep.py);
not run on a live cluster.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_llm.bench.sweep.cluster_job import (
    MAX_FRAME_BYTES,
    FrameError,
    PayloadError,
    encode_payload,
    read_frame,
    unpack_folder,
)
from bench_llm.bench.sweep.loads import LoadJob, RemoteLoadError
from bench_llm.launch.kube import label_value, manifests
from bench_llm.launch.kube_apply import KubeCell, KubeError, api_client
from bench_llm.launch.launcher import LaunchSpec
from bench_llm.launch.placement import ClusterSpec

#: How long one load Job may take, from its creation (pod scheduling and image pull included).
JOB_TIMEOUT_S = 3600.0
#: The command of a load Job's container (the image has bench installed).
JOB_COMMAND = ["python3", "-m", "bench_llm.bench.sweep.cluster_job"]


def sweep_label(sweep_dir: Path) -> str:
    """The sweep's label value: its id (sweep.json), so two sweeps in one namespace never
    select each other's objects."""
    from bench_llm.bench.sweep import store

    stored = store.read_sweep_json(sweep_dir) or {}
    return label_value(str(stored.get("sweep_id") or sweep_dir.name))


@dataclass
class KubeLoads:
    """A cell's loads as Jobs in the cluster (``loads.run_load``'s ``remote``)."""

    kube: KubeCell
    #: the manifests' load Job, the template of every load's
    template: dict[str, Any]
    job_timeout_s: float = JOB_TIMEOUT_S
    #: what the prefix-cache column says: the Job resets it (its run's ``prefix_cache`` says how)
    reset_note: str = "reset by the load Job (see the run's prefix_cache)"
    seq: int = 0

    def job_object(self, payload: str) -> dict[str, Any]:
        """The next load's Job: the template with its own name and the load's command."""
        self.seq += 1
        obj = copy.deepcopy(self.template)
        name = f"{obj['metadata']['name'][:52].rstrip('-')}-{self.seq}"
        obj["metadata"]["name"] = name
        pod = obj["spec"]["template"]["spec"]
        pod.pop("volumes", None)  # results come back through the log, not a volume
        c = pod["containers"][0]
        c.pop("volumeMounts", None)
        c["command"], c["args"] = JOB_COMMAND[:1], [*JOB_COMMAND[1:], payload]
        c["env"] = [*c.get("env", []), {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
        return obj

    def run_load(self, run_dir: Path, job: LoadJob) -> tuple[int, bool]:
        """Run one load as a Job; its run folder unpacked into ``run_dir``; (measured requests
        the load should have, interrupted)."""
        try:
            payload = encode_payload(job)
        except PayloadError as exc:
            raise RemoteLoadError(str(exc)) from None
        obj = self.job_object(payload)
        name = obj["metadata"]["name"]
        try:
            log = self.kube.run_job(obj, self.job_timeout_s, limit_bytes=2 * MAX_FRAME_BYTES)
        except KubeError as exc:
            head, _, tail = str(exc).partition("; last log lines:\n")
            last = tail.strip().splitlines()[-1:] if tail.strip() else []
            raise RemoteLoadError(": ".join([head, *last]), tail) from None
        try:
            frame = read_frame(log)
        except FrameError as exc:
            raise RemoteLoadError(f"load Job {name}: {exc}", "\n".join(log.splitlines()[-5:])) from None
        unpack_folder(frame.folder, run_dir)
        return frame.expected, frame.interrupted

    def alive(self) -> bool:
        return self.kube.engine_ready()


class KubeHandle:
    """A cell's engine on Kubernetes: its objects, and its loads as Jobs."""

    def __init__(self, kube: KubeCell, loads: KubeLoads, url: str, log_path: Path, spec: LaunchSpec,
                 cluster: ClusterSpec) -> None:  # fmt: skip
        self.kube, self.remote, self.url, self.log_path = kube, loads, url, log_path
        self.version = spec.engine_version
        self.argv: list[str] | None = None
        self.info = {
            "placement": {"manager": "kubernetes", "namespace": kube.namespace, "selector": kube.selector,
                          "objects": [f"{k}/{n}" for k, n in kube.created]},  # fmt: skip
            "client": {"where": "kubernetes-job", "node_selector": list(cluster.client_node_selector),
                       "image": cluster.client_image, "engine_url": url},  # fmt: skip
        }
        self._deleted = False

    def stop(self) -> None:
        if not self._deleted:
            self._deleted = True
            try:
                save_engine_logs(self.kube, self.log_path)
            finally:
                gone = self.kube.delete()
            with self.log_path.open("a") as f:
                f.write(f"kubernetes: deleted {', '.join(f'{k}/{n}' for k, n in gone) or 'nothing'}\n")


def save_engine_logs(kube: KubeCell, log_path: Path) -> None:
    """Each engine pod's log beside the cell's ``engine.log`` (``engine.<pod>.log``), read through
    the API before the pods are deleted."""
    try:
        logs = kube.engine_logs()
    except Exception as exc:  # noqa: BLE001  # the logs are a courtesy: deleting the cell must go on
        logs, note = {}, f"kubernetes: engine pod logs not read: {type(exc).__name__}\n"
    else:
        note = "".join(f"kubernetes: pod {pod}'s log in {log_path.stem}.{pod}.log\n" for pod in logs)
    for pod, text in logs.items():
        log_path.with_name(f"{log_path.stem}.{pod}.log").write_text(text)
    with log_path.open("a") as f:
        f.write(note)


def launch_on_kubernetes(spec: LaunchSpec, log_path: Path, cluster: ClusterSpec, cell_id: str,
                         api_host: str | None = None) -> KubeHandle:  # fmt: skip
    """Apply the cell's engine and wait until it is ready (the module's docstring)."""
    sweep = sweep_label(log_path.parent.parent)
    objects = manifests(spec, cell_id, cluster, JOB_COMMAND, sweep=sweep)
    job = next(o for o in objects if o["kind"] == "Job")
    url = next(e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "ENGINE_URL")
    kube = KubeCell(objects, cluster.namespace, job["metadata"]["labels"]["bench-llm/cell"], api_client(api_host),
                    sweep=sweep)  # fmt: skip
    log_path.write_text(f"kubernetes: applying {', '.join(o['kind'] + '/' + o['metadata']['name'] for o in objects if o['kind'] != 'Job')} "
                        f"in namespace {cluster.namespace} ({kube.selector})\n")  # fmt: skip
    try:
        kube.start(spec.ready_timeout_s)
    except BaseException:
        try:
            save_engine_logs(kube, log_path)
        finally:
            kube.delete()
        raise
    with log_path.open("a") as f:
        f.write(f"kubernetes: ready; the engine is {url} inside the cluster\n")
    return KubeHandle(kube, KubeLoads(kube, job), url, log_path, spec, cluster)


def delete_sweep(sweep_dir: Path, cluster: ClusterSpec, api_host: str | None = None) -> list[str]:
    """Delete every object labelled with the sweep (``--resume`` after a killed sweep)."""
    kube = KubeCell([], cluster.namespace, "", api_client(api_host), sweep=sweep_label(sweep_dir))
    return [f"{k}/{n}" for k, n in kube.delete()]
