"""``bench sweep --cluster slurm`` on a real two-node Slurm cluster made in a scratch folder
(tests/cluster/slurm_cluster.py; skipped, saying why, where slurm-wlm/munge are absent or the
daemons cannot start). The simulated engine is each rank's engine, as bench launches it.

One sweep of three cells on nodes of 4 GPUs: tp2 and tp4 side by side (``--jobs 2``: two
concurrent jobs), then tp8, whose instance spans both nodes (rank 0 serving, rank 1 headless,
joined at the rendezvous address rank 0's argv names; Slurm gives each rank its 4 GPUs). Every
load is measured; afterwards no job, engine process or engine port is left. Then sweeps whose
bench is SIGKILLed or SIGTERMed while its cell's job runs: the job ends with bench, and
``--resume`` finishes the cell, again leaving nothing behind; and ``--resume`` cancelling a job
its cell folder records as left running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.cluster.slurm_cluster import Cluster, start_cluster
from tests.conftest import bench_argv, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    made, why = start_cluster(tmp_path_factory.mktemp("slurm"))
    if made is None:
        pytest.skip(why)
    try:
        yield made
    finally:
        made.stop()


def _sweep(out: Path, *extra: str) -> list[str]:
    return bench_argv(
        "sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--gpu", "h100", "--rate", "4", "--requests", "8",
        "--warmup", "0", "--input-tokens", "64", "--output-tokens", "8", "--cluster", "slurm", "--gpus-per-node", "4",
        "--time-limit", "5", "--sbatch-arg=--partition=gpu", "--no-progress", "--out", str(out),
        "--client-shares-node", *extra,  # the test's nodes are all this machine, where the client runs
    )  # fmt: skip


def _cells(out: Path) -> dict[str, dict[str, Any]]:
    return {r["cell_id"]: r for r in pq.read_table(out / "cells.parquet").to_pylist()}


def _points(out: Path, cell: str) -> list[dict[str, Any]]:
    return pq.read_table(out / f"cell={cell}" / "points.parquet").to_pylist()


def _ranks(log: Path) -> dict[int, dict[str, Any]]:
    """What each rank said about itself in its log (sim/rendezvous.py)."""
    out = {}
    for line in log.read_text().splitlines():
        if line.startswith("bench sim: rank {"):
            me = json.loads(line.split("rank ", 1)[1])
            out[me["node_rank"]] = me
    return out


def _ports(info: dict[str, Any]) -> set[int]:
    """Every port the cell's engine processes were told to use."""
    out = set()
    for p in info["processes"]:
        argv = p["engine_argv"]
        for flag in ("--port", "--master-port"):
            if flag in argv:
                out.add(int(argv[argv.index(flag) + 1]))
    return out


