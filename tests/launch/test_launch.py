"""Launchers: refused axes, argv per engine, readiness, start-up death, group teardown."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from bench_llm.launch.config import Disagg, ParallelConfig
from bench_llm.launch.engines import TGI_ADMISSION_LIMIT
from bench_llm.launch.launcher import EngineStartError, LaunchSpec, UnsupportedConfigError, launch, unsupported_axes
from bench_llm.launch.process import free_port
from bench_llm.launch.profiles import plan_engine
from tests.conftest import autogroup

REPO = Path(__file__).resolve().parents[2]
FIXED_SIM = (sys.executable, "-m", "bench_llm.bench", "sim", "serve", "--host", "127.0.0.1", "--port", "{port}")


def _sim_has(flag: str) -> bool:
    out = subprocess.run(
        [sys.executable, "-m", "bench_llm.bench", "sim", "serve", "--help"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    return flag in out.stdout


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _wait_dead(pid: int, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(entry))
    return out


# -- refused axes ---------------------------------------------------------------------------


def test_sim_accepts_every_axis() -> None:
    assert unsupported_axes("sim", ParallelConfig(tp=4, pp=2, dp=2, ep=16, dcp=2, pcp=2, disagg=Disagg(1, 1))) == []


def test_tgi_refuses_everything_but_tp() -> None:
    assert unsupported_axes("tgi", ParallelConfig(tp=4)) == []
    reasons = unsupported_axes("tgi", ParallelConfig(tp=2, pp=2, dp=2, disagg=Disagg(1, 1)))
    assert len(reasons) == 3
    assert any("pipeline" in r for r in reasons) and any("disaggregation" in r for r in reasons)


def test_vllm_ep_width_and_disagg() -> None:
    assert unsupported_axes("vllm", ParallelConfig(tp=2, dp=2, ep=4)) == []
    assert unsupported_axes("vllm", ParallelConfig(tp=2, dp=2, ep=2))
    assert unsupported_axes("vllm", ParallelConfig(tp=2, dcp=2, pcp=2)) == []
    # vLLM P/D now launches (prefill and decode instances behind bench's proxy: tests/launch/test_vllm_pd.py)
    assert unsupported_axes("vllm", ParallelConfig(disagg=Disagg(1, 1))) == []


def test_sglang_refuses_prefill_context_parallel_and_dcp_before_0_5_21() -> None:
    assert unsupported_axes("sglang", ParallelConfig(tp=4, pp=2, dp=2, ep=4, disagg=Disagg(1, 1))) == []
    # dcp (--dcp-size) from 0.5.21: refused for an older release, planned for a newer or unknown one
    assert len(unsupported_axes("sglang", ParallelConfig(tp=2, dcp=2, pcp=2), "0.5.8")) == 2
    assert len(unsupported_axes("sglang", ParallelConfig(tp=2, dcp=2, pcp=2), "0.5.23")) == 1
    assert len(unsupported_axes("sglang", ParallelConfig(tp=2, dcp=2, pcp=2))) == 1


def test_unknown_engine() -> None:
    assert unsupported_axes("nope", ParallelConfig()) != []


def test_launch_refuses_before_starting(tmp_path: Path) -> None:
    spec = LaunchSpec("tgi", "m", ParallelConfig(pp=2))
    with pytest.raises(UnsupportedConfigError, match="pipeline"):
        launch(spec, tmp_path / "engine.log")
    with pytest.raises(UnsupportedConfigError, match="needs 8 GPUs, only 4"):
        launch(LaunchSpec("vllm", "m", ParallelConfig(tp=8), gpus_available=4), tmp_path / "engine.log")
    assert not (tmp_path / "engine.log").exists()


# -- argv -----------------------------------------------------------------------------------


def test_sim_argv_is_the_agreed_one() -> None:
    spec = LaunchSpec("sim", "llama-3.1-70b", ParallelConfig(tp=4, dp=2, disagg=Disagg(1, 2)), gpu="h200",
                      extra_args=("--seed", "3"), flavor="sglang")  # fmt: skip
    (plan,) = plan_engine(spec, 4321, free_port).processes
    assert plan.argv == [
        sys.executable, "-P", "-m", "bench_llm.bench", "sim", "serve", "--host", "127.0.0.1", "--port", "4321",
        "--timing", "model", "--flavor", "sglang", "--model-preset", "llama-3.1-70b", "--gpu", "h200",
        "--tp", "4", "--pp", "1", "--dp", "2", "--ep", "1", "--dcp", "1", "--pcp", "1",
        "--disagg", "1:2", "--seed", "3",
    ]  # fmt: skip


def test_vllm_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_VLLM_PYTHON", "/opt/vllm/bin/python")
    spec = LaunchSpec("vllm", "/models/tiny", ParallelConfig(tp=2, pp=2, dp=2, ep=4, dcp=2, extra_args=("--enforce-eager",)))
    (plan,) = plan_engine(spec, 9000, free_port).processes
    a = plan.argv
    assert a[:4] == ["/opt/vllm/bin/python", str(REPO / "launch/vllm_entry.py"), "serve", "/models/tiny"]
    for flag, value in (("--tensor-parallel-size", "2"), ("--pipeline-parallel-size", "2"),
                        ("--data-parallel-size", "2"), ("--decode-context-parallel-size", "2"), ("--port", "9000")):  # fmt: skip
        assert a[a.index(flag) + 1] == value
    assert "--enable-expert-parallel" in a and a[-1] == "--enforce-eager"
    assert plan.gpus == 8 and plan.extra_ready_paths == ("/v1/models",)


def test_sglang_disagg_has_router_and_disjoint_gpus(tmp_path: Path) -> None:
    from bench_llm.launch.launcher import _assign_devices

    spec = LaunchSpec("sglang", "m", ParallelConfig(tp=2, disagg=Disagg(1, 2)))
    layout = plan_engine(spec, 30000, free_port)
    roles = [p.role for p in layout.processes]
    assert roles == ["prefill", "decode", "decode", "router"]
    assert layout.processes[layout.front_index].port == 30000
    assert all("--enable-metrics" in p.argv for p in layout.processes[:3])
    devices = _assign_devices(layout.processes, {})
    assert devices == ["0,1", "2,3", "4,5", None]
    devices = _assign_devices(layout.processes, {"CUDA_VISIBLE_DEVICES": "7,6,5,4,3,2"})
    assert devices == ["7,6", "5,4", "3,2", None]
    with pytest.raises(UnsupportedConfigError):
        _assign_devices(layout.processes, {"CUDA_VISIBLE_DEVICES": "0,1"})


def test_sglang_router_policy_goes_to_the_router_of_a_disaggregated_cell_only() -> None:
    # sglang_router.launch_router's --policy (random|round_robin|cache_aware|power_of_two)
    args = ("--policy=cache_aware", "--decode-policy", "round_robin", "--max-running-requests=8")
    spec = LaunchSpec("sglang", "m", ParallelConfig(disagg=Disagg(1, 1), extra_args=args))
    prefill, decode, router = plan_engine(spec, 30000, free_port).processes
    assert router.argv[-3:] == ["--policy=cache_aware", "--decode-policy", "round_robin"]
    for instance in (prefill, decode):
        assert "--max-running-requests=8" in instance.argv
        assert not any("policy" in a or a == "round_robin" for a in instance.argv)
    assert unsupported_axes("sglang", ParallelConfig(disagg=Disagg(1, 1), extra_args=args)) == []
    (reason,) = unsupported_axes("sglang", ParallelConfig(extra_args=("--policy=cache_aware",)))
    assert "--policy" in reason and "disagg=P:D" in reason and "dp>1" in reason
    (reason,) = unsupported_axes("vllm", ParallelConfig(extra_args=("--policy=cache_aware",)))
    assert reason == "vLLM has no router policy (DP or P/D) flag (--policy)"


def test_sglang_dp_with_a_router_policy_runs_replicas_behind_the_router() -> None:
    from bench_llm.launch.launcher import _assign_devices

    spec = LaunchSpec("sglang", "m", ParallelConfig(tp=2, dp=2, extra_args=("--policy=cache_aware",)))
    assert unsupported_axes("sglang", spec.parallel) == []
    layout = plan_engine(spec, 30000, free_port)
    *replicas, router = layout.processes
    assert [p.role for p in replicas] == ["replica", "replica"] and layout.front_index == 2
    assert all("--dp-size" not in p.argv and p.argv[p.argv.index("--tp-size") + 1] == "2" for p in replicas)
    urls = router.argv[router.argv.index("--worker-urls") + 1 : router.argv.index("--host")]
    assert urls == [f"http://127.0.0.1:{p.port}" for p in replicas]
    assert router.argv[-1] == "--policy=cache_aware" and router.port == 30000
    assert _assign_devices(layout.processes, {}) == ["0,1", "2,3", None]
    # without a router flag, DP stays inside one server (its own --load-balance-method)
    (plain,) = plan_engine(LaunchSpec("sglang", "m", ParallelConfig(tp=2, dp=2)), 30000, free_port).processes
    assert plain.argv[plain.argv.index("--dp-size") + 1] == "2"


def test_tgi_argv_and_output_length_not_forced() -> None:
    spec = LaunchSpec("tgi", "org/model", ParallelConfig(tp=2), engine_version="3.3.6")
    layout = plan_engine(spec, 3000, free_port)
    a = layout.processes[0].argv
    assert a[:3] == ["text-generation-launcher", "--model-id", "org/model"]
    assert a[a.index("--num-shard") + 1] == "2" and "--prometheus-port" in a
    assert layout.forces_output_length is False


@pytest.mark.parametrize(("version", "port_flag"), [("3.2.3", False), ("3.3.0", True), ("v3.3.7", True), ("3.3", True), ("3.3.0-dev0", True), (None, False)])
def test_tgi_prometheus_port_only_from_3_3(version: str | None, port_flag: bool) -> None:
    # --prometheus-port is in launcher/src/main.rs from v3.3.0; older launchers refuse the flag.
    # With no version given and no launcher to ask, the flag is left out (safe on every 3.x).
    spec = LaunchSpec("tgi", "m", engine_version=version)
    argv = plan_engine(spec, 3000, free_port).processes[0].argv
    assert ("--prometheus-port" in argv) is port_flag


def test_tgi_version_is_asked_of_the_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "text-generation-launcher"
    fake.write_text("#!/bin/sh\necho 'text-generation-launcher 3.2.1'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("BENCH_TGI_LAUNCHER", str(fake))
    layout = plan_engine(LaunchSpec("tgi", "m"), 3000, free_port)
    assert "--prometheus-port" not in layout.processes[0].argv and layout.declared_version == "3.2.1"


def test_tgi_admission_limit_is_raised_unless_the_user_sets_it() -> None:
    # TGI's default --max-concurrent-requests is 128: request 129 is rejected at admission
    argv = plan_engine(LaunchSpec("tgi", "m"), 3000, free_port).processes[0].argv
    assert argv[argv.index("--max-concurrent-requests") + 1] == str(TGI_ADMISSION_LIMIT)
    own = plan_engine(LaunchSpec("tgi", "m", extra_args=("--max-concurrent-requests", "64")), 3000, free_port)
    assert own.processes[0].argv.count("--max-concurrent-requests") == 1
    sim = plan_engine(LaunchSpec("sim", "llama-3.1-8b", flavor="tgi"), 3000, free_port).processes[0].argv
    assert sim[sim.index("--max-concurrent-requests") + 1] == str(TGI_ADMISSION_LIMIT)


def test_sglang_version_is_read_from_server_info_first() -> None:
    layout = plan_engine(LaunchSpec("sglang", "m"), 30000, free_port)
    assert layout.version_paths[0] == ("/server_info", "version")  # /get_server_info: deprecated alias


def test_argv_is_never_a_shell_string() -> None:
    spec = LaunchSpec("vllm", "m; rm -rf /", ParallelConfig(), extra_args=("$(whoami)",), container_template=("docker", "run", "img", "{argv}"))
    (plan,) = plan_engine(spec, 1, free_port).processes
    assert "m; rm -rf /" in plan.argv and "$(whoami)" in plan.argv


# -- lifecycle (the fixed-timing simulated engine through a command template) ---------------


def test_launch_ready_and_teardown(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    spec = LaunchSpec("sim", "llama-3.1-8b", container_template=FIXED_SIM, ready_timeout_s=60)
    with launch(spec, log) as handle:
        assert handle.version and handle.version.startswith("bench-sim")
        assert handle.argv[:3] == [sys.executable, "-m", "bench_llm.bench"]
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(handle.url + "/health", timeout=5) as resp:
            assert resp.status == 200
        pids = handle.pids
        assert pids and all(_alive(p) for p in pids)
    assert all(_wait_dead(p) for p in pids)
    assert log.exists()


def test_startup_death_reports_log_tail(tmp_path: Path) -> None:
    template = (sys.executable, "-c", "import sys; print('out of memory: weights need 140 GB'); sys.exit(3)")
    spec = LaunchSpec("sim", "llama-3.1-70b", container_template=template, ready_timeout_s=30)
    with pytest.raises(EngineStartError, match="(?s)code 3.*out of memory: weights need 140 GB"):
        launch(spec, tmp_path / "engine.log")


def test_ready_timeout(tmp_path: Path) -> None:
    template = (sys.executable, "-c", "import time; print('loading...', flush=True); time.sleep(60)")
    spec = LaunchSpec("sim", "m", container_template=template, ready_timeout_s=1.5)
    t = time.monotonic()
    with pytest.raises(EngineStartError, match=r"(?s)not ready after [0-9.]+ s.*loading"):
        launch(spec, tmp_path / "engine.log")
    assert time.monotonic() - t < 20


WORKER_SERVER = """
import http.server, signal, subprocess, sys
w = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"])
open(sys.argv[2], "w").write(str(w.pid))

