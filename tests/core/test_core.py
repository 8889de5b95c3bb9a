"""The bottom layer (core/): the engine-control client, the k=v parser, the click-free error
base and the one version."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench_llm.core import __version__
from bench_llm.core.control import ControlError, EngineClient
from bench_llm.core.errors import BenchError
from bench_llm.core.pairs import Pair, split_pairs
from tests.conftest import REPO, bench_argv, http_server


class _Engine(http.server.BaseHTTPRequestHandler):
    """/health 200, /sick 503, /version JSON, /tokenize counting words in one of three shapes."""

    shape = "count"

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, status: int, obj: object) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        routes = {"/health": (200, {}), "/sick": (503, {"error": "busy"}), "/version": (200, {"version": "9.9"})}
        self._reply(*routes.get(self.path, (404, {})))

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = len(payload["prompt"].split())
        shapes = {"count": {"count": n}, "tokens": {"tokens": list(range(n))}, "list": list(range(n)), "odd": {"n": n}}
        self._reply(200, shapes[type(self).shape])


@pytest.fixture
def engine() -> Iterator[str]:
    with http_server(_Engine) as url:
        yield url


def test_control_client_reports_answers_and_failures_without_raising(engine: str) -> None:
    client = EngineClient(engine, timeout_s=5)
    assert client.health().ok
    sick = client.get("/sick")
    assert not sick.ok and sick.status == 503 and sick.problem() == "HTTP 503" and sick.json() == {"error": "busy"}
    assert client.version([("/nope", "version"), ("/version", "missing"), ("/version", "version")]) == "9.9"
    refused = EngineClient("http://127.0.0.1:9", timeout_s=2).health()
    assert refused.status is None and not refused.ok and refused.problem()


@pytest.mark.parametrize("shape", ["count", "tokens", "list"])
def test_control_client_counts_tokens_in_each_reply_shape(engine: str, shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_Engine, "shape", shape)
    assert EngineClient(engine).count_tokens("one two three", model="m") == 3


def test_control_client_names_an_unusable_tokenize_reply(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_Engine, "shape", "odd")
    with pytest.raises(ControlError, match="/tokenize: unexpected reply"):
        EngineClient(engine).count_tokens("a b")
    with pytest.raises(ControlError, match="/tokenize: "):
        EngineClient("http://127.0.0.1:9", timeout_s=2).count_tokens("a b")


def test_split_pairs_is_the_one_key_value_parser() -> None:
    assert split_pairs(" tp=2, ,dp = 4,disagg=1:1,flag") == [
        Pair("tp=2", "tp", "2"), Pair("dp = 4", "dp", " 4"), Pair("disagg=1:1", "disagg", "1:1"), Pair("flag", "flag", None)
    ]
    assert split_pairs("") == []


def test_errors_are_click_free_and_only_the_cli_makes_exit_codes(tmp_path: Path) -> None:
    import click

    assert not issubclass(BenchError, click.ClickException)
    argv = bench_argv("run", "--launch", "--engine", "sim", "--parallel", "tp=x", "--concurrency", "1",
                      "--requests", "1", "--out", str(tmp_path / "x"), "--no-progress")  # fmt: skip
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [p.stderr.strip()], p.stderr
    assert p.stderr.startswith("error: --parallel 'tp=x': "), p.stderr


def test_the_version_is_written_once() -> None:
    out = subprocess.run([sys.executable, "-m", "bench_llm.bench", "--version"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert __version__ in out.stdout
    assert "version =" not in (REPO / "pyproject.toml").read_text().split("[project.optional-dependencies]")[0]
