"""Issue 33: one rule for secrets. A password planted in ``--url`` is found in none of a run's
files, a sweep's files, the report, the history store, or anything bench prints."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from aiohttp import web

from bench_llm.core.redact import redact
from tests.conftest import bench_argv
from tests.fake_vllm import FakeVllm

SECRET = "pa55w0rd-h33-planted"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("http://alice:pa55@127.0.0.1:8000/v1", "http://***@127.0.0.1:8000/v1"),
        ("cannot connect to https://u:p@ss@host:1: refused", "cannot connect to https://***@host:1: refused"),
        ("a=http://al:pw@h:1@2", "a=http://***@h:1@2"),  # bench sweep --url NAME=URL@GPUS
        ("a=http://h:1@2 and http://h/x@y", "a=http://h:1@2 and http://h/x@y"),
        ('{"url": "http://k@h:1"}', '{"url": "http://***@h:1"}'),
        ("no url at all: x@y", "no url at all: x@y"),
    ],
)
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.fixture
def fake_vllm() -> Iterator[str]:
    """host:port of an in-process fake vLLM (tests/fake_vllm.py) on 127.0.0.1."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(FakeVllm(5600).app(), access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _bench(*args: str, cwd: Path) -> tuple[int, str]:
    p = subprocess.run(bench_argv(*args), capture_output=True, text=True, timeout=180, cwd=cwd)
    return p.returncode, p.stdout + p.stderr


def _files_holding(root: Path, needle: str) -> list[str]:
    found = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        if path.suffix == ".parquet":
            text = json.dumps(pq.read_table(path).to_pylist(), default=str)
        else:
            text = path.read_bytes().decode("utf-8", "replace")
        if needle in text:
            found.append(str(path.relative_to(root)))
    return found


def test_a_password_in_the_url_is_written_and_printed_nowhere(tmp_path: Path, fake_vllm: str) -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    small = ["--model", "m", "--requests", "4", "--concurrency", "2", "--input-tokens", "4", "--output-tokens", "4",
             "--no-progress"]  # fmt: skip
    printed = []
    code, text = _bench("run", "--url", f"http://alice:{SECRET}@{fake_vllm}", "--out", "run", *small, cwd=tmp_path)
    assert code == 0, text
    printed.append(text)
    # every request fails with an error that names the URL: in the records, the summary, the exit line
    code, text = _bench("run", "--url", f"http://alice:{SECRET}@127.0.0.1:{dead_port}", "--out", "dead",
                        "--transport", "aiohttp", *small, cwd=tmp_path)  # fmt: skip
    assert code == 3 and "http://***@127.0.0.1" in text, text
    printed.append(text)
    code, text = _bench("sweep", "--engine", "vllm", "--model", "m", "--url", f"a=http://alice:{SECRET}@{fake_vllm}@1",
                        "--url", f"b=http://bob:{SECRET}@127.0.0.1:{dead_port}@1", "--concurrency", "2",
                        "--requests", "4", "--warmup", "0", "--input-tokens", "4", "--output-tokens", "4",
                        "--out", "sweep", cwd=tmp_path)  # fmt: skip
    assert "sweep" in text, text
    printed.append(text)
    for args in (["report", "run", "-o", "run.html"], ["report", "sweep", "-o", "sweep.html"],
                 ["history", "run", "--store", "store", "--commit", "abc"], ["summary", "dead"]):  # fmt: skip
        code, text = _bench(*args, cwd=tmp_path)
        assert code in (0, 3), text
        printed.append(text)
    assert (tmp_path / "store").is_dir() and (tmp_path / "sweep" / "sweep.json").exists()
    assert _files_holding(tmp_path, SECRET) == []
    assert [t for t in printed if SECRET in t] == []
    # the URL itself is kept, without its credentials
    assert "http://***@" + fake_vllm in json.dumps(pq.read_table(tmp_path / "run" / "run.parquet").to_pylist(), default=str)
