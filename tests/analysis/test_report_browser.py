"""The report opens in headless Chromium with no console errors and every figure drawn.

Chromium is driven over the DevTools protocol (a small client on aiohttp websockets): console
errors, uncaught exceptions and log errors are collected while the page loads, then the page
is asked how many plotly figures exist and whether each drew its SVG and traces.
Skips, saying why, where /usr/bin/chromium (Debian package `chromium`) is absent.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench_llm.analysis.report import build_report
from bench_llm.bench.browser import VIEWPORT, load_page
from tests.analysis.test_report_fixtures import make_sweep, real_run

CHROMIUM = os.environ.get("BENCH_CHROMIUM", "/usr/bin/chromium")

_PROBE = """JSON.stringify({
  expected: document.body.getAttribute('data-figures-expected'),
  drawn: document.body.getAttribute('data-figures-drawn'),
  xss: typeof window.__xss !== 'undefined',
  plots: Array.from(document.querySelectorAll('div.fig')).map(function(d){ return {
    id: d.id,
    plotly: d.classList.contains('js-plotly-plot'),
    svg: d.querySelectorAll('svg.main-svg').length,
    traces: d.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length,
    height: d.getBoundingClientRect().height
  };})
})"""


def _need_chromium() -> None:
    if not (Path(CHROMIUM).exists() and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"{CHROMIUM} not installed (Debian: apt-get install -y chromium); the browser check needs it")


_FIRST_SCREEN = """JSON.stringify((function(){
  function box(id){ var e = document.getElementById(id); if (!e) { return null; }
    var r = e.getBoundingClientRect(); return {text: e.textContent.trim(), top: r.top, bottom: r.bottom, left: r.left, right: r.right}; }
  return {height: window.innerHeight, width: window.innerWidth, name: box('headline-name'), capacity: box('headline-capacity')};
})())"""


async def _cdp_load(
    url: str, profile: Path, settle_s: float = 1.5, timeout_s: float = 60.0, probe: str = _PROBE, screenshot: Path | None = None
) -> tuple[list[str], dict[str, Any]]:
    return await load_page(CHROMIUM, url, profile, probe, settle_s, timeout_s, screenshot, VIEWPORT)


def _check_in_browser(html_path: Path, tmp_path: Path) -> dict[str, Any]:
    _need_chromium()
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    errors, probe = asyncio.run(_cdp_load(html_path.resolve().as_uri(), profile))
    assert errors == [], errors
    assert not probe["xss"], "model text was executed as HTML"
    n = int(probe["expected"])
    assert n > 0 and int(probe["drawn"]) == n, probe
    assert len(probe["plots"]) == n
    for p in probe["plots"]:
        assert p["plotly"] and p["svg"] >= 1 and p["traces"] >= 1 and p["height"] > 100, p
    return probe


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report_browser")
    run = real_run(root / "run")
    return make_sweep(run, root / "sweep")


def test_sweep_report_draws_every_figure_without_console_errors(sweep_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    info = build_report(sweep_dir, out)
    probe = _check_in_browser(out, tmp_path)
    ids = " ".join(p["id"] for p in probe["plots"])
    for kind in ("latency-throughput", "goodput-load", "achieved-offered", "cdf", "load-time", "ttft-split", "engine-state", "timeline"):
        assert kind in ids, f"{kind} figure missing: {ids}"
    assert info.figures == len(probe["plots"])


def test_single_run_report_in_browser(sweep_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "one.html"
    build_report(sweep_dir / "cell=tp1" / "load=rate-4", out)  # no server metrics in this one
    probe = _check_in_browser(out, tmp_path)
    ids = " ".join(p["id"] for p in probe["plots"])
    assert "cdf" in ids and "timeline" in ids and "ttft-split" not in ids
    assert "no server metrics" in out.read_text()


def test_first_screen_names_the_configuration_and_its_capacity(sweep_dir: Path, tmp_path: Path) -> None:
    """In a 1280x800 viewport, before any scrolling, the recommended configuration's name and
    its capacity per GPU are on screen. BENCH_REPORT_SCREENSHOT=FILE keeps the screenshot."""
    _need_chromium()
    out = tmp_path / "report.html"
    build_report(sweep_dir, out)
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    shot = tmp_path / "first-screen.png"
    errors, probe = asyncio.run(_cdp_load(out.resolve().as_uri(), profile, probe=_FIRST_SCREEN, screenshot=shot))
    assert errors == [], errors
    assert probe["name"] is not None and probe["capacity"] is not None, probe
    assert probe["name"]["text"] == "tp2"
    assert probe["capacity"]["text"] == "3.95"
    for item in (probe["name"], probe["capacity"]):
        assert 0 <= item["top"] and item["bottom"] <= probe["height"], probe
        assert 0 <= item["left"] and item["right"] <= probe["width"], probe
    assert shot.stat().st_size > 10_000  # a real rendering, not a blank page
    keep = os.environ.get("BENCH_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
