"""Exact prompts by default where the engine can say (issue 32, item 7): a launched or --url
engine with a /tokenize route is asked; where it counts the word prompts otherwise, prompts
are made exact through it; where it cannot say, every sweep line and the recommendation say
the prompts were approximate and by how much; "exact" counts the start token the engine adds."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler

import pandas as pd
import pytest

from bench_llm.analysis.format import _prompt_line
from bench_llm.analysis.recommend import recommend
from bench_llm.analysis.recommend_text import format_recommendation
from bench_llm.analysis.recommend_types import Recommendation
from bench_llm.analysis.summary import approximate_prompts, prompt_length_accounting
from bench_llm.bench.exact_prompts import exact_by_default
from bench_llm.bench.sweep import loads as sweep_loads
from bench_llm.bench.sweep.cell_echo import echo_point
from bench_llm.bench.sweep.loads import Load, build_schedule
from bench_llm.bench.sweep.spec import SweepSpec, WorkloadSpec
from bench_llm.results.sweep_rows import PointRow
from bench_llm.workloads.prompts import word_prompts_exact
from tests.conftest import http_server


def _server(count: Callable[[str], int], calls: list[str]) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(self.path)
            n = count(str(body.get("prompt", "")))
            data = json.dumps({"count": n, "tokens": list(range(n))}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    with http_server(Handler) as url:
        yield url


@pytest.fixture()
def word_server() -> Iterator[tuple[str, list[str]]]:
    """Counts a word as a token, plus a start token (as the simulated engine's words do)."""
    calls: list[str] = []
    yield from ((url, calls) for url in _server(lambda t: len(t.split()) + 1, calls))


@pytest.fixture()
def bpe_server() -> Iterator[tuple[str, list[str]]]:
    """Splits words longer than six characters in two, plus a start token (as a BPE tokenizer would)."""
    calls: list[str] = []
    yield from ((url, calls) for url in _server(lambda t: sum(1 + (len(w) > 6) for w in t.split()) + 1, calls))


@pytest.fixture(autouse=True)
def _fresh_memo() -> None:
    sweep_loads._WORDS_EXACT.clear()


def test_exact_counts_the_start_token_the_engine_adds() -> None:
    df = pd.DataFrame({"input_tokens_target": [128] * 4, "prompt_tokens": [129] * 4,
                       "input_tokens_source": ["server_tokenize"] * 4})  # fmt: skip
    p = prompt_length_accounting(df)
    assert p.exact_share == 1.0 and p.engine_added == 1 and p.warning is None
    assert "100% exact (counting the 1 start token the engine adds)" in _prompt_line(p)
    # word approximations 1.3-1.7x off: nothing is "added", and they say by how much
    words = pd.DataFrame({"input_tokens_target": [128] * 4, "prompt_tokens": [169, 190, 215, 200],
                          "input_tokens_source": ["approx"] * 4})  # fmt: skip
    q = prompt_length_accounting(words)
    assert q.engine_added == 0 and q.exact_share == 0.0
    assert approximate_prompts(q) == ("the engine counted 1.52x the requested prompt length (p50), "
                                      "100% of prompts off by more than 5%")  # fmt: skip
    assert approximate_prompts(p) is None


def test_the_engine_says_whether_word_prompts_are_exact(word_server: tuple[str, list[str]],
                                                        bpe_server: tuple[str, list[str]]) -> None:  # fmt: skip
    prompts = [("alpha beta gamma", 3), ("carefully considered words", 3)]
    assert word_prompts_exact(word_server[0], "m", prompts)[0] is True
    exact, why = word_prompts_exact(bpe_server[0], "m", prompts)
    assert exact is False and "1.33x" in why  # 8 tokens for 6 words
    assert word_prompts_exact("http://127.0.0.1:9", "m", prompts, timeout_s=2.0)[0] is None


def test_who_is_asked_by_default() -> None:
    assert exact_by_default(None, None, "vllm", True) and exact_by_default(None, None, "sglang", True)
    assert not exact_by_default(None, None, "sim", True)  # its tokenizer counts the words alike
    assert not exact_by_default("off", None, "vllm", True) and not exact_by_default(None, "/tok", "vllm", True)
    assert not exact_by_default(None, None, "generic", True)  # no tokenize route
    assert not exact_by_default(None, None, "vllm", False)  # nothing live to ask


def _load(**kw: object) -> tuple[Load, SweepSpec]:
    spec = SweepSpec(model="m", engine="vllm", workloads=(WorkloadSpec(input_tokens=40, output_tokens=4, **kw),))  # type: ignore[arg-type]
    return Load("concurrency", 2, spec.workloads[0]), spec


def test_a_sweep_load_is_made_exact_where_the_engine_counts_otherwise(bpe_server: tuple[str, list[str]],
                                                                      word_server: tuple[str, list[str]]) -> None:  # fmt: skip
    load, spec = _load()
    s = build_schedule(load, spec, warmup=0, url=bpe_server[0])
    assert {r.input_tokens_source for r in s.requests} == {"server_tokenize"}
    # the word prompts already count as asked: kept, and the engine is asked once, not per load
    s = build_schedule(load, spec, warmup=0, url=word_server[0])
    assert {r.input_tokens_source for r in s.requests} == {"approx"}
    asked = len(word_server[1])
    build_schedule(load, spec, warmup=0, url=word_server[0])
    assert len(word_server[1]) == asked
    # --tokenize-url off: not asked at all
    off_load, off_spec = _load(tokenize_url="off")
    sweep_loads._WORDS_EXACT.clear()
    before = len(bpe_server[1])
    s = build_schedule(off_load, off_spec, warmup=0, url=bpe_server[0])
    assert {r.input_tokens_source for r in s.requests} == {"approx"} and len(bpe_server[1]) == before


def test_sweep_lines_and_the_recommendation_say_the_prompts_were_approximate(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    lines: list[str] = []
    row = {"ok": 10, "requests": 10, "throughput_rps": 2.0, "ttft_p90_ms": 100.0, "tpot_p90_ms": 10.0,
           "prompt_approximate": "the engine counted 1.53x the requested prompt length (p50), 100% of prompts off"}  # fmt: skip
    echo_point(lines.append, "[1/1]", "tp1", "rate-2", PointRow.from_row(row), 0.1)
    assert "PROMPTS APPROXIMATE: the engine counted 1.53x" in lines[0]

    from tests.analysis.test_recommend import SLO, _point, _sweep

    pts = [{**_point("tp1", r, 1.0), "prompt_ratio_p50": ratio, "prompt_approximate": "off" if ratio > 1.05 else None}
           for r, ratio in ((1.0, 1.52), (2.0, 1.61))]  # fmt: skip
    monkeypatch.setattr("bench_llm.analysis.recommend.sweep_settings", lambda s, p: {"slo": SLO, "attainment_pct": 90.0})
    rec = recommend(_sweep(tmp_path, pts))
    assert rec.to_json()["workloads"]["w"]["approximate_prompts"] == [
        "tp1: 2 of 2 loads, the engine counted 1.52-1.61x the requested prompt length (p50)"]
    text = format_recommendation(Recommendation.from_json(rec.to_json()))
    assert "PROMPTS APPROXIMATE (capacity is for the prompts sent" in text and "1.52-1.61x" in text


def _bpe(text: str) -> int:
    return sum(1 + (len(w) > 6) for w in text.split())


@pytest.fixture()
def bpe_vllm() -> Iterator[str]:
    """A vLLM stand-in whose tokenizer splits long words (tests/fake_vllm.py plus /tokenize),
    reporting each prompt's tokens as it counts them, with a start token."""
    import asyncio

    from aiohttp import web

    from tests.fake_vllm import FakeVllm

    class BpeVllm(FakeVllm):
        def app(self) -> web.Application:
            app = super().app()
            app.router.add_post("/tokenize", self.tokenize)
            return app

        async def tokenize(self, request: web.Request) -> web.Response:
            n = _bpe(str((await request.json()).get("prompt", ""))) + 1
            return web.json_response({"count": n, "tokens": list(range(n))})

        async def completions(self, request: web.Request) -> web.StreamResponse:
            body = await request.json()
            n, prompt = int(body.get("max_tokens", 1)), _bpe(str(body.get("prompt", ""))) + 1
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            for i in range(n):
                chunk = {"id": "c", "choices": [{"index": 0, "text": f"t{i} ", "finish_reason": "length" if i == n - 1 else None}],
                         "usage": {"prompt_tokens": prompt, "completion_tokens": i + 1, "total_tokens": prompt + i + 1}}  # fmt: skip
                await out.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await out.write(b"data: [DONE]\n\n")
            await out.write_eof()
            return out

    loop = asyncio.new_event_loop()
    runner = web.AppRunner(BpeVllm(5600, "m").app())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_bench_run_makes_prompts_exact_by_default_where_the_engine_counts_otherwise(bpe_vllm: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess

    from bench_llm.results.reader import read_requests
    from tests.conftest import bench_argv

    def run(name: str, *extra: str) -> tuple[subprocess.CompletedProcess[str], list[dict[str, object]]]:
        res = subprocess.run(
            bench_argv("run", "--url", bpe_vllm, "--engine", "vllm", "--model", "m", "--requests", "6",
                       "--concurrency", "2", "--input-tokens", "40", "--output-tokens", "3", "--no-scrape",
                       "--out", str(tmp_path / name), "--no-progress", "--json", *extra),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        return res, read_requests(tmp_path / name).to_pylist()

    res, rows = run("default")
    assert "note: prompts made exact with" in res.stderr and "x their requested lengths" in res.stderr, res.stderr
    assert {r["input_tokens_source"] for r in rows} == {"server_tokenize"}
    prompt = json.loads(res.stdout)["tokens"]["prompt"]
    assert prompt["exact_share"] == 1.0 and prompt["engine_added"] == 1  # 40 + the start token
    res, rows = run("off", "--tokenize-url", "off")
    assert {r["input_tokens_source"] for r in rows} == {"approx"} and "prompts made exact" not in res.stderr
    off = json.loads(res.stdout)["tokens"]["prompt"]
    assert off["ratio_p50"] > 1.0 and off["exact_share"] < 0.5  # long words split: longer than asked


def test_tgis_tokenize_is_asked_with_inputs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """TGI's /tokenize takes {"inputs": ...} and answers a token list: the simulated TGI flavour
    answers no token for {"prompt": ...}, so the client asks again with "inputs" and keeps it."""
    from bench_llm.core.control import EngineClient
    from bench_llm.launch.process import ManagedProcess, free_port
    from tests.conftest import bench_argv

    port = free_port()
    proc = ManagedProcess(bench_argv("sim", "serve", "--port", str(port), "--flavor", "tgi"), tmp_path / "tgi.log")
    proc.start()
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_ready(f"{url}/health", 60.0)
        client = EngineClient(url)
        assert client.count_tokens("alpha beta gamma") == 3 and client._tokenize_field == "inputs"
        assert exact_by_default(None, None, "tgi", True)
        assert word_prompts_exact(url, "m", [("alpha beta gamma", 3)])[0] is True
    finally:
        proc.stop()


def test_word_prompts_the_engine_gave_no_length_for_are_still_called_approximate() -> None:
    df = pd.DataFrame({"input_tokens_target": [128] * 3, "prompt_tokens": [None] * 3,
                       "input_tokens_source": ["approx"] * 3})  # fmt: skip
    p = prompt_length_accounting(df)
    assert p.compared == 0 and approximate_prompts(p) is None
    assert approximate_prompts(p, words=True) == (
        "word approximations: the engine reported no prompt lengths, so how far off they were is unknown")
