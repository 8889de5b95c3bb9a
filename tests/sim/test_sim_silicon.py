"""The simulator against measured H200 serving points (sim/silicon.py, ``bench sim validate --only silicon``).

The measured rows are not in the repository (../shared/reference/silicon/); the loader, the
closed-loop run and the report are checked on a few made-up rows written here, and a small
sample of the real rows is scored where they are present (skipped, saying why, where not)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bench_llm.bench.commands.sim import command
from bench_llm.sim import silicon
from bench_llm.sim.backend import Arrival, ModelBackend, simulate

COLUMNS = ("id,silicon_data_source,backend,backend_version,model_path,system,precision,mode,isl,osl,gemm_quant_mode,"
           "moe_quant_mode,batch_size,tp_size,pp_size,attention_dp_size,moe_tp_size,moe_ep_size,prefill_batch_size,"
           "prefill_num_workers,prefill_tp_size,prefill_pp_size,prefill_attention_dp_size,prefill_moe_tp_size,"
           "prefill_moe_ep_size,decode_batch_size,decode_num_workers,decode_tp_size,decode_pp_size,"
           "decode_attention_dp_size,decode_moe_tp_size,decode_moe_ep_size,silicon_ttft_ms,silicon_tpot_ms")
#: made-up rows in the file's layout (figures invented, not measured)
ROWS = (
    "a,x,trtllm,,meta-llama/Llama-3.1-70B,h200_sxm,fp8,agg,256,16,fp8,fp8,4,4,1,1,4,1,,,,,,,,,,,,,,,100.0,10.0",
    "b,x; silicon_concurrency=8,sglang,0.5,meta-llama/Llama-3.1-8B-Instruct,h200_sxm,fp8,agg,256,16,fp8,fp8,8,1,1,,1,1,"
    ",,,,,,,,,,,,,,50.0,5.0",
    "c,x,trtllm,,deepseek-ai/DeepSeek-R1,h200_sxm,fp8,agg,256,16,fp8,fp8,4,1,1,64,8,8,,,,,,,,,,,,,,,100.0,10.0",
    "d,x,vllm,,openai/gpt-oss-120b,h200_sxm,fp4,agg,256,16,nvfp4,nvfp4,4,1,1,1,1,1,,,,,,,,,,,,,,,100.0,10.0",
    "e,x,sglang,0.5,deepseek-ai/DeepSeek-V3,h200_sxm,fp8,disagg,256,16,fp8,fp8,,,,,,,1,,8,1,1,8,1,2,,8,1,1,8,1,"
    "300.0,20.0",
)


@pytest.fixture()
def rows_csv(tmp_path: Path) -> Path:
    path = tmp_path / "rows.csv"
    path.write_text("\n".join((COLUMNS, *ROWS)) + "\n")
    return path


def test_load_maps_models_layouts_and_concurrency(rows_csv: Path) -> None:
    points = {p.id: p for p in silicon.load(rows_csv)}
    assert set(points) == {"a", "b", "c", "e"}  # gpt-oss has no model preset: not scored
    a, b, c, e = points["a"], points["b"], points["c"], points["e"]
    assert (a.model, a.tp, a.dp, a.ep, a.concurrency, a.mode) == ("llama-3.1-70b", 4, 1, 1, 4, "agg")
    assert (b.model, b.concurrency) == ("llama-3.1-8b", 8)  # the source's own silicon_concurrency wins
    # a width of 64 on one 8-GPU node: attention DP over 8 ranks, experts over 8, C = batch x DP ranks
    assert (c.model, c.tp, c.dp, c.ep, c.concurrency) == ("deepseek-v3", 1, 8, 8, 32)
    assert (e.mode, e.tp, e.ep, e.prefill, e.decode, e.concurrency) == ("disagg", 8, 1, 1, 1, 2)


def _disagg_row(rid: str, c: int, labelled: str, figures: str) -> str:
    return (f"{rid},x; silicon_concurrency={c},trtllm,0.8,deepseek-ai/DeepSeek-R1,h200_sxm,fp8,disagg,1024,1024,fp8,"
            f"fp8,,8,1,1,1,8,{labelled},{figures}")


def test_a_disagg_row_without_workers_takes_the_deployment_measured_at_its_concurrency(tmp_path: Path) -> None:
    """C = decode workers x decode batch: an unlabelled row at a labelled row's concurrency ran that
    deployment (when every labelled row there agrees); elsewhere it runs one prefill and one decode instance."""
    blank = "," * 13  # the 14 pool columns, empty
    rows = (
        _disagg_row("given", 144, "1,1,8,1,1,1,8,16,9,8,1,1,1,8", "1037.0,20.2"),
        _disagg_row("same_c", 144, blank, "1002.0,12.9"),  # another measurement at C144: 9 decode workers
        _disagg_row("other_c", 88, blank, "938.0,10.5"),  # no labelled row at C88
        _disagg_row("split_a", 48, "1,1,8,1,1,1,8,16,3,8,1,1,1,8", "1449.0,21.4"),
        _disagg_row("split_b", 48, "1,1,8,1,1,1,8,8,6,8,1,1,1,8", "1719.0,16.8"),
        _disagg_row("split_c", 48, blank, "4223.0,12.4"),  # labelled rows at C48 disagree: not guessed
    )
    path = tmp_path / "rows.csv"
    path.write_text("\n".join((COLUMNS, *rows)) + "\n")
    points = {p.id: p for p in silicon.load(path)}
    assert (points["same_c"].prefill, points["same_c"].decode, points["same_c"].concurrency) == (1, 9, 144)
    assert (points["other_c"].prefill, points["other_c"].decode) == (1, 1)
    assert (points["split_c"].prefill, points["split_c"].decode) == (1, 1)
    assert all(p.prefill_batch == 1 for p in points.values())
    timing = silicon.engine_timing(points["same_c"])
    assert (timing.prefill_max_num_seqs, timing.prefill_max_num_batched_tokens) == (1, 2528)  # 1024 + 1 500, 32s


def test_engine_defaults_the_rows_run_with(rows_csv: Path) -> None:
    points = {p.id: p for p in silicon.load(rows_csv)}
    trt, sgl = silicon.engine_timing(points["a"]), silicon.engine_timing(points["b"])
    # FP8 checkpoints: TRT-LLM keeps FP8 KV, SGLang (and vLLM) BF16 unless told (--kv-dtype)
    assert (trt.engine_profile.name, trt.kv_cache_dtype) == ("trtllm", "fp8")
    assert (sgl.engine_profile.name, sgl.kv_cache_dtype) == ("sglang", "bf16")
    assert trt.cost_model().b_kv == 1.0 and sgl.cost_model().b_kv == 2.0


def test_a_row_runs_the_clients_closed_loop_started_together(rows_csv: Path) -> None:
    """All C streams start at once: the first prompts queue behind each other, so the row's mean TTFT
    is above one request's alone (seeded random phases would put it near the lone request's)."""
    a = next(p for p in silicon.load(rows_csv) if p.id == "a")
    ttft, tpot = silicon.simulate(a)
    (alone,) = simulate(ModelBackend(silicon.engine_timing(a)), [Arrival(0.0, a.isl, a.osl)])
    assert ttft > 1.3 * alone.ttft_s * 1e3
    assert tpot > 0.9 * alone.tpot_s * 1e3


def test_group_table_counts_within_20_percent(rows_csv: Path) -> None:
    points = silicon.load(rows_csv)
    a = next(p for p in points if p.id == "a")
    scored = [silicon.Scored(a, 110.0, 13.0), silicon.Scored(a, 100.0, 10.0)]
    table = silicon.group_table(scored)
    line = next(x for x in table.splitlines() if x.startswith("trtllm llama-3.1-70b agg"))
    assert line.split()[4:6] == ["2", "(100%)"] and line.split()[8:10] == ["1", "(50%)"], table
    assert "figures within ±20 %: 3 of 4 (75.0%)" in table


def test_validate_scores_the_rows_it_is_given_and_skips_cleanly_without(rows_csv: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(command, ["validate", "--only", "silicon", "--silicon-rows", str(rows_csv), "--workers", "1"])
    assert out.exit_code == 0, out.output
    assert "trtllm llama-3.1-70b agg" in out.output and "constants fitted on these rows" in out.output
    gone = runner.invoke(command, ["validate", "--only", "silicon", "--silicon-rows", str(tmp_path / "no.csv")])
    assert gone.exit_code == 0 and "skipped" in gone.output


REAL = silicon.default_path()


@pytest.mark.skipif(REAL is None, reason="no ../shared/reference/silicon/h200_silicon.csv (measured H200 rows) here")
def test_dense_decode_on_the_measured_rows_stays_within_20_percent() -> None:
    """A small sample of the real rows (TRT-LLM Llama-3.1-70B, 1024/1024, C <= 16): TPOT is the model's
    strength on dense decode; all of these were within ±20 % when this test was written."""
    assert REAL is not None
    sample = [p for p in silicon.load(REAL)
              if p.group == "trtllm llama-3.1-70b agg" and (p.isl, p.osl) == (1024, 1024) and p.concurrency <= 16]
    assert len(sample) >= 8
    scored = silicon.score(sample)
    within = sum(1 for s in scored if abs(s.ratios[1] - 1) <= 0.20)
    assert within >= len(sample) - 1, silicon.rows_table(scored)


def test_kv_dtype_flag_and_each_engines_default() -> None:
    from bench_llm.bench.commands.sim import build_config

    def timing(*args: str):  # type: ignore[no-untyped-def]
        return build_config(command.commands["serve"].make_context("serve", ["--timing", "model", *args]).params
                            ).model_timing

    assert timing("--profile", "trtllm", "--dtype", "fp8").kv_cache_dtype == "fp8"  # TRT-LLM: the checkpoint's FP8 KV
    assert timing("--profile", "trtllm", "--dtype", "bf16").kv_cache_dtype == "bf16"
    assert timing("--profile", "vllm", "--dtype", "fp8").kv_cache_dtype == "bf16"  # vLLM/SGLang auto: the model dtype
    fp8 = timing("--profile", "vllm", "--dtype", "fp8", "--kv-dtype", "fp8")
    assert fp8.kv_cache_dtype == "fp8" and fp8.cost_model().b_kv == 1.0
    # FP8 KV holds twice the tokens in the same memory
    bf16 = timing("--profile", "vllm", "--dtype", "fp8", "--kv-dtype", "bf16")
    assert fp8.cost_model().kv_tokens() > 1.9 * bf16.cost_model().kv_tokens()


def test_the_vllm_skew_stops_growing_above_tp4() -> None:
    from bench_llm.sim.options import ModelTiming

    def skew(profile: str, tp: int) -> float:
        return ModelTiming("llama-3.1-70b", "h200", "fp8", tp=tp, profile=profile).cost_model().skew_s

    assert skew("vllm", 8) == skew("vllm", 4) > skew("vllm", 2) > 0
    assert skew("sglang-2024", 8) > 2 * skew("sglang-2024", 4)  # its DeepSeek TP8 rows were fitted with the growth


def test_mla_decode_attention_is_compute_bound_with_all_heads_on_a_gpu() -> None:
    """MLA decode attention on the latent cache costs 2 x (576 + 512) FLOPs per context token, layer and head:
    with attention DP (128 heads on every GPU) a batch of 64 at 8 k context is bound by those FLOPs (~20 ms at
    FlashMLA's 660 TFLOP/s), far above the latent's read (~5 ms of FP8 bytes); at TP8 (16 heads a GPU) the
    FLOPs are an eighth and the read still dominates; a GQA model's decode attention stays the read."""
    from bench_llm.sim.costmodel import _blend
    from bench_llm.sim.options import ModelTiming

    def attn(tp: int, dp: int, model: str = "deepseek-v3") -> tuple[float, float]:
        cm = ModelTiming(model, "h200", "fp8", tp=tp, dp=dp, ep=8 if model == "deepseek-v3" else 1,
                         profile="trtllm").cost_model()
        ctx = 64 * 8192
        return cm.step([], 64, ctx).parts["attn_decode"], ctx * cm.kv_bytes_token_gpu / cm._kv_read_bw

    dp8, read_dp8 = attn(1, 8)
    tp8, read_tp8 = attn(8, 1)
    flops_dp8 = 64 * 8192 * 2 * 61 * (576 + 512) * 128 / 660e12
    assert dp8 == pytest.approx(_blend(read_dp8, flops_dp8)) and dp8 > 3 * read_dp8
    assert tp8 < 1.5 * read_tp8
    gqa, read_gqa = attn(8, 1, "llama-3.1-70b")
    assert gqa == read_gqa
