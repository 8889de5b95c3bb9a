"""The README's everyday examples run as written against the embedded engine.

The commands are read from the README itself (the first bash block under "Everyday use");
only sizes shrink (request counts, the port), so a README edit that breaks an example
breaks this test.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path

from bench_llm.launch.process import free_port
from tests.conftest import REPO, bench_argv

#: Each verb's accepted exit codes (README, "Exit codes"): a gate may pass or find a
#: regression between two different runs; everything else must succeed.
_EXPECTED = {"gate": (0, 1)}


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Everyday use") :]
    block = section[section.index("```bash") + len("```bash") : section.index("```", section.index("```bash") + 7)]
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.split(" #")[0].strip() for line in joined.splitlines() if line.strip().startswith("bench ")]


def _shrink(argv: list[str], port: int) -> list[str]:
    out = []
    for i, arg in enumerate(argv):
        prev = argv[i - 1] if i else ""
        if prev == "--requests":
            arg = str(min(int(arg), 12))
        elif prev == "--concurrency":
            arg = str(min(int(arg), 4))
        elif prev == "--port" and arg == "8000":
            arg = str(port)
        out.append(arg.replace(":8000", f":{port}"))
    return out


def _wait_ready(url: str, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} not ready")


def test_readme_everyday_examples_run_as_written(tmp_path: Path) -> None:
    commands = readme_commands()
    (tmp_path / "ci").symlink_to(REPO / "ci")  # the README's commands run from the repository root
    assert len(commands) >= 10 and commands[0].startswith("bench sim serve") and commands[0].endswith("&")
    port = free_port()
    server_argv = _shrink(shlex.split(commands[0].rstrip("&")), port)
    assert server_argv[server_argv.index("--port") + 1] == str(port)
    server = subprocess.Popen(bench_argv(*server_argv[1:]), cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        _wait_ready(f"http://127.0.0.1:{port}")
        for line in commands[1:]:
            argv = _shrink(shlex.split(line), port)
            p = subprocess.run(bench_argv(*argv[1:]), cwd=tmp_path, capture_output=True, text=True, timeout=300)
            assert p.returncode in _EXPECTED.get(argv[1], (0,)), f"{line}\nexit {p.returncode}\n{p.stderr[-3000:]}"
            assert "Traceback" not in p.stderr and "nan" not in p.stdout.split(), line
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert (tmp_path / "report.html").exists() and (tmp_path / "runs" / "sweep8b" / "cells.parquet").exists()
    assert not list(tmp_path.glob("*-workload.html"))  # `workload show` writes nothing unasked
