"""Applying, waiting on and deleting a cell's manifests through the official Kubernetes Python
client (launch/kube_apply.py), against a fake API server on 127.0.0.1 that answers as the
Kubernetes API does (created objects echoed with their metadata, status subresources, lists by
label selector, deletes answered with a Status). The conversation the client holds with it is
compared with a recorded one (tests/cluster/data/kube-conversation-*.txt; BENCH_UPDATE_GOLDEN=1
rewrites them after review). Skipped where the client (the optional extra) is absent. Not a
live cluster: the responses are written from the API's reference, not captured from a server."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from bench_llm.launch import engines
from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.kube import manifests
from bench_llm.launch.kube_apply import KubeCell, KubeError
from bench_llm.launch.launcher import LaunchSpec
from bench_llm.launch.placement import ClusterSpec

pytest.importorskip("kubernetes", reason="the Kubernetes client is not installed (pip install 'bench-llm[kubernetes]')")

DATA = Path(__file__).parent / "data"
_PATH = re.compile(r"^/(?:api/v1|apis/[^/]+/v1)/namespaces/([^/]+)/([a-z]+)(?:/([^/]+))?(?:/(status))?$")
_KINDS = {"deployments": "Deployment", "services": "Service", "jobs": "Job", "leaderworkersets": "LeaderWorkerSet",
          "pods": "Pod"}  # fmt: skip


class FakeApi:
    """Objects by (plural, name); status answers scripted per object: ready (or, for a Job,
    succeeded) from the ``ready_after``-th status read on; ``crash``: the cell's pod crash-loops."""

    def __init__(self, ready_after: int = 2, crash: bool = False, never_ready: bool = False) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads: dict[tuple[str, str], int] = {}
        self.ready_after, self.crash, self.never_ready = ready_after, crash, never_ready
        self.conversation: list[str] = []
        self.lock = threading.Lock()

    def handle(self, method: str, target: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(target)
        m = _PATH.match(parts.path)
        if m is None:
            return 404, _status(f"no route {parts.path}", 404)
        ns, plural, name, sub = m.groups()
        with self.lock:
            self.conversation.append(f"{method} {target}")
            if method == "POST" and name is None and body is not None:
                key = (plural, body["metadata"]["name"])
                if key in self.objects:
                    return 409, _status(f"{plural} {key[1]} already exists", 409)
                obj = json.loads(json.dumps(body))
                obj["metadata"].update(uid=f"uid-{len(self.objects)}", resourceVersion="1",
                                       creationTimestamp="2026-01-01T00:00:00Z")  # fmt: skip
                self.objects[key] = obj
                return 201, obj
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
                del self.objects[(plural, name or "")]
                # a Service and a custom object come back as the object; the others as a Status
                return 200, (obj if plural in ("services", "leaderworkersets") else _status("deleted", 200))
            if method == "GET" and sub == "status":
                n = self.reads[(plural, name or "")] = self.reads.get((plural, name or ""), 0) + 1
                ready = n >= self.ready_after and not self.never_ready
                obj = {**obj, "status": _status_of(plural, obj, ready)}
                return 200, obj
            return 405, _status("method not allowed", 405)


def _query(q: str) -> dict[str, str]:
    from urllib.parse import parse_qs

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


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, str]]:
    fake = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            code, obj = fake.handle(method, self.path, body)
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
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
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _cell(host: str, engine: str, axes: str, **kw: Any) -> KubeCell:
    from bench_llm.launch.kube_apply import api_client

    cluster = ClusterSpec(manager="kubernetes", gpus_per_node=8, namespace="bench", image="img", client_image="bench-img")
    spec = LaunchSpec(engine=engine, model="org/M", parallel=ParallelConfig.parse(axes))
    objects = manifests(spec, spec.parallel.cell_id, cluster, ["bench", "run"], sweep="s1")
    return KubeCell(objects, "bench", spec.parallel.cell_id, api_client(host), poll_s=0.0, sleep=lambda _s: None, **kw)


@pytest.fixture(autouse=True)
def _programs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "vllm_command", lambda: ["vllm"])


def _golden(name: str, lines: list[str]) -> None:
    path = DATA / f"kube-conversation-{name}.txt"
    text = "\n".join(lines) + "\n"
    if os.environ.get("BENCH_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (BENCH_UPDATE_GOLDEN=1 rewrites it after review)"


def test_apply_wait_run_the_load_and_delete_by_label(api: tuple[FakeApi, str]) -> None:
    fake, host = api
    cell = _cell(host, "vllm", "tp=8,pp=2")
    cell.run_load(ready_timeout_s=60, job_timeout_s=60)
    assert fake.objects == {}  # everything labelled with the cell deleted
    assert [c for c in fake.conversation if c.startswith("POST")] == [
        "POST /apis/leaderworkerset.x-k8s.io/v1/namespaces/bench/leaderworkersets",
        "POST /api/v1/namespaces/bench/services",
        "POST /apis/batch/v1/namespaces/bench/jobs",
    ]
    _golden("vllm-pp-across-nodes", fake.conversation)


def test_a_crashing_pod_fails_the_start_and_everything_is_deleted(api: tuple[FakeApi, str]) -> None:
    fake, host = api
    fake.crash, fake.ready_after = True, 10**6
    cell = _cell(host, "vllm", "tp=2,disagg=1:1")
    with pytest.raises(KubeError, match="pod engine-0: CrashLoopBackOff: back-off 40s"):
        cell.run_load(ready_timeout_s=60, job_timeout_s=60)
    assert fake.objects == {}
    assert not any("/jobs" in c and c.startswith("POST") for c in fake.conversation)  # no load on a dead engine
    _golden("vllm-pd-pair-crash", fake.conversation)


def test_not_ready_by_the_deadline_names_what_and_deletes(api: tuple[FakeApi, str]) -> None:
    fake, host = api
    fake.never_ready = True
    ticks = iter(range(0, 10**6, 30))
    cell = _cell(host, "sglang", "tp=16", clock=lambda: float(next(ticks)))
    with pytest.raises(KubeError, match=r"not ready after 100 s: LeaderWorkerSet tp16-engine0"):
        cell.run_load(ready_timeout_s=100, job_timeout_s=60)
    assert fake.objects == {}
