"""The run says which read path parsed its streams (issue 20): per run, the payloads the
compiled scan took and those the adapter's Python parser read, in ``notes.read_path_payloads``;
``bench summary`` warns when a run with the compiled path on fell back to Python."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench_llm.adapters.openai import OpenAIAdapter
from bench_llm.adapters.sglang import SGLangAdapter, SGLangStreamParser
from bench_llm.analysis.load import load_run
from bench_llm.analysis.slo import SLO
from bench_llm.bench.report_text import read_path_share, summary_of
from bench_llm.sim.server import ServerConfig
from bench_llm.sim.timing import FixedTiming
from tests.sim_helpers import run_against, schedule

pytest.importorskip("bench_llm.loadgen._fastpath", reason="the compiled read path is not built here (no C compiler?)")


def _run(tmp_path: Path, flavor: str, adapter: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    cfg = ServerConfig(timing=FixedTiming(0.002, 0.001), flavor=flavor)
    rows = run_against(cfg, schedule(6, output_tokens=24, concurrency=3), tmp_path, adapter=adapter)
    assert len(rows) == 6 and all(r["ok"] for r in rows), rows
    run = load_run(tmp_path / "run")
    summary, _ = summary_of(tmp_path / "run", SLO(), (50.0, 99.0))
    return run.meta, summary


@pytest.mark.parametrize("continuous", [True, False])
def test_openai_streams_with_or_without_usage_per_chunk_are_read_in_c(tmp_path: Path, continuous: bool) -> None:
    """Usage on every chunk, or only at the end (stock OpenAI servers): the compiled scan
    takes the token events; the parser reads only each stream's first and final events."""
    meta, summary = _run(tmp_path, "vllm", OpenAIAdapter(model="sim-model", continuous_usage=continuous))
    counts = meta["notes"]["read_path_payloads"]
    share = read_path_share(meta)
    assert share is not None and share["configured"] == "compiled"
    assert counts["compiled"] >= 6 * 20, counts  # 24 tokens a stream, a few events to the parser
    assert counts["python"] <= 6 * 5, counts
    assert not share["fell_back"] and summary.run["read_path"] == share
    assert not any("fell back" in w for w in summary.run["warnings"])


def test_tgi_token_events_are_read_in_c(tmp_path: Path) -> None:
    """TGI's /generate_stream: one token per event, the scan takes them; the parser reads the final one."""
    from bench_llm.adapters.tgi import TGIAdapter

    meta, summary = _run(tmp_path, "tgi", TGIAdapter(model="sim-model"))
    counts = meta["notes"]["read_path_payloads"]
    assert counts["compiled"] >= 6 * 20 and counts["python"] <= 6 * 2, counts
    assert not summary.run["read_path"]["fell_back"]


def test_sglang_events_are_read_in_c(tmp_path: Path) -> None:
    """SGLang's /generate stream (cumulative text and output_ids, timings in meta_info): the
    scan takes the token events; the parser reads each stream's final event."""
    meta, summary = _run(tmp_path, "sglang", SGLangAdapter(model="sim-model"))
    counts = meta["notes"]["read_path_payloads"]
    assert counts["compiled"] >= 6 * 20 and counts["python"] <= 6 * 2, counts
    share = read_path_share(meta)
    assert share is not None and not share["fell_back"] and summary.run["read_path"] == share
    assert not any("fell back" in w for w in summary.run["warnings"])


class _UnknownShapeAdapter(SGLangAdapter):
    """SGLang's events through a parser that offers the scan nothing (a shape it does not know)."""

    def parser(self) -> Any:
        class Unknown(SGLangStreamParser):
            fast_api = 0

        return Unknown()


def test_a_stream_shape_the_scan_does_not_know_is_said_to_fall_back(tmp_path: Path) -> None:
    """Payloads the compiled scan does not know all go to the Python parser although the
    compiled path is on, and the summary says so."""
    meta, summary = _run(tmp_path, "sglang", _UnknownShapeAdapter(model="sim-model"))
    counts = meta["notes"]["read_path_payloads"]
    assert counts["compiled"] == 0 and counts["python"] >= 6 * 24, counts
    share = read_path_share(meta)
    assert share is not None and share["fell_back"] and share["python_share"] == 1.0
    assert any(w.startswith("read path fell back to Python") for w in summary.run["warnings"]), summary.run


def test_a_run_that_did_not_record_it_has_no_share() -> None:
    assert read_path_share({"notes": {"sent": 3}}) is None
    meta = {"notes": {"read_path_payloads": {"compiled": 10, "python": 90}}, "adapter": {"read_path": "python"}}
    share = read_path_share(meta)
    assert share is not None and share["python_share"] == 0.9 and not share["fell_back"]  # the Python path was asked for
