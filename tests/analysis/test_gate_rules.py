"""Gate rules judged on intervals, config validation, JUnit XML and Markdown output."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench_llm.analysis.bootstrap import Change
from bench_llm.analysis.gate import (
    GateConfig,
    GateResult,
    MetricGate,
    judge_change,
    junit_xml,
    load_gate_config,
    markdown_summary,
    run_gate,
)
from bench_llm.core.config import ConfigError
from bench_llm.results.synthetic import synthetic_run
from tests.conftest import REPO, run_cli


def _change(rel: float, lo: float, hi: float, better: str = "lower", base: float = 100.0) -> Change:
    return Change("ttft_p95_ms", "ms", better, base, base * (1 + rel), base * (1 + lo), base * (1 + hi),  # type: ignore[arg-type]
                  base * rel, base * lo, base * hi, rel, lo, hi, 0.95, lo > 0 or hi < 0)  # fmt: skip


@pytest.mark.parametrize(
    ("rel", "lo", "hi", "verdict"),
    [
        (0.02, -0.03, 0.07, "pass"),
        (0.12, 0.04, 0.20, "inconclusive"),  # above 10 % but the interval reaches below it: noise cannot fail
        (0.15, 0.11, 0.19, "fail"),  # the whole interval is above 10 %
        (0.10, 0.10, 0.10, "pass"),  # at the limit exactly is allowed
    ],
)
def test_max_increase_pct_fails_only_when_the_whole_interval_is_beyond(rel: float, lo: float, hi: float, verdict: str) -> None:
    (r,) = judge_change("run", _change(rel, lo, hi), MetricGate(max_increase_pct=10))
    assert r.verdict == verdict, r


def test_decrease_absolute_bounds_and_observe() -> None:
    c = _change(-0.08, -0.12, -0.06, better="higher")
    (r,) = judge_change("run", c, MetricGate(max_decrease_pct=5))
    assert r.verdict == "fail"
    (r,) = judge_change("run", c, MetricGate(max_decrease_pct=0, observe=True))
    assert r.verdict == "observe"
    (r,) = judge_change("run", c, MetricGate(max_decrease=20))  # absolute: -12 .. -6 stays above -20
    assert r.verdict == "pass"
    rs = judge_change("run", _change(0.0, -0.01, 0.01), MetricGate(max=99.5, min=50))
    assert [x.verdict for x in rs] == ["inconclusive", "pass"]  # current 100 in [99, 101] vs max 99.5
    nan = Change("error_rate", "", "lower", 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, float("nan"), float("nan"), float("nan"), 0.95, False)
    (r,) = judge_change("run", nan, MetricGate(max_increase_pct=10))
    assert r.verdict == "n/a"


def test_config_validation(tmp_path: Path) -> None:
    p = tmp_path / "g.toml"
    p.write_text("[metrics.ttft_p95_ms]\nmax_increase_pct = 10\nmax_increse = 3\n")
    with pytest.raises(ConfigError, match=r"metrics\.ttft_p95_ms\.max_increse"):
        load_gate_config(p)
    p.write_text("[metrics.ttft_p96_ms]\nmax_increase_pct = 10\n")
    with pytest.raises(ConfigError, match="unknown metric 'ttft_p96_ms'"):
        load_gate_config(p)
    p.write_text("[metrics.goodput_rps]\nmax_decrease_pct = 0\n")
    with pytest.raises(ConfigError, match="needs gate.slo"):
        load_gate_config(p)
    p.write_text("[metrics.ttft_p95_ms]\nobserve = true\n")
    with pytest.raises(ConfigError, match="no threshold"):
        load_gate_config(p)
    for name in ("gates.toml", "gates-sim.toml"):
        cfg = load_gate_config(REPO / "ci" / name)
        assert isinstance(cfg, GateConfig) and cfg.metrics


def test_run_gate_outputs_and_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = synthetic_run(tmp_path / "base", 300, 8, seed=1)
    same = synthetic_run(tmp_path / "same", 300, 8, seed=2)
    slow = synthetic_run(tmp_path / "slow", 300, 8, seed=3, scale=1.3)
    cfg = tmp_path / "g.toml"
    cfg.write_text(
        '[gate]\nresamples = 300\nslo = { ttft_ms = 200, tpot_ms = 20 }\n'
        "[metrics.ttft_p95_ms]\nmax_increase_pct = 10\n[metrics.tpot_p50_ms]\nmax_increase_pct = 5\n"
        "[metrics.goodput_rps]\nmax_decrease_pct = 0\n"
    )
    ok: GateResult = run_gate(base, same, load_gate_config(cfg))
    assert ok.passed
    bad = run_gate(base, slow, load_gate_config(cfg))
    assert not bad.passed
    root = ET.fromstring(junit_xml(bad))
    suite = root.find("testsuite")
    assert suite is not None and int(suite.get("failures", "0")) >= 2 and int(suite.get("tests", "0")) == 3
    md = markdown_summary(bad)
    assert md.startswith("## Performance gate: FAILED") and "| `tpot_p50_ms` |" in md
    junit, md_path = tmp_path / "out" / "j.xml", tmp_path / "out" / "s.md"
    step = tmp_path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    proc = run_cli("gate", "--baseline", str(base), "--current", str(slow), "--config", str(cfg), "--junit", str(junit),
                   "--markdown", str(md_path))  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gate FAILED" in proc.stdout and junit.exists() and "FAILED" in step.read_text()
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    proc = run_cli("gate", "--baseline", str(base), "--current", str(same), "--config", str(cfg))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg.write_text("[metrics.nope]\nmax = 1\n")
    proc = run_cli("gate", "--baseline", str(base), "--current", str(same), "--config", str(cfg))
    assert proc.returncode == 2 and proc.stderr.startswith("error:") and "Traceback" not in proc.stderr


def test_missing_configuration_fails_the_gate(tmp_path: Path) -> None:
    for cell in ("tp1", "tp2"):
        synthetic_run(tmp_path / "base" / f"cell={cell}", 100, 4, extra={"cell": {"tp": int(cell[-1])}})
    synthetic_run(tmp_path / "cur" / "cell=tp1", 100, 4, seed=5, extra={"cell": {"tp": 1}})
    cfg = GateConfig(metrics={"ttft_p50_ms": MetricGate(max_increase_pct=50)})
    res = run_gate(tmp_path / "base", tmp_path / "cur", cfg)
    assert res.missing == ("tp=2",) and not res.passed
    assert "missing" in junit_xml(res)


def test_ci_examples_use_existing_files_and_options() -> None:
    """The workflows and the sweep script only use bench options that exist."""
    import re

    ci = REPO / "ci"
    texts = {p.name: p.read_text() for p in [ci / "sweep-sim.sh", *(ci / "workflows").glob("*.yml")]}
    assert {"sweep-sim.sh", "nightly.yml", "baseline.yml"} <= set(texts)
    for name, text in texts.items():
        for ref in re.findall(r"ci/[\w./-]+", text):
            assert (REPO / ref).exists(), f"{name} refers to missing {ref}"
        flat = text.replace("\\\n", " ")
        for verb, args in re.findall(r"\bbench (sweep|gate|report|compare)\b([^\n]*(?:\n\s+--[^\n]*)*)", flat):
            helptext = run_cli(verb, "--help").stdout
            for opt in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", args):
                assert opt in helptext, f"{name}: bench {verb} has no option {opt}"
