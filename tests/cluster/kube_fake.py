"""A fake Kubernetes API server on 127.0.0.1 that answers as the Kubernetes API does for the
calls bench makes (created objects echoed with their metadata, status subresources, lists by
label selector, deletes answered with a Status or the object, pod logs as text), and records
the conversation. The responses are written from the API's reference, not captured from a
server.

Without a kubelet, statuses are scripted (``ready_after``, ``crash``, ``never_ready``). With
``FakeKubelet``, the pods run as local processes: a Deployment's container runs its command
(``$(VAR)`` expanded as Kubernetes does, ``POD_IP`` 127.0.0.1, its port moved to a free one
on the loopback, ready when its readiness probe answers there); a Job's container runs to its
end, its output the pod's log, the Job succeeded or failed by its exit code; a Service's name
resolves (in URLs of the containers' environment) to the loopback port of the pod it selects.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

_PATH = re.compile(r"^/(?:api/v1|apis/[^/]+/v1)/namespaces/([^/]+)/([a-z]+)(?:/([^/]+))?(?:/(status|log))?$")
_KINDS = {"deployments": "Deployment", "services": "Service", "jobs": "Job", "leaderworkersets": "LeaderWorkerSet",
          "pods": "Pod", "secrets": "Secret"}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeKubelet:
    """Runs a fake cluster's pods as local processes (the module's docstring)."""

    def __init__(self, workdir: Path, damage_jobs: bool = False) -> None:
        self.workdir = workdir
        #: a Job's last argument replaced (as if another program wrote the Job)
        self.damage_jobs = damage_jobs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, tuple[int, int]] = {}  # Deployment name -> (its port, the loopback port)
        self.services: dict[str, str] = {}  # Service name -> the Deployment it selects
        self.secrets: dict[str, dict[str, str]] = {}  # Secret name -> its data
        self.envs: dict[str, dict[str, str]] = {}  # pod's process name -> the environment its spec gave it

    def _env(self, container: dict[str, Any]) -> dict[str, str]:
        env = {"POD_IP": "127.0.0.1"}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = self._resolve(e["value"])
            elif "secretKeyRef" in e.get("valueFrom", {}):
                ref = e["valueFrom"]["secretKeyRef"]
                env[e["name"]] = self.secrets[ref["name"]][ref["key"]]
        return env

    def _resolve(self, text: str) -> str:
        """A URL naming a Service, pointed at the loopback port of the pod behind it."""

        def url(m: re.Match[str]) -> str:
            target = self.services.get(m.group(2))
            if target is None or target not in self.ports:
                return m.group(0)
            return f"{m.group(1)}127.0.0.1:{self.ports[target][1]}"

        return re.sub(r"(https?://)([a-z0-9-]+):(\d+)", url, text)

    def _argv(self, container: dict[str, Any], env: dict[str, str], moved: dict[str, str]) -> list[str]:
        argv = [*container["command"], *container.get("args", [])]
        argv = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in argv]
        argv = [moved.get(a, a) for a in argv]
        return [sys.executable if a == "python3" else a for a in argv]

    def _start(self, name: str, container: dict[str, Any], moved: dict[str, str]) -> None:
        env = self.envs[name] = self._env(container)
        log = (self.workdir / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(self._argv(container, env, moved), stdout=log, stderr=subprocess.STDOUT,
                                            env={**_base_env(), **env}, cwd=self.workdir)  # fmt: skip

    def deployment(self, obj: dict[str, Any]) -> None:
        c = obj["spec"]["template"]["spec"]["containers"][0]
        port = c["ports"][0]["containerPort"]
        local = free_port()
        self.ports[obj["metadata"]["name"]] = (port, local)
        self._start(obj["metadata"]["name"], c, {str(port): str(local), "0.0.0.0": "127.0.0.1"})

    def service(self, obj: dict[str, Any]) -> None:
        self.services[obj["metadata"]["name"]] = obj["spec"]["selector"].get("bench-llm/process", "")

    def job(self, obj: dict[str, Any]) -> None:
        c = obj["spec"]["template"]["spec"]["containers"][0]
        if self.damage_jobs:
            c = {**c, "args": [*c["args"][:-1], "bm90IGEgbG9hZA=="]}  # base64 of "not a load"
        self._start(obj["metadata"]["name"], c, {})

    def ready(self, name: str, path: str) -> bool:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None or name not in self.ports:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[name][1]}{path}", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def exit_code(self, name: str) -> int | None:
        proc = self.procs.get(name)
        return None if proc is None else proc.poll()

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def running(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "VIRTUAL_ENV")}


class FakeApi:
    """Objects by (plural, name); status answers scripted per object: ready (or, for a Job,
    succeeded) from the ``ready_after``-th status read on; ``crash``: the cell's pod crash-loops.
    With a ``kubelet``, statuses are what its processes do."""

    def __init__(self, ready_after: int = 2, crash: bool = False, never_ready: bool = False,
                 kubelet: FakeKubelet | None = None) -> None:  # fmt: skip
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads: dict[tuple[str, str], int] = {}
        self.ready_after, self.crash, self.never_ready = ready_after, crash, never_ready
        self.kubelet = kubelet
        self.conversation: list[str] = []
        #: every object as it was created (kept after it is deleted)
        self.bodies: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def handle(self, method: str, target: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any] | str]:
        parts = urlsplit(target)
        m = _PATH.match(parts.path)
        if m is None:
            return 404, _status(f"no route {parts.path}", 404)
        ns, plural, name, sub = m.groups()
        with self.lock:
            self.conversation.append(f"{method} {target}")
            if method == "POST" and name is None and body is not None:
                return self._create(plural, body)
            if method == "GET" and name is None:
                selector = dict(kv.split("=", 1) for kv in _query(parts.query).get("labelSelector", "").split(",") if kv)
                items = [o for (p, _), o in self.objects.items() if p == plural
                         and all(o["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())]  # fmt: skip
                if plural == "pods" and self.crash:
                    items = [_crashing_pod(selector)]
                return 200, {"apiVersion": "v1", "kind": f"{_KINDS[plural]}List", "metadata": {}, "items": items}
            obj = self.objects.get((plural, name or ""))
            if obj is None:
                return 404, _status(f"{plural} {name} not found", 404)
            if method == "DELETE":
                return self._delete(plural, name or "", obj)
            if method == "GET" and sub == "log" and self.kubelet is not None:
                labels = obj["metadata"]["labels"]
                return 200, self.kubelet.log(labels.get("job-name") or labels["bench-llm/process"])
            if method == "GET" and sub == "status":
                return 200, {**obj, "status": self._status(plural, name or "", obj)}
            return 405, _status("method not allowed", 405)

    def _create(self, plural: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        key = (plural, body["metadata"]["name"])
        if key in self.objects:
            return 409, _status(f"{plural} {key[1]} already exists", 409)
        obj = json.loads(json.dumps(body))
        obj["metadata"].update(uid=f"uid-{len(self.objects)}", resourceVersion="1",
                               creationTimestamp="2026-01-01T00:00:00Z")  # fmt: skip
        self.objects[key] = obj
        self.bodies.append(obj)
        if self.kubelet is not None:
            if plural == "secrets":
                self.kubelet.secrets[key[1]] = dict(obj.get("stringData") or {})
            start = {"deployments": self.kubelet.deployment, "services": self.kubelet.service, "jobs": self.kubelet.job}
            if plural in start:
                start[plural](obj)
            if plural == "deployments":  # the ReplicaSet controller makes its pod
                pod = f"{key[1]}-5d8f7-q2x9z"
                self.objects[("pods", pod)] = {"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": pod, "namespace": obj["metadata"].get("namespace"),
                    "labels": dict(obj["spec"]["template"]["metadata"]["labels"])}, "status": {"phase": "Running"}}  # fmt: skip
            if plural == "jobs":  # the Job controller makes its pod, labelled with the Job's name
                job = key[1]
                labels = {**obj["spec"]["template"]["metadata"]["labels"], "job-name": job,
                          "batch.kubernetes.io/job-name": job}  # fmt: skip
                self.objects[("pods", f"{job}-x7k2p")] = {"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": f"{job}-x7k2p", "namespace": obj["metadata"].get("namespace"), "labels": labels},
                    "status": {"phase": "Running"}}  # fmt: skip
        return 201, obj

    def _delete(self, plural: str, name: str, obj: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        del self.objects[(plural, name)]
        if self.kubelet is not None and plural in ("deployments", "jobs"):
            self.kubelet.stop(name)
            label = "job-name" if plural == "jobs" else "bench-llm/process"
            for key in [k for k, o in self.objects.items() if k[0] == "pods"
                        and o["metadata"]["labels"].get(label) == name]:  # fmt: skip
                del self.objects[key]  # propagationPolicy=Background: the owner's pods go too
        # a Service and a custom object come back as the object; the others as a Status
        return 200, (obj if plural in ("services", "leaderworkersets") else _status("deleted", 200))

    def _status(self, plural: str, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        if self.kubelet is not None:
            if plural == "jobs":
                code = self.kubelet.exit_code(name)
                return {"active": 1} if code is None else ({"succeeded": 1} if code == 0 else {"failed": 1})
            probe = obj["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"]
            ready = self.kubelet.ready(name, probe)
            return {"replicas": 1, "readyReplicas": 1 if ready else 0}
        n = self.reads[(plural, name)] = self.reads.get((plural, name), 0) + 1
        return _status_of(plural, obj, n >= self.ready_after and not self.never_ready)


def _query(q: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(q).items()}


def _status(message: str, code: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success" if code < 400 else "Failure",
            "message": message, "code": code}  # fmt: skip


def _status_of(plural: str, obj: dict[str, Any], ready: bool) -> dict[str, Any]:
    replicas = obj["spec"].get("replicas", 1)
    if plural == "jobs":
        return {"succeeded": 1} if ready else {"active": 1}
    return {"replicas": replicas, "readyReplicas": replicas if ready else 0}


def _crashing_pod(selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "engine-0", "labels": selector},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "engine", "image": "i", "imageID": "", "ready": False, "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        }]},
    }  # fmt: skip


@contextmanager
def serving(fake: FakeApi) -> Iterator[str]:
    """The fake on a free loopback port; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            code, obj = fake.handle(method, self.path, body)
            data = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(obj, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            self._reply("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._reply("POST")

        def do_DELETE(self) -> None:  # noqa: N802
            self._reply("DELETE")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
