"""Issue 16 item 8: runs share no cached prefix unless the workload asks for sharing."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from bench_llm.launch.process import ManagedProcess, free_port
from bench_llm.results.reader import read_requests
from bench_llm.workloads.catalog import build_named_schedule
from bench_llm.workloads.prompts import PromptSynth
from bench_llm.workloads.synthetic import SyntheticWorkload
from tests.conftest import bench_argv


def test_salt_changes_the_text_only() -> None:
    kw = dict(requests=20, input_tokens=64, output_tokens=8, rate=5.0, seed=3)
    a, b, a2 = (SyntheticWorkload(**kw, salt=x).schedule() for x in (1, 2, 1))  # type: ignore[arg-type]
    assert [r.prompt for r in a.requests] == [r.prompt for r in a2.requests]
    assert [r.send_offset_ns for r in a.requests] == [r.send_offset_ns for r in b.requests]
    assert [r.input_tokens for r in a.requests] == [r.input_tokens for r in b.requests]
    # no prompt of one run shares its first 16 words (a KV block) with any of the other
    heads = {" ".join((r.prompt or "").split()[:16]) for r in a.requests}
    assert not heads & {" ".join((r.prompt or "").split()[:16]) for r in b.requests}
    assert a.description["prompt_salt"] == 1


def test_salt_keeps_sharing_inside_a_run_only() -> None:
    def prefixes(salt: int) -> dict[str, set[str]]:
        s = build_named_schedule("shared-prefix", requests=24, rate=4.0, arrival="poisson", concurrency=None,
                                 warmup=0, seed=0, salt=salt, synth=PromptSynth())  # fmt: skip
        out: dict[str, set[str]] = {}
        for r in s.requests:
            if r.prefix_group:
                out.setdefault(r.prefix_group, set()).add(" ".join((r.prompt or "").split()[:32]))
        return out

    one, other = prefixes(1), prefixes(2)
    assert one and all(len(v) == 1 for v in one.values())  # a group's requests share their prefix
    assert not set().union(*one.values()) & set().union(*other.values())


def test_two_runs_against_one_server_share_no_cached_prefix(tmp_path: Path) -> None:
    """The same `bench run` twice against one engine: the second must not hit the first's
    prefix cache (it did, 66 %, with identical prompts), and the summary prints the hit rate."""
    port = free_port()
    argv = bench_argv("sim", "serve", "--host", "127.0.0.1", "--port", str(port), "--timing", "model")
    with ManagedProcess(argv, tmp_path / "engine.log") as engine:
        engine.wait_ready(f"http://127.0.0.1:{port}/health", 60)
        outs = []
        for i in range(2):
            res = subprocess.run(
                bench_argv("run", "--url", f"http://127.0.0.1:{port}", "--model", "llama-3.1-8b", "--requests", "8",
                           "--concurrency", "2", "--input-tokens", "256", "--output-tokens", "4",
                           "--out", str(tmp_path / f"run{i}"), "--no-progress"),
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert res.returncode == 0, res.stderr
            outs.append(res.stdout)
    rates = [re.search(r"prefix-cache hit rate ([0-9.]+)%", out) for out in outs]
    assert all(rates), outs
    assert float(rates[1].group(1)) < 5.0, outs[1]  # type: ignore[union-attr]
    cached = read_requests(tmp_path / "run1").column("cached_tokens").to_pylist()
    assert sum(c or 0 for c in cached) < 8 * 16  # not one shared block per request