class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
"""


def test_teardown_kills_the_whole_group(tmp_path: Path) -> None:
    """A worker that ignores SIGTERM must not survive teardown."""
    script = tmp_path / "server.py"
    script.write_text(WORKER_SERVER)
    pidfile = tmp_path / "worker.pid"
    spec = LaunchSpec("sim", "m", container_template=(sys.executable, str(script), "{port}", str(pidfile)), ready_timeout_s=30)
    handle = launch(spec, tmp_path / "engine.log")
    worker = int(pidfile.read_text())
    assert _alive(worker) and handle.alive()
    t = time.monotonic()
    handle.stop(grace_s=1.0)
    assert _wait_dead(worker, 10)
    assert time.monotonic() - t < 15




def test_engine_stays_in_bench_session_and_autogroup(tmp_path: Path) -> None:
    """Issue 16 item 1: an engine in a new session is a new scheduler autogroup, which took CPU
    from bench's own timing. Its own process group (for teardown) must stay in bench's session."""
    script = tmp_path / "server.py"
    script.write_text(WORKER_SERVER)
    pidfile = tmp_path / "worker.pid"
    spec = LaunchSpec("sim", "m", container_template=(sys.executable, str(script), "{port}", str(pidfile)), ready_timeout_s=30)
    with launch(spec, tmp_path / "engine.log") as handle:
        leader = handle.pids[0]
        worker = int(pidfile.read_text())
        for pid in (leader, worker):
            assert os.getsid(pid) == os.getsid(0)
            assert os.getpgid(pid) == leader != os.getpgid(0)  # group teardown still has its own group
            assert autogroup(pid) == autogroup("self")


# -- killing bench mid-run ------------------------------------------------------------------


def test_killing_bench_leaves_no_engine_behind(tmp_path: Path) -> None:
    """SIGKILL bench while requests are in flight: the engine it started must go too."""
    argv = [sys.executable, "-m", "bench_llm.bench", "run", "--out", str(tmp_path / "run"), "--requests", "2000",
            "--concurrency", "4", "--output-tokens", "64", "--no-progress"]  # fmt: skip
    if _sim_has("--timing"):
        # real time (--clock auto): the modelled engine otherwise runs in virtual time, no process
        argv += ["--engine", "sim", "--launch", "--model", "llama-3.1-8b", "--clock", "auto"] if _run_has_launch() else []
    bench = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        engines: list[int] = []
        while time.monotonic() < deadline:
            engines = _children(bench.pid)
            if engines and list((tmp_path / "run").glob("requests/part-*.parquet")):
                break  # the engine is up and answers are being recorded
            time.sleep(0.2)
        assert engines, "bench never started its engine"
        assert list((tmp_path / "run").glob("requests/part-*.parquet")), "no request was recorded"
        bench.kill()
        bench.wait(10)
        for pid in engines:
            assert _wait_dead(pid, 20), f"engine process {pid} survived bench"
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait(10)


def _run_has_launch() -> bool:
    out = subprocess.run([sys.executable, "-m", "bench_llm.bench", "run", "--help"], capture_output=True, text=True, cwd=REPO, timeout=60)
    return "--launch" in out.stdout


# -- bench run --launch ---------------------------------------------------------------------


def test_parse_parallel() -> None:
    from bench_llm.bench.launch_engine import parse_parallel
    from bench_llm.core.errors import BenchError

    p = parse_parallel("tp=2, dp=2,disagg=1:1", ("--seed", "1"))
    assert (p.tp, p.dp, str(p.disagg), p.extra_args) == (2, 2, "1:1", ("--seed", "1"))
    assert parse_parallel("") == ParallelConfig()
    for bad in ("tp", "zz=1", "tp=x", "tp=0", "tp=2,dcp=3", "disagg=1"):
        with pytest.raises(BenchError):
            parse_parallel(bad)


def test_bench_run_launch_records_engine(tmp_path: Path) -> None:
    import json

    import pyarrow.parquet as pq

    if not (_sim_has("--timing") and _run_has_launch()):
        pytest.skip("this checkout's simulated engine has no --timing model yet")
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "bench_llm.bench", "run", "--engine", "sim", "--launch", "--model", "llama-3.1-8b",
            "--parallel", "tp=2", "--requests", "6", "--concurrency", "2", "--output-tokens", "8",
            "--scrape-interval", "0.2", "--clock", "auto", "--out", str(out), "--no-progress"]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    meta = pq.read_table(out / "run.parquet").to_pylist()[0]
    launch_info = json.loads(meta["config_json"])["engine_launch"]
    assert launch_info["version"].startswith("bench-sim") and launch_info["gpus"] == 2
    argv_rec = launch_info["argv"]
    assert argv_rec[argv_rec.index("--tp") + 1] == "2" and argv_rec[argv_rec.index("--timing") + 1] == "model"
    assert (out / "engine.log").exists() and list((out / "server_metrics").glob("part-*.parquet"))
    assert "TTFT cross-check" in proc.stdout


def test_bench_run_launch_refuses_unsupported_axes(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench_llm.bench", "run", "--engine", "tgi", "--launch", "--model", "m",
            "--parallel", "tp=2,pp=2", "--requests", "1", "--out", str(tmp_path / "r")]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "TGI has no pipeline parallelism" in proc.stderr and "Traceback" not in proc.stderr


def test_container_template_splices_args_and_port() -> None:
    from bench_llm.launch.launcher import _containerise

    argv = ["text-generation-launcher", "--model-id", "m", "--port", "3000"]
    tpl = ("docker", "run", "--rm", "-p", "{port}:{port}", "ghcr.io/huggingface/text-generation-inference:3", "{args}")
    assert _containerise(tpl, argv, 3000) == [
        "docker", "run", "--rm", "-p", "3000:3000", "ghcr.io/huggingface/text-generation-inference:3",
        "--model-id", "m", "--port", "3000",
    ]  # fmt: skip
    assert _containerise(("podman", "run", "img", "{argv}"), argv, 1)[3:] == argv
    assert _containerise(None, argv, 1) == argv
