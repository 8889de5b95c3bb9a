"""Applying, waiting on and deleting a cell's manifests through the official Kubernetes Python
client (launch/kube_apply.py), against a fake API server on 127.0.0.1 that answers as the
Kubernetes API does (tests/cluster/kube_fake.py). The conversation the client holds with it is
compared with a recorded one (tests/cluster/data/kube-conversation-*.txt; BENCH_UPDATE_GOLDEN=1
rewrites them after review). Skipped where the client (the optional extra) is absent. Not a
live cluster: the responses are written from the API's reference, not captured from a server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench_llm.launch import engines
from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.kube import manifests
from bench_llm.launch.kube_apply import KubeCell, KubeError
from bench_llm.launch.launcher import LaunchSpec
from bench_llm.launch.placement import ClusterSpec
from tests.cluster.kube_fake import FakeApi, serving

pytest.importorskip("kubernetes", reason="the Kubernetes client is not installed (pip install 'bench-llm[kubernetes]')")

DATA = Path(__file__).parent / "data"


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, str]]:
    fake = FakeApi()
    with serving(fake) as url:
        yield fake, url


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
