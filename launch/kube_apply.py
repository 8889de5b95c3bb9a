"""A cell's manifests (``launch.kube``) applied, waited on and deleted through the Kubernetes
API, with the official Python client (the optional extra ``bench-llm[kubernetes]``).

``KubeCell.run_load`` is one cell's life: create the engine's objects in order (Deployments,
LeaderWorkerSets, Services), wait until each engine object reports its replicas ready (a pod of
the cell failing, e.g. ``CrashLoopBackOff`` or an image that cannot be pulled, fails the wait at
once with the pod's reason; the deadline fails it naming what was not ready), then create the
load generator's Job and wait for it to succeed or fail, and, whatever happened, delete every
object labelled with the cell (``bench-llm/cell``, and ``bench-llm/sweep`` when given). A sweep
uses the steps on their own (``bench.sweep.cluster_kube``): ``start``, then per load
``run_job`` (create a Job, wait, return its pod's log, delete it), ``engine_ready`` between
loads, ``engine_logs`` and ``delete`` at the end. Tested against a recorded API conversation and a
fake API server (tests/cluster/test_kube_apply.py, test_kube_sweep.py), not against a live
cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench_llm.launch.kube import LWS_API
from bench_llm.launch.process import EngineStartError

LWS_GROUP, LWS_VERSION = LWS_API.split("/")
LWS_PLURAL = "leaderworkersets"
CELL_LABEL = "bench-llm/cell"
SWEEP_LABEL = "bench-llm/sweep"
#: Container waiting reasons that do not resolve by waiting.
FAILING = frozenset({"CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError",
                     "InvalidImageName", "CreateContainerError"})  # fmt: skip


class KubeError(EngineStartError):
    """A cell's objects failed or timed out on Kubernetes (the message says which and why)."""


def api_client(host: str | None = None) -> Any:
    """A client from the user's kubeconfig (or in-cluster config), or for ``host`` (tests)."""
    try:
        from kubernetes import client, config
    except ImportError:
        raise KubeError("the Kubernetes client is not installed: pip install 'bench-llm[kubernetes]'") from None
    if host is not None:
        conf = client.Configuration()
        conf.host = host
        return client.ApiClient(conf)
    try:
        config.load_kube_config()
    except Exception:  # noqa: BLE001  # no kubeconfig: bench may run inside the cluster
        config.load_incluster_config()
    return client.ApiClient()


