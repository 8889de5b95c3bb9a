"""Each adapter against the simulated engine's matching flavour, launched through the launcher."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow.compute as pc
import pytest

from bench_llm.adapters.base import get_adapter
from bench_llm.bench.execute import RunConfig, execute_run
from bench_llm.core.eventloop import run_async
from bench_llm.launch.launcher import EngineHandle, LaunchSpec, launch
from bench_llm.loadgen.recorder import SOURCE_CUMULATIVE, SOURCE_FINAL_SPREAD, SOURCE_PROTOCOL
from bench_llm.results.reader import read_requests, read_run_meta, read_server_metrics
from bench_llm.workloads.synthetic import SyntheticWorkload

CASES = {
    # adapter: (sim flavour, api, expected token source, a common metric the flavour must map)
    "vllm": ("vllm", "completions", SOURCE_CUMULATIVE, "ttft_seconds"),
    "vllm-chat": ("vllm", "chat", SOURCE_CUMULATIVE, "ttft_seconds"),
    "sglang": ("sglang", "completions", SOURCE_CUMULATIVE, "ttft_seconds"),
    "sglang-openai": ("sglang", "chat", SOURCE_CUMULATIVE, "waiting"),
    "tgi": ("tgi", "completions", SOURCE_PROTOCOL, "queue_seconds"),
    "generic": ("vllm", "completions", SOURCE_FINAL_SPREAD, "running"),
}


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, EngineHandle]]:
    handles: dict[str, EngineHandle] = {}
    try:
        for flavor in ("vllm", "sglang", "tgi"):
            log = tmp_path_factory.mktemp(f"sim-{flavor}") / "engine.log"
            handles[flavor] = launch(LaunchSpec("sim", "llama-3.1-8b", flavor=flavor, ready_timeout_s=60), log)
        yield handles
    finally:
        for h in handles.values():
            h.stop()


@pytest.mark.parametrize("name", sorted(CASES))
def test_adapter_against_sim_flavour(name: str, engines: dict[str, EngineHandle], tmp_path: Path) -> None:
    flavor, api, source, common = CASES[name]
    engine = engines[flavor]
    adapter = get_adapter(name.removesuffix("-chat"), model="llama-3.1-8b", api=api)
    schedule = SyntheticWorkload(requests=10, input_tokens=64, output_tokens=12, concurrency=3, seed=2).schedule()
    cfg = RunConfig(out=tmp_path / "run", url=engine.url, engine=f"sim-{flavor}", model="llama-3.1-8b",
                    schedule=schedule, scrape_interval_s=0.2, engine_info=engine.describe())  # fmt: skip
    result = run_async(lambda: execute_run(cfg, adapter, install_signals=False))
    rows = read_requests(result.run_dir).to_pylist()
    assert len(rows) == 10
    for r in rows:
        assert r["ok"], (name, r["error_type"], r["error_message"])
        assert r["token_source"] == source
        assert r["output_tokens"] == sum(r["chunk_tokens"]) > 0
        if r["completion_tokens"] is not None:
            assert r["output_tokens"] == r["completion_tokens"]
        assert r["first_token_ns"] is not None and r["first_token_ns"] >= r["send_ns"]
    if name != "tgi":  # TGI cannot force the output length; the others honour it exactly
        assert all(r["output_tokens"] == 12 for r in rows)
    meta = read_run_meta(result.run_dir)
    adapter_json = json.loads(meta["adapter_json"]) if isinstance(meta["adapter_json"], str) else meta["adapter_json"]
    if name == "tgi":
        assert adapter_json["forces_output_length"] is False
    table = read_server_metrics(result.run_dir)
    assert table is not None and common in set(pc.unique(table["common"]).to_pylist())


FLAVOUR_ADAPTER = {"vllm": "vllm", "sglang": "sglang", "tgi": "tgi"}


@pytest.mark.parametrize("flavor", sorted(FLAVOUR_ADAPTER))
@pytest.mark.parametrize(
    "faults, expect",
    [
        ("split_utf8=1,multi_token=1,slow_start=1s", "ok"),
        ("no_done=1", {"vllm": "no_done", "sglang": "no_done", "tgi": "truncated"}),
        ("malformed=1", "malformed_chunk"),
    ],
)
def test_stream_faults_per_flavour(flavor: str, faults: str, expect: object, tmp_path: Path) -> None:
    """Edge cases on the wire, per flavour: split UTF-8 and multi-token events still count
    exactly; a missing end marker / final event and invalid JSON fail the request, never the run.
    ``slow_start`` makes /health answer 503 first: the launcher must keep waiting."""
    spec = LaunchSpec("sim", "llama-3.1-8b", flavor=flavor, extra_args=("--faults", faults, "--seed", "3"),
                      ready_timeout_s=60)  # fmt: skip
    with launch(spec, tmp_path / "engine.log") as engine:
        adapter = get_adapter(FLAVOUR_ADAPTER[flavor], model="llama-3.1-8b")
        schedule = SyntheticWorkload(requests=4, input_tokens=32, output_tokens=10, concurrency=2, seed=4).schedule()
        cfg = RunConfig(out=tmp_path / "run", url=engine.url, engine=f"sim-{flavor}", model="llama-3.1-8b",
                        schedule=schedule, scrape_interval_s=None)  # fmt: skip
        result = run_async(lambda: execute_run(cfg, adapter, install_signals=False))
    rows = read_requests(result.run_dir).to_pylist()
    assert len(rows) == 4
    if expect == "ok":
        for r in rows:
            assert r["ok"], (r["error_type"], r["error_message"])
            assert r["output_tokens"] == sum(r["chunk_tokens"])
            if r["completion_tokens"] is not None:
                assert r["output_tokens"] == r["completion_tokens"]
    else:
        want = expect[flavor] if isinstance(expect, dict) else expect
        assert [r["error_type"] for r in rows] == [want] * 4
