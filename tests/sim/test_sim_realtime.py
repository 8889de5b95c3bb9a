"""The modelled engine in real time (a few end-to-end checks), the CLI and TOML overrides."""

from __future__ import annotations

import dataclasses
import statistics
import subprocess
from pathlib import Path

import pytest

from bench_llm.bench.commands.sim import build_config, command
from bench_llm.core.errors import BenchError
from bench_llm.sim.backend import Arrival, ModelBackend, simulate
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.server import ServerConfig
from tests.conftest import bench_argv
from tests.sim_helpers import run_against, spaced

SWEEP_ARGV = ["--host", "127.0.0.1", "--port", "0", "--timing", "model", "--flavor", "vllm", "--model-preset",
              "llama-3.1-70b", "--gpu", "h100", "--tp", "2", "--pp", "1", "--dp", "2", "--ep", "1", "--dcp", "1",
              "--pcp", "1"]


def parse(argv: list[str]) -> ServerConfig:
    ctx = command.commands["serve"].make_context("serve", list(argv))
    return build_config(ctx.params)


def test_sweep_launcher_argv_parses_to_the_model_engine() -> None:
    cfg = parse(SWEEP_ARGV + ["--disagg", "1:1", "--router", "least-queue", "--slowdown", "2", "--jitter", "0.05",
                              "--seed", "3", "--max-num-seqs", "64", "--max-num-batched-tokens", "4096",
                              "--no-enable-prefix-caching", "--profile", "legacy-2023", "--dtype", "fp8",
                              "--faults", "http500=0.1", "--emission-log", "/tmp/x.parquet"])
    mt = cfg.model_timing
    assert mt is not None and cfg.model == "llama-3.1-70b" and cfg.flavor == "vllm"
    assert (mt.tp, mt.dp, mt.disagg_prefill, mt.disagg_decode, mt.router) == (2, 2, 1, 1, "least-queue")
    assert (mt.slowdown, mt.jitter, mt.seed, mt.profile) == (2.0, 0.05, 3, "legacy-2023")
    assert mt.limits() == (64, 4096, False) and mt.weight_dtype == "fp8" and mt.gpus == 8
    assert cfg.faults.http500 == 0.1 and cfg.emission_log == Path("/tmp/x.parquet")
    fixed = parse(["--model", "m", "--ttft-ms", "20", "--itl-ms", "5", "--tokens-per-chunk", "2"])
    assert fixed.model_timing is None and fixed.timing.ttft_s == 0.02 and fixed.timing.tokens_per_chunk == 2
    with pytest.raises(BenchError):
        parse(["--timing", "model", "--disagg", "x"])


def test_toml_overrides_with_dotted_errors(tmp_path: Path) -> None:
    f = tmp_path / "sim.toml"
    f.write_text('[gpu]\nhbm_tb_s = 1.675\n[engine]\nmax_num_seqs = 32\ntp = 4\n[profile]\nt_fixed_ms = 4.0\n')
    cfg = parse(["--timing", "model", "--config", str(f), "--tp", "2"])
    mt = cfg.model_timing
    assert mt is not None and mt.gpu_model.hbm_tb_s == 1.675 and mt.limits()[0] == 32
    assert mt.tp == 2  # the CLI wins over the file
    assert mt.engine_profile.t_fixed_ms == 4.0
    half_bw = single_tpot(mt)
    assert half_bw > 1.6 * single_tpot(dataclasses.replace(mt, gpu_spec=None, profile_spec=None))
    f.write_text("[gpu]\nhbm_tbs = 1\n")
    with pytest.raises(BenchError, match="gpu.hbm_tbs"):
        parse(["--timing", "model", "--config", str(f)])


def single_tpot(t: ModelTiming) -> float:
    return simulate(ModelBackend(t), [Arrival(0.0, 100, 20)])[0].tpot_s


def test_weights_that_do_not_fit_exit_with_one_line() -> None:
    p = subprocess.run(
        bench_argv("sim", "serve", "--port", "0", "--timing", "model", "--model-preset", "llama-3.1-70b", "--dtype",
                   "bf16", "--tp", "1"),
        capture_output=True, text=True, timeout=60,
    )
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("out of memory: llama-3.1-70b bf16 needs 141.2 GB")


def test_real_time_follows_the_model_and_slowdown(tmp_path: Path) -> None:
    t = ModelTiming("llama-3.1-8b", "h100")
    (pred,) = simulate(ModelBackend(t), [Arrival(0.0, 2000, 30)])
    prompt = " ".join(f"w{i}" for i in range(2000))
    res = {}
    for slow in (1.0, 3.0):
        d = tmp_path / f"s{slow}"
        d.mkdir()
        cfg = ServerConfig(model="llama-3.1-8b", model_timing=dataclasses.replace(t, slowdown=slow))
        rows = run_against(cfg, spaced([prompt, prompt + " x"], 30, gap_ms=800), d)
        assert all(r["ok"] and r["output_tokens"] == 30 for r in rows)
        r = rows[0]
        gaps = [b - a for a, b in zip(r["chunk_ns"], r["chunk_ns"][1:])]
        res[slow] = ((r["first_token_ns"] - r["send_ns"]) / 1e9, statistics.median(gaps) / 1e9, rows[1])
    ttft, itl, second = res[1.0]
    print(f"predicted TTFT {pred.ttft_s*1e3:.1f} ms / TPOT {pred.tpot_s*1e3:.2f} ms; "
          f"measured TTFT {ttft*1e3:.1f} ms / ITL p50 {itl*1e3:.2f} ms")
    assert abs(ttft - pred.ttft_s) < 0.3 * pred.ttft_s + 0.01
    assert abs(itl - pred.tpot_s) < 0.25 * pred.tpot_s
    assert 2.5 < res[3.0][1] / itl < 3.5  # --slowdown multiplies every step
    assert second["cached_tokens"] >= 1984  # same prompt again: prefix-cache hit reported


@pytest.mark.parametrize(
    "layout",
    [{"dp": 2, "router": "least-queue"}, {"pp": 2}, {"disagg_prefill": 1, "disagg_decode": 1}, {"tp": 2, "dcp": 2},
     {"pcp": 2}],
)
def test_parallel_layouts_serve_in_real_time(tmp_path: Path, layout: dict) -> None:
    t = dataclasses.replace(ModelTiming("llama-3.1-8b", "h100"), **layout)
    cfg = ServerConfig(model="llama-3.1-8b", model_timing=t, emission_log=tmp_path / "e.parquet")
    prompts = [" ".join(f"p{i}w{j}" for j in range(300)) for i in range(6)]
    rows = run_against(cfg, spaced(prompts, 10, gap_ms=5), tmp_path)
    assert all(r["ok"] and r["output_tokens"] == 10 for r in rows)
    import pyarrow.parquet as pq

    log = pq.read_table(tmp_path / "e.parquet").to_pandas()
    assert len(log) == 60 and (log.actual_ns >= log.intended_ns).all()


def test_describe_and_validate_commands() -> None:
    p = subprocess.run(bench_argv("sim", "describe", "--model-preset", "llama-3.1-70b", "--tp", "2", "--dp", "2"),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and '"kv_tokens_per_instance": 211776' in p.stdout and '"gpus": 4' in p.stdout
    p = subprocess.run(bench_argv("sim", "describe", "--model-preset", "deepseek-v3", "--tp", "8"),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "out of memory: deepseek-v3" in p.stderr
