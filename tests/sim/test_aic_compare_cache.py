"""benchmarks/aic_compare.py's estimate step: resumable per-row cache, bounded estimates, version fallback
(with a stand-in for AIConfigurator's ``cli_estimate``: the package is never installed into bench's venv)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from tests.conftest import benchmark_module

_COLS = ("id,backend,backend_version,model_path,mode,isl,osl,gemm_quant_mode,moe_quant_mode,batch_size,tp_size,"
         "pp_size,attention_dp_size,moe_tp_size,moe_ep_size")


def _mod() -> ModuleType:
    return benchmark_module("aic_compare")


def _rows(tmp_path: Path) -> Path:
    rows = tmp_path / "rows.csv"
    rows.write_text("\n".join([
        _COLS,
        "a,vllm,0.12.0,nvidia/Llama-3.1-8B-Instruct-FP8,agg,1000,100,fp8,,8,1,,,,",
        "b,vllm,0.12.0,nvidia/Llama-3.1-8B-Instruct-FP8,agg,1000,100,fp8,,8,1,,,,",  # same arguments as a
        "c,vllm,0.12.0,nvidia/Llama-3.1-8B-Instruct-FP8,agg,1000,100,fp8,,64,1,,,,",
        "d,vllm,0.12.0,nvidia/Llama-3.1-8B-Instruct-FP8,agg,1000,100,fp8,,128,1,,,,",
    ]) + "\n")
    return rows


class _Fake:
    """Refuses raw versions as AIConfigurator 0.12 does; refuses batch 128 as out of memory."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __call__(self, **kw: object) -> SimpleNamespace:
        self.calls.append((str(kw["backend_version"]), int(kw["batch_size"])))  # type: ignore[call-overload]
        if kw["backend_version"] != "current":
            raise ValueError(f"vllm/{kw['backend_version']!r} looks like an old-style raw version query; use one of "
                             "the slot versions {'current': '0.24.0'}")
        if kw["batch_size"] == 128:
            raise RuntimeError("OOM: the model does not fit in GPU memory on system 'h200_sxm'")
        return SimpleNamespace(ttft=10.0 * int(kw["batch_size"]), tpot=5.0, backend_version="current")  # type: ignore[call-overload]


def test_estimate_caches_each_argument_set_once_and_resumes(tmp_path: Path) -> None:
    mod, rows, cache, out = _mod(), _rows(tmp_path), tmp_path / "cache", tmp_path / "out.json"
    fake = _Fake()
    assert mod.estimate(out, rows, None, cache, 5.0, fake) == 0
    got = json.loads(out.read_text())
    assert set(got) == {"a", "b", "c", "d"}
    assert got["a"] == got["b"] and got["a"]["ttft_ms"] == 80.0 and got["a"]["asked"] == "0.12.0"
    assert "OOM" in got["d"]["error"]
    # the row's version first, then current; rows a and b share one estimate
    assert fake.calls == [("0.12.0", 8), ("current", 8), ("0.12.0", 64), ("current", 64), ("0.12.0", 128),
                          ("current", 128)]
    assert len((cache / "estimates.jsonl").read_text().splitlines()) == 3
    again = _Fake()
    assert mod.estimate(tmp_path / "out2.json", rows, None, cache, 5.0, again) == 0
    assert again.calls == []  # every row from the cache
    assert json.loads((tmp_path / "out2.json").read_text()) == got


def test_a_partial_cache_is_completed_not_redone(tmp_path: Path) -> None:
    mod, rows, cache = _mod(), _rows(tmp_path), tmp_path / "cache"
    first = _Fake()
    mod.estimate(tmp_path / "o.json", rows, 1, cache, 5.0, first)  # stopped after one row
    rest = _Fake()
    mod.estimate(tmp_path / "o.json", rows, None, cache, 5.0, rest)
    assert ("current", 8) in first.calls and ("current", 8) not in rest.calls
    assert len(json.loads((tmp_path / "o.json").read_text())) == 4


def test_an_estimate_past_its_bound_is_recorded_as_a_timeout(tmp_path: Path) -> None:
    mod = _mod()

    def slow(**kw: object) -> SimpleNamespace:
        time.sleep(30)
        raise AssertionError("not bounded")

    res = mod._estimate_one(slow, {"batch_size": 1}, "current", 0.2)
    assert res["error"].startswith("timeout")
    assert mod._reason(res["error"]) == "timeout"
    assert mod._reason("ValueError: prefill_batch_size is required for disagg mode.") == \
        "no prefill batch size (P/D row)"


def test_compare_counts_refusals_by_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench_llm.sim import silicon

    path = silicon.default_path()
    if path is None:
        pytest.skip("no measured H200 rows (../shared/reference/silicon absent)")
    points = silicon.load(path)
    ones = [p for p in points if p.group == "vllm llama-3.1-70b agg"][:3]
    aic = {ones[0].id: {"ttft_ms": ones[0].ttft_ms, "tpot_ms": ones[0].tpot_ms},
           ones[1].id: {"error": "RuntimeError: OOM: the model does not fit in GPU memory"},
           ones[2].id: {"error": "timeout: no estimate within 120 s"}}
    j = tmp_path / "aic.json"
    j.write_text(json.dumps(aic))
    assert _mod().compare(j, path) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("vllm llama-3.1-70b agg"))
    assert "does not fit (batch KV at C) 1" in line and "timeout 1" in line
    cells = line.split()
    assert cells[3] == "1/60"  # one row estimated of the group's 60
    assert cells[6:8] == ["1/1", "0%"]  # AIConfigurator's TTFT: the measured figure itself
