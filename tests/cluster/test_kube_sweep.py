"""``bench sweep --cluster kubernetes`` for real against a fake Kubernetes API
(tests/cluster/kube_fake.py) whose kubelet runs the pods as local processes: each cell's
Deployment runs the simulated engine from the manifests' own argv, each load runs as a Job whose
container is bench's load Job (``bench.sweep.cluster_job``), and its run folder comes back
through the pod log API into the cell folder, where bench reads it. The sweep runs as the CLI,
its client reaching the fake through a kubeconfig. Not a live cluster (docs/sweeps.md, On a
cluster). Skipped where the Kubernetes client (the optional extra) is absent."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from bench_llm.bench.sweep import cluster_job
from bench_llm.bench.sweep.cluster_job import Frame, FrameError, frame_lines, read_frame
from bench_llm.core import __version__
from bench_llm.results.reader import read_run_meta
from tests.cluster.kube_fake import FakeApi, FakeKubelet, serving
from tests.conftest import bench_argv, wait_until

SECRET = "hf_planted-kube-0123456789"

pytest.importorskip("kubernetes", reason="the Kubernetes client is not installed (pip install 'bench-llm[kubernetes]')")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeApi, FakeKubelet, dict[str, str]]]:
    work = tmp_path / "kubelet"
    work.mkdir()
    kubelet = FakeKubelet(work)
    fake = FakeApi(kubelet=kubelet)
    try:
        with serving(fake) as url:
            config = tmp_path / "kubeconfig"
            config.write_text(json.dumps({  # JSON is YAML
                "apiVersion": "v1", "kind": "Config", "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u", "namespace": "bench"}}],
            }))  # fmt: skip
            yield fake, kubelet, {**os.environ, "KUBECONFIG": str(config)}
    finally:
        kubelet.stop_all()


def _sweep(out: Path, *extra: str) -> list[str]:
    return bench_argv(
        "sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100", "--rate", "4", "--requests", "8",
        "--warmup", "0", "--input-tokens", "64", "--output-tokens", "8", "--cluster", "kubernetes",
        "--gpus-per-node", "4", "--namespace", "bench", "--image", "engine-img", "--client-image", "bench-img",
        "--ready-timeout", "60", "--no-progress", "--out", str(out), *extra,
    )  # fmt: skip


def _points(out: Path, cell: str) -> list[dict[str, Any]]:
    return pq.read_table(out / f"cell={cell}" / "points.parquet").to_pylist()


def test_a_sweep_on_kubernetes_measures_every_load_and_deletes_everything(
    cluster: tuple[FakeApi, FakeKubelet, dict[str, str]], tmp_path: Path
) -> None:
    fake, kubelet, env = cluster
    out = tmp_path / "sweep"
    env = {**env, "BENCH_T_HUB_TOKEN": SECRET}  # handed to the engine by name: through a Secret
    run = subprocess.run(_sweep(out, "--tp", "1,2", "--engine-env", "BENCH_T_HUB_TOKEN"), env=env,
                         capture_output=True, text=True, timeout=240)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    cells = {r["cell_id"]: r for r in pq.read_table(out / "cells.parquet").to_pylist()}
    assert {c: r["status"] for c, r in cells.items()} == {"tp1": "complete", "tp2": "complete"}, cells
    secrets = [b for b in fake.bodies if b["kind"] == "Secret"]
    assert [s["stringData"] for s in secrets] == [{"BENCH_T_HUB_TOKEN": SECRET}] * 2
    for body in fake.bodies:  # the value is in the cell's Secret and in no other object
        assert body["kind"] == "Secret" or SECRET not in json.dumps(body), body["kind"]
    engines = [n for n in kubelet.envs if "-engine" in n]
    assert engines and all(kubelet.envs[n]["BENCH_T_HUB_TOKEN"] == SECRET for n in engines)  # the pod got it
    for f in out.rglob("*"):
        assert not f.is_file() or SECRET.encode() not in f.read_bytes(), f
    sweep_id = json.loads((out / "sweep.json").read_text())["sweep_id"]
    for cell in ("tp1", "tp2"):
        (point,) = _points(out, cell)
        assert (point["requests"], point["failed"]) == (8, 0)  # measured in the pod, judged here
        meta = read_run_meta(out / point["run_dir"])
        assert meta["extra"]["prefix_cache"] == "reset"  # done by the load Job, against the engine
        info = meta["extra"]["engine_info"]
        assert info["placement"]["manager"] == "kubernetes"
        assert info["placement"]["selector"].startswith(f"bench-llm/cell={cell},bench-llm/sweep=")
        client = info["client"]  # measured in the load Job's pod, toward the engine's Service
        assert client["where"] == "kubernetes-job" and client["samples"] == 5 and client["round_trip_ms"]["min"] > 0
        assert meta["extra"]["sweep_id"] == sweep_id
        # the engine pod's log, read through the API before the pod was deleted
        (pod_log,) = (out / f"cell={cell}").glob("engine.*-engine0-*.log")
        assert pod_log.read_text().startswith("bench sim: {"), pod_log.read_text()[-500:]
    assert fake.objects == {}  # every object of every cell deleted, by label
    assert kubelet.running() == []
    posts = [c.split()[1].rsplit("/", 1)[-1] for c in fake.conversation if c.startswith("POST")]
    assert posts == ["secrets", "deployments", "services", "jobs"] * 2
    listed = [c.split("?")[0].rsplit("/", 1)[-1] for c in fake.conversation
              if "labelSelector=bench-llm/cell%3Dtp1%2Cbench-llm/sweep%3D" in c and "/pods?" not in c]  # fmt: skip
    assert listed == ["jobs", "leaderworkersets", "deployments", "services", "secrets"]  # the cell's objects, found to delete
    job_logs = sorted(p.name for p in kubelet.workdir.glob("*-load-*.log"))
    assert job_logs == ["tp1-load-1.log", "tp2-load-1.log"]


def test_a_failing_load_job_fails_the_cell_with_its_log_and_deletes_everything(
    cluster: tuple[FakeApi, FakeKubelet, dict[str, str]], tmp_path: Path
) -> None:
    fake, kubelet, env = cluster
    kubelet.damage_jobs = True  # the pod cannot read its load: it says so and exits 3
    out = tmp_path / "sweep"
    run = subprocess.run(_sweep(out, "--tp", "1,2"), env=env, capture_output=True, text=True, timeout=240)
    # each cell fails, the sweep goes on to its end, and says nothing was measured
    assert run.returncode == 3 and "nothing to judge" in run.stderr, run.stderr[-3000:]
    cells = {r["cell_id"]: r for r in pq.read_table(out / "cells.parquet").to_pylist()}
    assert {c: r["status"] for c, r in cells.items()} == {"tp1": "failed", "tp2": "failed"}
    assert cells["tp1"]["reason"] == ("load Job tp1-load-1 failed: error: the load Job's argument is not a load from "
                                      f"bench {__version__} (error)")  # zlib.error: the text is base64, not a compressed load  # fmt: skip
    assert fake.objects == {}
    assert kubelet.running() == []


def test_ctrl_c_during_a_load_deletes_the_cells_objects(
    cluster: tuple[FakeApi, FakeKubelet, dict[str, str]], tmp_path: Path
) -> None:
    fake, kubelet, env = cluster
    out = tmp_path / "sweep"
    argv = _sweep(out, "--tp", "1")
    argv[argv.index("--requests") + 1] = "400"  # a load of 100 s at 4 requests/s
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: any(k[0] == "jobs" for k in list(fake.objects)), 90, "the load Job created")
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert fake.objects == {}  # the Job, its pod, the Deployment, its pod and the Service
    assert kubelet.running() == []


def test_the_frame_comes_back_whole_or_not_at_all() -> None:
    frame = Frame(b"\x1f\x8b" + bytes(range(256)) * 40, expected=8, interrupted=False)
    lines = frame_lines(frame)
    assert all(len(ln) <= 76 for ln in lines[1:-1])
    log = "\n".join(["loading...", *lines, "done"])
    assert read_frame(log) == frame
    with pytest.raises(FrameError, match="cut short"):
        read_frame("\n".join(lines[:-1]))
    damaged = lines[:]
    damaged[2] = base64.b64encode(b"x" * 57).decode()
    with pytest.raises(FrameError, match="damaged"):
        read_frame("\n".join(damaged))
    with pytest.raises(FrameError, match="no run folder"):
        read_frame("Traceback: ...")


def test_a_run_folder_beyond_the_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_job, "MAX_FRAME_BYTES", 100)
    with pytest.raises(FrameError, match="more than the log frame's 100"):
        frame_lines(Frame(b"y" * 101, 1, False))


def test_resume_deletes_what_a_killed_sweep_left_and_nothing_else(tmp_path: Path) -> None:
    from bench_llm.bench.sweep.cluster_kube import delete_sweep
    from bench_llm.launch.placement import ClusterSpec

    fake = FakeApi()
    for sweep, name in (("c-0a1b2c", "tp1-engine0"), ("other", "tp1-engine0-b")):
        labels = {"bench-llm/sweep": sweep, "bench-llm/cell": "tp1"}
        fake.objects[("deployments", name)] = {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
            "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels},
                     "spec": {"containers": [{"name": "engine", "image": "i"}]}}},
        }  # fmt: skip
    (tmp_path / "sweep.json").write_text(json.dumps({"sweep_id": "0a1b2c"}))
    with serving(fake) as url:
        gone = delete_sweep(tmp_path, ClusterSpec(manager="kubernetes", namespace="bench"), api_host=url)
    assert gone == ["Deployment/tp1-engine0"]
    assert list(fake.objects) == [("deployments", "tp1-engine0-b")]