def _listening(port: int, address: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((address, port)) == 0


def _engine_processes(ports: set[int]) -> list[str]:
    """Live processes whose command line names one of ``ports`` after --port/--master-port."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        for flag in ("--port", "--master-port"):
            if flag in argv[:-1] and argv[argv.index(flag) + 1].isdigit() and int(argv[argv.index(flag) + 1]) in ports:
                if "sim" in argv and "serve" in argv:
                    found.append(f"{d.name}: {' '.join(argv)[:200]}")
    return found


def _nothing_left(cluster: Cluster, infos: list[dict[str, Any]]) -> None:
    ports = set().union(*(_ports(i) for i in infos))
    wait_until(lambda: not cluster.jobs(), 15, f"Slurm jobs gone ({cluster.jobs()})")
    wait_until(lambda: not _engine_processes(ports), 15, "every engine process ended")
    assert [p for p in ports if _listening(p)] == []


def test_multi_node_and_side_by_side_cells(cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    run = subprocess.run(_sweep(out, "--tp", "2,4,8,16", "--jobs", "2"), env=cluster.env, capture_output=True,
                         text=True, timeout=240)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:] + cluster.log_tail()
    cells = _cells(out)
    # tp16 needs four nodes: Slurm's own answer, asked before anything started, skips it
    assert cells.pop("tp16")["reason"] == ("Slurm refuses its job (4 nodes of 4 GPUs): allocation failure: "
                                           "Requested node configuration is not available")  # fmt: skip
    assert {c: r["status"] for c, r in cells.items()} == {"tp2": "complete", "tp4": "complete", "tp8": "complete"}
    for cell in cells:  # every load measured, every request answered
        points = _points(out, cell)
        assert points and all(p["status"] == "complete" and p["ok"] == p["requests"] == 8 for p in points), points
    infos = {c: json.loads(r["engine_info"]) for c, r in cells.items()}

    # tp2 and tp4 ran side by side, as two jobs
    a, b = cells["tp2"], cells["tp4"]
    assert a["started_unix_s"] < b["ended_unix_s"] and b["started_unix_s"] < a["ended_unix_s"], (a, b)
    assert infos["tp2"]["placement"]["job_id"] != infos["tp4"]["placement"]["job_id"]
    # each single-node engine got its own GPUs from Slurm (disjoint where they shared a node)
    seen: dict[str, set[str]] = {}
    for cell, n in (("tp2", 2), ("tp4", 4)):
        me = _ranks(out / f"cell={cell}" / "engine.log")[0]
        devices = me["cuda_visible_devices"].split(",")
        assert len(set(devices)) == n, me
        node = infos[cell]["processes"][0]["node"]
        assert not seen.get(node, set()) & set(devices), (seen, node, devices)
        seen.setdefault(node, set()).update(devices)

    # tp8 spans both nodes: rank 0 serves, rank 1 is headless, both met at rank 0's rendezvous
    info = infos["tp8"]
    procs = info["processes"]
    assert [(p["rank"], p["ranks"]) for p in procs] == [(0, 2), (1, 2)]
    assert sorted(p["node"] for p in procs) == ["n1", "n2"]
    lead, worker = (p["engine_argv"] for p in procs)
    assert "--headless" in worker and "--headless" not in lead
    rendezvous = f"{lead[lead.index('--master-addr') + 1]}:{lead[lead.index('--master-port') + 1]}"
    assert worker[worker.index("--node-rank") + 1] == "1" and lead[lead.index("--node-rank") + 1] == "0"
    assert f"{worker[worker.index('--master-addr') + 1]}:{worker[worker.index('--master-port') + 1]}" == rendezvous
    ranks = {**_ranks(out / "cell=tp8" / "engine.log"), **_ranks(out / "cell=tp8" / "engine.engine-rank1.log")}
    assert {r: me["rendezvous"] for r, me in ranks.items()} == {0: rendezvous, 1: rendezvous}
    assert {r: me["cuda_visible_devices"] for r, me in ranks.items()} == {0: "0,1,2,3", 1: "0,1,2,3"}
    assert "rank 1 joined from" in (out / "cell=tp8" / "engine.log").read_text()

    # the client ran on the launching host, its round trip to the engine recorded with each load
    run_meta = pq.read_table(next((out / "cell=tp8").glob("load=*/run.parquet"))).to_pylist()[0]
    client = json.loads(run_meta["extra_json"])["engine_info"]["client"]
    assert client["where"] == "launching-host" and client["samples"] == 5 and client["round_trip_ms"]["min"] > 0
    assert client["on_engine_node"] is True  # honest here: the test's "nodes" are this machine
    assert client["excluded_nodes"] == []  # --client-shares-node
    # each node's clock against the launching host's: here the same clock, so the offset is
    # within its bound (half the best round trip through the srun step)
    for node in infos["tp8"]["placement"]["nodes"]:
        clock = node["clock"]
        assert clock["samples"] == 16 and 0 < clock["bound_ns"] < 1_000_000_000, clock
        assert abs(clock["offset_ns"]) <= clock["bound_ns"] + 1, clock  # +1: the midpoint is floored
    # the job ids are in the cell folders, released; the user's sbatch option was passed through
    record = json.loads((out / "cell=tp8" / "slurm_job.json").read_text())
    assert record["released"] and "--partition=gpu" in record["sbatch"] and "--nodes=2" in record["sbatch"]
    _nothing_left(cluster, list(infos.values()))


def _up(log: Path) -> bool:
    return log.exists() and "bench sim: rank {" in log.read_text()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_killed_bench_leaves_no_job_and_resume_finishes(cluster: Cluster, tmp_path: Path, sig: int) -> None:
    """bench killed (SIGKILL: no handler runs) or stopped (SIGTERM, Ctrl-C's SIGINT) while its
    two-node cell runs: the job does not outlive it (the watcher beside the job, or bench's own
    teardown), and ``--resume`` measures the cell again, leaving nothing behind."""
    out = tmp_path / "killed"
    proc = subprocess.Popen(_sweep(out, "--tp", "8"), env=cluster.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_until(lambda: _up(out / "cell=tp8" / "engine.engine-rank1.log") and _up(out / "cell=tp8" / "engine.log"),
                   60, "the two-node engine up")  # fmt: skip
        job = json.loads((out / "cell=tp8" / "slurm_job.json").read_text())["job_id"]
        assert job in cluster.jobs()
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    wait_until(lambda: job not in cluster.jobs(), 15, f"job {job} cancelled once bench was gone")
    run = subprocess.run(bench_argv("sweep", "--resume", "--out", str(out), "--no-progress"), env=cluster.env,
                         capture_output=True, text=True, timeout=240)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:] + cluster.log_tail()
    cells = _cells(out)
    assert cells["tp8"]["status"] == "complete"
    assert all(p["ok"] == p["requests"] == 8 for p in _points(out, "tp8"))
    _nothing_left(cluster, [json.loads(cells["tp8"]["engine_info"])])


def test_resume_cancels_a_job_left_running(cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose bench and watcher both vanished (the launching host went down) is cancelled
    by the next ``--resume`` from the id recorded in its cell folder."""
    from bench_llm.bench.sweep.cluster import ClusterLauncher
    from bench_llm.launch.placement import ClusterSpec
    from bench_llm.launch.slurm import JOB_RECORD, submit

    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    cell = tmp_path / "sweep" / "cell=tp8"
    job = submit(["sbatch", "--parsable", "--nodes=2", "--time=2", "--output=/dev/null", "--wrap=exec sleep infinity"],
                 cell / JOB_RECORD, ClusterSpec())  # fmt: skip
    wait_until(lambda: job in cluster.jobs(), 10, "the job queued")
    assert ClusterLauncher(ClusterSpec(gpus_per_node=4)).recover(tmp_path / "sweep") == [job]
    assert job not in cluster.jobs()
    assert json.loads((cell / JOB_RECORD).read_text())["released"] is True
    assert ClusterLauncher(ClusterSpec(gpus_per_node=4)).recover(tmp_path / "sweep") == []  # once only


def test_an_engine_that_fails_to_start_fails_its_cell_and_releases_the_job(cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "bad"
    run = subprocess.run(_sweep(out, "--tp", "8", "--engine-arg=--no-such-flag"), env=cluster.env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    cell = _cells(out)["tp8"]
    assert cell["status"] == "failed" and "no-such-flag" in (cell["log_tail"] or ""), cell
    assert json.loads((out / "cell=tp8" / "slurm_job.json").read_text())["released"] is True
    assert run.returncode != 0
    wait_until(lambda: not cluster.jobs(), 15, "the failed cell's job gone")


def test_by_default_no_engine_goes_on_the_launching_hosts_nodes(cluster: Cluster, tmp_path: Path) -> None:
    """Without --client-shares-node, the nodes on the launching host (where the load generator
    runs) are excluded from every job: here that is every node, so Slurm refuses each cell's
    job before anything starts, and the reason says why."""
    out = tmp_path / "excluded"
    argv = [a for a in _sweep(out, "--tp", "2,4") if a != "--client-shares-node"]
    run = subprocess.run(argv, env=cluster.env, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "nodes n1, n2 excluded: the load generator runs on their host" in run.stderr, run.stderr[-2000:]
    assert cluster.jobs() == []


def test_request_spans_from_a_two_node_instance_with_its_nodes_clocks(cluster: Cluster, tmp_path: Path) -> None:
    """--otlp-receiver on Slurm: the receiver listens on this host's address toward the nodes,
    the two-node instance's rank 0 exports a span per request to it, and the run records each
    node's clock offset against this host's with its bound (the spans' times are on rank 0's
    node clock)."""
    out = tmp_path / "spans"
    run = subprocess.run(_sweep(out, "--tp", "8", "--otlp-receiver"), env=cluster.env, capture_output=True,
                         text=True, timeout=240)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:] + cluster.log_tail()
    (load,) = (out / "cell=tp8").glob("load=*")
    spans = pq.read_table(load / "server_spans.parquet").to_pylist()
    assert len(spans) == 8 and all(s["span_request_id"] for s in spans), spans[:2]
    info = json.loads(pq.read_table(load / "run.parquet").to_pylist()[0]["extra_json"])["engine_info"]
    lead = info["processes"][0]["node"]
    (clock,) = [n["clock"] for n in info["placement"]["nodes"] if n["name"] == lead]
    assert clock["samples"] == 16 and abs(clock["offset_ns"]) <= clock["bound_ns"] + 1
    _nothing_left(cluster, [info])


def test_otlp_receiver_refusals_on_a_cluster(tmp_path: Path) -> None:
    from bench_llm.bench.sweep.cluster import otlp_refusal
    from bench_llm.launch.placement import ClusterSpec

    assert otlp_refusal(ClusterSpec(), 1) is None and otlp_refusal(ClusterSpec(), None) is None
    assert "--jobs 1 only" in str(otlp_refusal(ClusterSpec(), 2))
    assert "not on Kubernetes" in str(otlp_refusal(ClusterSpec(manager="kubernetes"), 1))


@pytest.fixture(scope="module")
def netns_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    made, why = start_cluster(tmp_path_factory.mktemp("slurm-netns"), netns=True)
    if made is None:
        pytest.skip(why)
    try:
        yield made
    finally:
        made.stop()


def test_nodes_in_their_own_network_namespaces(netns_cluster: Cluster, tmp_path: Path) -> None:
    """Each slurmd in its own network namespace, at its own address on a bridge: the instance
    across both nodes meets at rank 0's node address, the client reaches rank 0 there from this
    host's namespace, and nothing is left listening at either address afterwards."""
    cluster = netns_cluster
    out = tmp_path / "netns"
    run = subprocess.run(_sweep(out, "--tp", "8"), env=cluster.env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:] + cluster.log_tail()
    cell = _cells(out)["tp8"]
    assert cell["status"] == "complete"
    assert all(p["ok"] == p["requests"] == 8 for p in _points(out, "tp8"))
    info = json.loads(cell["engine_info"])
    addresses = {n["name"]: n["address"] for n in info["placement"]["nodes"]}
    assert sorted(addresses.values()) == sorted(cluster.addresses) and len(set(addresses.values())) == 2
    lead, worker = info["processes"]
    rank0 = addresses[lead["node"]]
    for p in (lead, worker):
        assert p["engine_argv"][p["engine_argv"].index("--master-addr") + 1] == rank0
    assert info["client"]["engine_url"].startswith(f"http://{rank0}:")  # reached across the bridge
    ranks = {**_ranks(out / "cell=tp8" / "engine.log"), **_ranks(out / "cell=tp8" / "engine.engine-rank1.log")}
    assert {r: me["rendezvous"].split(":")[0] for r, me in ranks.items()} == {0: rank0, 1: rank0}
    assert "rank 1 joined from" in (out / "cell=tp8" / "engine.log").read_text()
    wait_until(lambda: not cluster.jobs(), 15, f"Slurm jobs gone ({cluster.jobs()})")
    ports = _ports(info)
    wait_until(lambda: not [(a, p) for a in addresses.values() for p in ports if _listening(p, a)], 15,
               "nothing listening at the nodes' addresses")  # fmt: skip
