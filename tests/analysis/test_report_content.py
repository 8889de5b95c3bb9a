"""Report content without a browser: escaping, sweep summary on top, graceful degradation, size."""

from __future__ import annotations

import html
import re
import subprocess
from pathlib import Path

import pytest
from plotly.offline import get_plotlyjs

from bench_llm.analysis.report import build_report
from bench_llm.results.synthetic import synthetic_run
from tests.analysis.test_report_fixtures import NASTY_MODEL, make_sweep, real_run
from tests.conftest import REPO, bench_argv


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report_content")
    return make_sweep(real_run(root / "run"), root / "sweep")


def _visible(page: str) -> str:
    """The page without plotly.js (which legitimately contains '<' and script text)."""
    return page.replace(get_plotlyjs(), "")


def test_model_and_prompt_text_is_escaped(sweep_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    build_report(sweep_dir, out)
    page = _visible(out.read_text(encoding="utf-8"))
    assert NASTY_MODEL not in page
    assert "<img" not in page and 'onerror="' not in page
    assert html.escape(NASTY_MODEL, quote=True) in page  # shown, as text
    assert "<b>bold?</b>" not in page and "&lt;b&gt;bold?&lt;/b&gt;" in page
    # exactly the two scripts of the page (plotly.js, the data block, the boot script)
    assert len(re.findall(r"<script\b", page)) == 3
    # each run names the clock its timestamps were taken on
    assert re.search(r"<td>timestamps</td>\s*<td>(kernel|user): ", page), "no timestamps row"


def test_sweep_summary_with_recommendation_on_top(sweep_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    info = build_report(sweep_dir, out)
    page = _visible(out.read_text(encoding="utf-8"))
    rec = page.index('id="headline-name">tp2<')
    assert rec < page.index("<h3>Cells</h3>") < page.index("<h2>Runs</h2>") < page.index("Across runs")
    assert "tp2 (2 GPUs) is the smallest configuration" in page
    assert "out of memory: &lt;weights&gt; don&#x27;t fit" in page  # failed cell listed with its reason
    assert info.runs == 4 and info.figures >= 4 * 3 + 3


def test_sweep_without_recommendation_or_cells_degrades_with_notes(sweep_dir: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "sweep"
    shutil.copytree(sweep_dir, copy)
    (copy / "recommendation.json").unlink()
    (copy / "cells.parquet").unlink()
    out = tmp_path / "r.html"
    build_report(copy, out)
    page = out.read_text(encoding="utf-8")
    assert "no recommendation.json: recommendation omitted" in page
    assert "no cells.parquet: cell table omitted" in page


def test_cli_writes_report_and_reports_size(sweep_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli.html"
    run = sweep_dir / "cell=tp1" / "load=rate-2"
    proc = subprocess.run(bench_argv("report", str(run), "-o", str(out), "--slo", "ttft_ms=60"), capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "MB" in proc.stdout and out.exists()
    page = out.read_text(encoding="utf-8")
    assert "ttft_ms ≤ 60" in page  # the --slo override is the one shown
    bad = subprocess.run(bench_argv("report", str(tmp_path / "nope"), "-o", str(out)), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "Traceback" not in bad.stderr


def test_report_size_is_bounded_for_100k_requests(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "big", 100_000, 16)
    info = build_report(run, tmp_path / "big.html")
    data_bytes = info.bytes - len(get_plotlyjs().encode())
    assert data_bytes < 400_000, f"page + data {data_bytes / 1e3:.0f} kB for 100k requests"
    assert info.bytes < 6_000_000


def test_pareto_front_keeps_only_undominated_points() -> None:
    from bench_llm.analysis.report.figures import _pareto

    pts = [(1.0, 5.0), (2.0, 4.0), (3.0, 6.0), (2.5, 3.0), (0.5, 2.9)]
    assert _pareto(pts) == [(0.5, 2.9), (2.5, 3.0), (3.0, 6.0)]


def test_headline_evidence_and_slos_are_tables_not_json(sweep_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    build_report(sweep_dir, out)
    page = _visible(out.read_text(encoding="utf-8"))
    head = page[page.index('id="headline"') : page.index("<h3>Cells</h3>")]
    assert 'id="headline-capacity">3.95<' in head
    assert "[3.95, 4.25)" in head  # the bracket per GPU: 7.9 passed, 8.5 failed, on 2 GPUs
    assert "+13% per GPU over tp1" in head  # 3.95 against 3.5 req/s per GPU
    assert "<b>decode</b>" in head and "verify next" in head and "running batch" in head
    assert "&lt;i&gt;at 8.5 req/s&lt;/i&gt;" in head  # the diagnosis is escaped
    assert "<td>ttft_ms</td><td>≤ 80</td>" in head and "<td>TPOT p90 ms</td><td>9.50</td>" in head
    assert "{&quot;" not in head and '{"' not in head  # no raw JSON


def test_achieved_vs_offered_uses_the_asked_rate_and_marks_saturation() -> None:
    from bench_llm.analysis.report.data import LoadPoint
    from bench_llm.analysis.report.figures import achieved_vs_offered

    def point(asked: float, sent: float, achieved: float, saturated: bool = False) -> LoadPoint:
        return LoadPoint("c", f"c / rate={asked:g}", 1, asked, "rate", sent, 1, {"requests_per_s": achieved}, saturated)

    # 96 req/s asked, served 46.5: the stretched window makes the send rate look like 47
    fig = achieved_vs_offered([point(8, 8.0, 7.9), point(96, 47.0, 46.5)])
    assert fig is not None
    curve, sat = fig.data[0], fig.data[1]
    assert list(curve.x) == [8, 96] and list(curve.y) == [7.9, 46.5]
    assert "saturated" in sat.name and list(sat.x) == [96]
    fig = achieved_vs_offered([point(8, 8.0, 7.9), point(16, 16.0, 15.8, saturated=True)])
    assert fig is not None and list(fig.data[1].x) == [16]  # marked by the sweep


def test_plot_defects_single_run_pareto_and_axes(tmp_path: Path) -> None:
    from bench_llm.analysis.report.data import LoadPoint, RunView
    from bench_llm.analysis.report.figures import engine_state, latency_cdfs, latency_vs_throughput

    one = LoadPoint("run", "r", 1, 4.0, "rate", 4.0, 1, {"output_tokens_per_s": 100.0, "tpot_p50_ms": 10.0, "ttft_p95_ms": 50.0})
    assert latency_vs_throughput([one]) is None  # no one-dot Pareto plot
    view = RunView("r", "r", "p", {}, {}, "", 1, None, None)
    view.server = {"gauges": {"waiting": {"t_s": [0.0, 1.0], "v": [0.0, 0.0]}, "kv_cache_usage": {"t_s": [0.0, 1.0], "v": [0.0006, 0.0006]}}}
    fig = engine_state(view)
    assert fig is not None
    assert list(fig.layout.yaxis.range) == [0, 1.08] and fig.layout.yaxis.dtick == 1  # idle queue: 0-1 in whole requests, not -1..1
    assert fig.layout.yaxis2.tickformat == ".0%" and list(fig.layout.yaxis2.range) == [0, 1.02]  # KV share, not 600µ
    view.cdfs = {"TTFT": {"x": [1.0, 2.0, 3.0], "p": [0.0, 0.5, 1.0], "marks": {"p50": 2.0, "p95": 2.9, "p99": 3.0}}}
    cdf = latency_cdfs(view)
    assert cdf is not None
    marks = [t for t in cdf.data if t.mode == "markers+text"]
    assert marks and all(t.cliponaxis is False and t.textposition == "middle left" for t in marks)  # p99 label not clipped