@dataclass
class KubeCell:
    """One cell's objects on one cluster."""

    objects: list[dict[str, Any]]
    namespace: str
    cell: str
    api: Any
    poll_s: float = 2.0
    #: the sweep's label value: with it, "the cell's objects" are those of this sweep's cell only
    #: (two sweeps in one namespace may both have a cell ``tp2``)
    sweep: str | None = None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    created: list[tuple[str, str]] = field(default_factory=list)

    @property
    def selector(self) -> str:
        """The label selector of the cell's objects (with no cell: all of the sweep's)."""
        parts = ([f"{CELL_LABEL}={self.cell}"] if self.cell else []) + ([f"{SWEEP_LABEL}={self.sweep}"] if self.sweep else [])
        if not parts:  # an empty selector would select every object of the namespace
            raise KubeError("neither a cell nor a sweep to select objects by")
        return ",".join(parts)

    def _apis(self) -> tuple[Any, Any, Any, Any]:
        from kubernetes import client

        return (client.CoreV1Api(self.api), client.AppsV1Api(self.api), client.BatchV1Api(self.api),
                client.CustomObjectsApi(self.api))  # fmt: skip

    def create(self, obj: dict[str, Any]) -> None:
        core, apps, batch, custom = self._apis()
        kind, ns = obj["kind"], self.namespace
        if kind == "Deployment":
            apps.create_namespaced_deployment(ns, obj)
        elif kind == "Service":
            core.create_namespaced_service(ns, obj)
        elif kind == "Secret":
            core.create_namespaced_secret(ns, obj)
        elif kind == "Job":
            batch.create_namespaced_job(ns, obj)
        elif kind == "LeaderWorkerSet":
            custom.create_namespaced_custom_object(LWS_GROUP, LWS_VERSION, ns, LWS_PLURAL, obj)
        else:
            raise KubeError(f"bench does not apply {kind} objects")
        self.created.append((kind, obj["metadata"]["name"]))

    def _ready(self, kind: str, name: str) -> bool:
        _, apps, _, custom = self._apis()
        if kind == "Deployment":
            d = apps.read_namespaced_deployment_status(name, self.namespace)
            return (d.status.ready_replicas or 0) >= (d.spec.replicas or 1)
        lws = custom.get_namespaced_custom_object_status(LWS_GROUP, LWS_VERSION, self.namespace, LWS_PLURAL, name)
        return int((lws.get("status") or {}).get("readyReplicas") or 0) >= int(lws["spec"].get("replicas", 1))

    def _failing_pod(self) -> str | None:
        core = self._apis()[0]
        for pod in core.list_namespaced_pod(self.namespace, label_selector=self.selector).items:
            name = pod.metadata.name
            if "job-name" in (pod.metadata.labels or {}):
                continue  # a load Job's pod: its Job says how it went
            if pod.status is not None and pod.status.phase == "Failed":
                return f"pod {name} failed: {pod.status.reason or pod.status.message or 'no reason given'}"
            for cs in (pod.status.container_statuses or []) if pod.status is not None else []:
                waiting = cs.state.waiting if cs.state is not None else None
                if waiting is not None and waiting.reason in FAILING:
                    return f"pod {name}: {waiting.reason}: {waiting.message or ''}".rstrip(": ")
        return None

    def wait_ready(self, timeout_s: float) -> None:
        """Until every engine object is ready; KubeError on a failing pod or at the deadline."""
        pending = [(k, n) for k, n in self.created if k in ("Deployment", "LeaderWorkerSet")]
        deadline = self.clock() + timeout_s
        while True:
            pending = [(k, n) for k, n in pending if not self._ready(k, n)]
            if not pending:
                return
            failing = self._failing_pod()
            if failing:
                raise KubeError(f"cell {self.cell} failed to start: {failing}")
            if self.clock() > deadline:
                names = ", ".join(f"{k} {n}" for k, n in pending)
                raise KubeError(f"cell {self.cell}: not ready after {timeout_s:g} s: {names}")
            self.sleep(self.poll_s)

    def start(self, ready_timeout_s: float) -> None:
        """Create the engine's objects (everything but Jobs) and wait until they are ready."""
        for obj in self.objects:
            if obj["kind"] != "Job":
                self.create(obj)
        self.wait_ready(ready_timeout_s)

    def engine_ready(self) -> bool:
        """Is every engine object still ready, with no pod of the cell failing?"""
        engines = [(k, n) for k, n in self.created if k in ("Deployment", "LeaderWorkerSet")]
        return all(self._ready(k, n) for k, n in engines) and self._failing_pod() is None

    def pod_log(self, job: str, limit_bytes: int | None = None) -> str:
        """The log of the (last) pod of ``job`` ("" when it has none yet)."""
        core = self._apis()[0]
        pods = core.list_namespaced_pod(self.namespace, label_selector=f"job-name={job}").items
        if not pods:
            return ""
        name = sorted(pods, key=lambda p: p.metadata.name)[-1].metadata.name
        kw = {"limit_bytes": limit_bytes} if limit_bytes else {}
        return str(core.read_namespaced_pod_log(name, self.namespace, **kw))

    def engine_logs(self, tail_lines: int = 5000) -> dict[str, str]:
        """The last lines of each engine pod's log, by pod name (a pod that cannot say: its error)."""
        core = self._apis()[0]
        out = {}
        for pod in core.list_namespaced_pod(self.namespace, label_selector=self.selector).items:
            if "job-name" in (pod.metadata.labels or {}):
                continue
            try:
                out[pod.metadata.name] = str(core.read_namespaced_pod_log(pod.metadata.name, self.namespace,
                                                                          tail_lines=tail_lines))  # fmt: skip
            except Exception as exc:  # noqa: BLE001  # a pod not started yet has no log: say so, go on
                out[pod.metadata.name] = f"(no log: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})\n"
        return out

    def run_job(self, obj: dict[str, Any], timeout_s: float, limit_bytes: int | None = None) -> str:
        """Create the Job ``obj``, wait for it, and return its pod's log; the Job is deleted
        afterwards whatever happened. KubeError (with the log's last lines) when it fails."""
        name = obj["metadata"]["name"]
        self.create(obj)
        try:
            try:
                self.wait_job(name, timeout_s)
            except KubeError as exc:
                tail = "\n".join(self.pod_log(name, limit_bytes).splitlines()[-5:])
                raise KubeError(f"{exc}" + (f"; last log lines:\n{tail}" if tail else "")) from None
            return self.pod_log(name, limit_bytes)
        finally:
            self._apis()[2].delete_namespaced_job(name, self.namespace, propagation_policy="Background")
            self.created.remove(("Job", name))

    def wait_job(self, name: str, timeout_s: float) -> None:
        """Until the Job succeeds; KubeError when it fails or at the deadline."""
        batch = self._apis()[2]
        deadline = self.clock() + timeout_s
        while True:
            status = batch.read_namespaced_job_status(name, self.namespace).status
            if status.succeeded:
                return
            if status.failed:
                raise KubeError(f"load Job {name} failed")
            if self.clock() > deadline:
                raise KubeError(f"the load generator Job {name} did not finish within {timeout_s:g} s")
            self.sleep(self.poll_s)

    def delete(self) -> list[tuple[str, str]]:
        """Delete every object labelled with the cell (found by label, not by what this process
        created: a resumed sweep cleans what a dead one left); the (kind, name) deleted."""
        core, apps, batch, custom = self._apis()
        ns, sel = self.namespace, self.selector
        gone: list[tuple[str, str]] = []
        for job in batch.list_namespaced_job(ns, label_selector=sel).items:
            batch.delete_namespaced_job(job.metadata.name, ns, propagation_policy="Background")
            gone.append(("Job", job.metadata.name))
        for lws in custom.list_namespaced_custom_object(LWS_GROUP, LWS_VERSION, ns, LWS_PLURAL, label_selector=sel)["items"]:
            name = lws["metadata"]["name"]
            custom.delete_namespaced_custom_object(LWS_GROUP, LWS_VERSION, ns, LWS_PLURAL, name)
            gone.append(("LeaderWorkerSet", name))
        for d in apps.list_namespaced_deployment(ns, label_selector=sel).items:
            apps.delete_namespaced_deployment(d.metadata.name, ns, propagation_policy="Background")
            gone.append(("Deployment", d.metadata.name))
        for s in core.list_namespaced_service(ns, label_selector=sel).items:
            core.delete_namespaced_service(s.metadata.name, ns)
            gone.append(("Service", s.metadata.name))
        for s in core.list_namespaced_secret(ns, label_selector=sel).items:
            core.delete_namespaced_secret(s.metadata.name, ns)
            gone.append(("Secret", s.metadata.name))
        return gone

    def run_load(self, ready_timeout_s: float, job_timeout_s: float) -> None:
        """Apply the engine, wait for it, run the load generator Job, delete everything."""
        try:
            for obj in self.objects:
                if obj["kind"] != "Job":
                    self.create(obj)
            self.wait_ready(ready_timeout_s)
            for obj in self.objects:
                if obj["kind"] == "Job":
                    self.create(obj)
                    self.wait_job(obj["metadata"]["name"], job_timeout_s)
        finally:
            self.delete()
