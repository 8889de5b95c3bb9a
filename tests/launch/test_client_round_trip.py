"""The one client round-trip probe (``launch.launcher.client_round_trip``) that both the Slurm
launcher and the Kubernetes load Job record in ``engine_info.client``."""

from __future__ import annotations

import http.server
import socket
from collections.abc import Iterator

import pytest

from bench_llm.launch import launcher, slurm
from bench_llm.launch.launcher import ClientRoundTrip, client_round_trip
from bench_llm.launch.process import free_port
from tests.conftest import http_server


class _Health(http.server.BaseHTTPRequestHandler):
    paths: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).paths.append(self.path)
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def engine() -> Iterator[str]:
    _Health.paths = []
    with http_server(_Health) as url:
        yield url


def test_probes_the_profiles_health_route_and_records_where_it_ran(engine: str) -> None:
    me = socket.gethostname()
    probe = client_round_trip(engine, "sim", "launching-host", engine_hosts=["other-node", f"{me}.cluster.local"],
                              samples=4)  # fmt: skip
    assert _Health.paths == ["/health"] * 4
    assert len(probe.times_ms) == 4 and all(t > 0 for t in probe.times_ms)
    rec = probe.as_json()
    assert rec["where"] == "launching-host" and rec["host"] == me and rec["engine_url"] == engine
    assert rec["on_engine_node"] is True  # short host names compared
    assert "node" not in rec  # not known on Slurm: left out, not a made-up value
    assert rec["samples"] == 4
    assert rec["round_trip_ms"]["min"] <= rec["round_trip_ms"]["median"] <= rec["round_trip_ms"]["max"]


def test_a_pod_says_its_node_and_not_whether_it_shares_one(engine: str) -> None:
    rec = client_round_trip(engine, "vllm", "kubernetes-job", node="cpu-7", samples=2).as_json()
    assert rec["where"] == "kubernetes-job" and rec["node"] == "cpu-7" and rec["samples"] == 2
    assert "on_engine_node" not in rec


def test_an_engine_that_never_answers_counts_no_samples() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    probe = client_round_trip(url, "sim", "launching-host", engine_hosts=["elsewhere"], samples=3)
    assert probe.times_ms == () and probe.on_engine_node is False
    assert probe.as_json()["round_trip_ms"] is None and probe.as_json()["samples"] == 0


def test_the_summary_of_known_times() -> None:
    rec = ClientRoundTrip("launching-host", "h", "http://e", (3.0, 1.0, 2.0)).as_json()
    assert rec["round_trip_ms"] == {"min": 1.0, "median": 2.0, "max": 3.0}


def test_slurm_and_the_load_job_share_the_one_probe() -> None:
    from bench_llm.bench.sweep import cluster_job

    assert slurm.client_round_trip is launcher.client_round_trip
    assert not hasattr(cluster_job, "client_round_trip")  # no copy of its own
