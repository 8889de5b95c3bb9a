"""Issue 16 item 7: the engine's served context is read, requests are fitted into it or
refused before sending (saying how many and why), and a session's skipped turns are rows."""

from __future__ import annotations

from pathlib import Path

from bench_llm.adapters.context import (
    openai_models_max_model_len,
    sglang_server_info_context_length,
    tgi_info_max_total_tokens,
)
from bench_llm.launch.profiles import context_routes
from bench_llm.results.reader import read_run_meta
from bench_llm.sim.server import ServerConfig
from bench_llm.sim.timing import FixedTiming
from bench_llm.workloads.context import CHAT_MESSAGE_TOKENS, MARGIN_TOKENS, fit_to_context
from bench_llm.workloads.spec import RequestSpec, Schedule
from tests.sim_helpers import run_against

CONTEXT = 256
SIM = ServerConfig(model="m", max_model_len=CONTEXT, timing=FixedTiming(ttft_s=0.002, itl_s=0.0005))


def _req(rid: str, n_in: int, n_out: int, session: str | None = None, turn: int = 0, words: int | None = None) -> RequestSpec:
    return RequestSpec(rid, input_tokens=n_in, max_output_tokens=n_out, prompt=" ".join(["word"] * (words or n_in)),
                       session_id=session, turn=turn)  # fmt: skip


def _schedule(*specs: RequestSpec) -> Schedule:
    return Schedule("ctx", 0, "closed", tuple(specs), concurrency=2)


def test_readers_per_engine() -> None:
    models = {"object": "list", "data": [{"id": "tiny", "max_model_len": 2048}, {"id": "other", "max_model_len": 9}]}
    assert openai_models_max_model_len(models, "tiny") == 2048
    assert openai_models_max_model_len({"data": [{"id": "x", "max_model_len": 4096}]}, "served-as-y") == 4096
    assert openai_models_max_model_len({"data": []}, "tiny") is None
    assert sglang_server_info_context_length({"context_length": 8192, "tp_size": 1}, "m") == 8192
    assert sglang_server_info_context_length({"context_length": None}, "m") is None
    assert tgi_info_max_total_tokens({"max_input_tokens": 4095, "max_total_tokens": 4096}, "m") == 4096
    assert [r.path for r in context_routes("vllm")] == [r.path for r in context_routes("sim")] == ["/v1/models"]
    assert [r.path for r in context_routes("sglang")] == ["/v1/models", "/get_server_info"]
    assert [r.path for r in context_routes("tgi")] == ["/info"] and context_routes("generic") == ()


def test_fit_cuts_outputs_refuses_prompts_and_counts_history() -> None:
    fit = fit_to_context(_schedule(
        _req("a", 40, 8), _req("b", 100, 400), _req("c", 300, 8),
        _req("s0", 60, 40, "s", 0), _req("s1", 60, 40, "s", 1), _req("s2", 60, 40, "s", 2),
    ), CONTEXT)  # fmt: skip
    by_id = {r.request_id: r for r in fit.schedule.requests}
    assert by_id["a"] == _req("a", 40, 8)
    assert by_id["b"].max_output_tokens == CONTEXT - 100 - MARGIN_TOKENS and by_id["b"].refused is None
    assert by_id["c"].refused and "300 tokens" in by_id["c"].refused
    assert by_id["s1"].refused is None  # 60 + 40 of history, 60 of its own
    assert by_id["s2"].refused and "history" in by_id["s2"].refused  # 200 of history + 60 > 256
    assert (fit.cut, fit.refused, fit.skipped) == (1, 2, 0)
    msg = fit.message("/v1/models max_model_len")
    assert msg and "served context 256 tokens" in msg and "1 requests' output length cut" in msg and "2 requests refused" in msg


def test_chat_keeps_room_for_the_template_of_every_message() -> None:
    # measured on real vLLM: 3 of 40 shared-prefix chat requests still failed with room for
    # BOS only (the tiny Llama's chat template adds 17 tokens around one message)
    sched = _schedule(_req("a", 100, 400), _req("s0", 40, 20, "s", 0), _req("s1", 40, 400, "s", 1))
    plain = {r.request_id: r for r in fit_to_context(sched, CONTEXT).schedule.requests}
    chat = {r.request_id: r for r in fit_to_context(sched, CONTEXT, chat=True).schedule.requests}
    assert plain["a"].max_output_tokens - chat["a"].max_output_tokens == CHAT_MESSAGE_TOKENS
    # turn 1 carries three messages: its own and turn 0's two
    assert plain["s1"].max_output_tokens - chat["s1"].max_output_tokens == 3 * CHAT_MESSAGE_TOKENS


def test_run_fits_requests_and_records_refused_ones(tmp_path: Path) -> None:
    sched = _schedule(_req("a", 40, 8), _req("b", 100, 400), _req("c", 300, 8),
                      _req("s0", 60, 40, "s", 0), _req("s1", 60, 40, "s", 1), _req("s2", 60, 40, "s", 2),
                      _req("s3", 10, 4, "s", 3))  # fmt: skip
    rows = {r["request_id"]: r for r in run_against(SIM, sched, tmp_path)}
    assert sorted(rows) == ["a", "b", "c", "s0", "s1", "s2", "s3"]  # every scheduled request is a row
    assert rows["a"]["ok"] and rows["s0"]["ok"] and rows["s1"]["ok"]
    assert rows["b"]["ok"] and rows["b"]["output_tokens"] == rows["b"]["max_output_tokens"] == CONTEXT - 100 - MARGIN_TOKENS
    for rid in ("c", "s2"):
        assert rows[rid]["error_type"] == "exceeds_context" and rows[rid]["send_ns"] is None
    assert rows["s3"]["error_type"] == "skipped_turn" and "turn 2 of session s" in rows["s3"]["error_message"]
    notes = read_run_meta(tmp_path / "run")["notes"]["warnings"]  # printed by the summary
    assert any("served context 256 tokens" in n and "2 requests refused" in n and "1 later turns" in n for n in notes)


def test_a_failed_turn_leaves_its_later_turns_as_rows(tmp_path: Path) -> None:
    # turn 0 claims 10 tokens but sends 300 words: the engine refuses it (HTTP 400)
    sched = _schedule(_req("t0", 10, 4, "s", 0, words=300), _req("t1", 10, 4, "s", 1), _req("t2", 10, 4, "s", 2),
                      _req("x", 10, 4))  # fmt: skip
    rows = {r["request_id"]: r for r in run_against(SIM, sched, tmp_path)}
    assert sorted(rows) == ["t0", "t1", "t2", "x"]
    assert rows["t0"]["error_type"] == "http_error" and rows["x"]["ok"]
    assert [rows[t]["error_type"] for t in ("t1", "t2")] == ["skipped_turn", "skipped_turn"]
