"""``bench sweep --otlp-receiver`` (issue 23): one receiver for the sweep, each launched cell's
engine exporting its request spans to it, each load's run folder keeping its own and its TTFT
split; the engines' launch plans with span export (dry: argv only); the join per engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from bench_llm.analysis.ttft_split import (
    SOURCE_REQUEST,
    SOURCE_SPANS,
    request_parts,
    split_summary,
)
from tests.conftest import REPO


def test_a_live_sim_sweep_keeps_each_loads_spans_and_splits_ttft(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    p = subprocess.run(
        [sys.executable, "-m", "bench_llm.bench", "sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--tp", "1,2",
         "--rate", "20", "--requests", "10", "--warmup", "2", "--input-tokens", "512", "--output-tokens", "4",
         "--clock", "auto", "--otlp-receiver", "--no-progress", "--out", str(out)],
        check=False, capture_output=True, text=True, timeout=240, cwd=REPO,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    assert "OTLP receiver at http://127.0.0.1:" in p.stderr
    loads = sorted(out.glob("cell=*/load=*"))
    assert len(loads) == 2 and all((d / "server_spans.parquet").exists() for d in loads)
    for d in loads:
        split = split_summary(d)
        assert split is not None and split["source"] == SOURCE_SPANS and split["requests"] == 10
        assert split["max_sum_error_ms"] < 1.0  # the parts sum to the client's TTFT
        assert split["parts_ms"]["prefill"]["mean"] > 0 and "transit" in split["parts_ms"]
    from bench_llm.bench.sweep.store import read_cells
    from bench_llm.results.reader import read_run_meta

    # each cell's engine was told the sweep's one endpoint
    argvs = [json.loads(c["engine_argv"]) for c in read_cells(out)]
    endpoints = {a[a.index("--otlp-traces-endpoint") + 1] for a in argvs}
    assert len(argvs) == 2 and len(endpoints) == 1
    notes = read_run_meta(loads[0])["notes_json"]
    otlp = (json.loads(notes) if isinstance(notes, str) else notes)["otlp"]
    assert otlp["request_spans"] >= 10 and not otlp["errors"] and otlp["endpoint"] in endpoints
    # the summary and the report show the split per cell
    assert "TTFT split per cell" in p.stdout
    assert "tp1 at rate-20: mean TTFT" in p.stdout and "tp2 at rate-20" in p.stdout
    from bench_llm.analysis.report import _sweep_split_section
    from bench_llm.analysis.ttft_split import sweep_splits

    assert [r["cell_id"] for r in sweep_splits(out)] == ["tp1", "tp2"]
    sec = _sweep_split_section(out)
    assert sec is not None and sec.html.count("<tr>") == 3 and "ttft-split-cells" in sec.html
    assert _sweep_split_section(tmp_path) is None  # no spans: no section


def test_a_virtual_time_sweep_refuses_the_receiver(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "bench_llm.bench", "sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--tp", "1",
         "--rate", "3", "--requests", "10", "--otlp-receiver", "--out", str(tmp_path / "s")],
        check=False, capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert p.returncode == 2 and "virtual time has no engine to send spans" in p.stderr


@pytest.mark.parametrize("engine,args,env", [
    ("sglang", ["--enable-trace", "--otlp-traces-endpoint", "E"], {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}),
    ("tgi", ["--otlp-endpoint", "E", "--otlp-service-name", "bench-tgi"], {}),
    ("vllm", ["--otlp-traces-endpoint", "E"], {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}),
    ("sim", ["--otlp-traces-endpoint", "E"], {}),
])  # fmt: skip
def test_each_engines_launch_plan_points_it_at_the_receiver(engine: str, args: list[str], env: dict[str, str]) -> None:
    from bench_llm.bench.launch_engine import otlp_launch
    from bench_llm.launch.config import Disagg, ParallelConfig
    from bench_llm.launch.launcher import LaunchSpec, plan_launch

    extra, extra_env = otlp_launch(engine, "E")
    parallel = ParallelConfig(disagg=Disagg(1, 1)) if engine == "sglang" else ParallelConfig()
    procs = plan_launch(LaunchSpec(engine, "m", parallel, extra_args=extra, env=extra_env, engine_version="3.3.6"),
                        base_env={})  # fmt: skip
    engines = [p for p in procs if p.role != "router"]
    assert engines and all(p.argv[-len(args):] == tuple(args) for p in engines)
    assert all(dict(p.env).items() >= env.items() for p in engines)


def _client(ids: list[str | None], timing: list[str | None]) -> pa.Table:
    n = len(ids)
    return pa.table({"phase": ["measure"] * n, "ok": [True] * n, "send_ns": [0] * n,
                     "first_token_ns": [40_000_000] * n, "server_request_id": ids, "server_timing_json": timing})  # fmt: skip


def test_sglang_root_spans_join_by_rid_but_time_nothing_so_its_response_timings_split() -> None:
    """SGLang's request root span (``Req <rid[:8]>``, attribute ``rid``) joins by the id the
    client reads from ``meta_info.id``, but carries no timing: the split comes from the response's
    ``meta_info`` timings. A TGI ``generate_stream`` span names no request: it is not kept."""
    from bench_llm.loadgen.otlp import OtlpReceiver
    from bench_llm.sim.otlp import SimSpan, encode_export

    rid = "9f2c4e1a7b3d4c5e"
    spans = [SimSpan(f"Req {rid[:8]}", 1, 2, (("rid", rid),)),
             SimSpan("generate_stream", 1, 2, (("queue_time", "1.2ms"), ("inference_time", "30ms")))]  # fmt: skip
    rec = OtlpReceiver()
    from bench_llm.loadgen.otlp import decode_traces

    rec.add(decode_traces(encode_export(spans, "sglang")))
    table = rec.table()
    rec.stop()
    assert table.column("span_request_id").to_pylist() == [rid]  # TGI's span: no id, not kept
    timing = '{"queue_time": 0.005, "prefill_launch_delay": 0.0, "prefill_launch_latency": 0.020}'
    parts = request_parts(_client([rid], [timing]), table)
    assert list(parts["source"]) == ["response"] and parts["queue_ms"].iloc[0] == pytest.approx(5.0)
    assert parts["other_ms"].iloc[0] == pytest.approx(15.0)
    assert SOURCE_REQUEST.startswith("per request")


def test_bench_run_points_the_embedded_engine_at_its_receiver(tmp_path: Path) -> None:
    out = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-m", "bench_llm.bench", "run", "--requests", "12", "--concurrency", "3", "--output-tokens", "4",
         "--otlp-receiver", "--no-progress", "--out", str(out)],
        check=False, capture_output=True, text=True, timeout=180, cwd=REPO,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "the simulated engine exports its request spans to it" in p.stderr
    split = split_summary(out)
    assert split is not None and split["source"] == SOURCE_SPANS and split["requests"] == 12
    assert split["max_sum_error_ms"] < 1.0
