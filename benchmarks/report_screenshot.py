"""A PNG of the first screen of a sweep report, as a user opening it on a laptop sees it.

Usage::

    python benchmarks/report_screenshot.py OUT.png [--report REPORT.html | --sweep SWEEP_DIR]
                                           [--width 1280] [--height 800]

Without ``--report``/``--sweep`` it first runs the README's main job (a capacity sweep of
Llama-3.1-70B over TP/DP on 4 simulated H100s, in virtual time: a minute or two) into a
temporary folder and builds its report. Headless Chromium (``/usr/bin/chromium``, or
``BENCH_CHROMIUM``), driven over the DevTools protocol (bench/browser.py), loads the page at
the given viewport, waits until the load event and a few seconds more for plotly to draw,
then captures the viewport; the script prints the PNG's path and size and any console error.
(Chromium's own ``--screenshot`` flag captured a blank page here: it does not wait for a
4 MB report to finish loading on a busy host.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_llm.bench.browser import load_page  # noqa: E402
from benchmarks.virtual_time import MAIN_JOB  # noqa: E402  (the README's main job)

CHROMIUM = os.environ.get("BENCH_CHROMIUM", "/usr/bin/chromium")



def _bench(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "bench_llm.bench", *args], cwd=REPO, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"bench {' '.join(args[:2])} failed ({r.returncode}): {r.stderr[-2000:]}")


#: Where the report's headline is (analysis/report/headline.py ids), to say if it is on screen.
_PROBE = """JSON.stringify((function(){
  function box(id){ var e = document.getElementById(id); if (!e) { return null; }
    var r = e.getBoundingClientRect(); return {text: e.textContent.trim(), bottom: r.bottom}; }
  return {height: window.innerHeight, name: box('headline-name'), capacity: box('headline-capacity'),
          figures: document.body.getAttribute('data-figures-drawn')};
})())"""


def screenshot(report: Path, out: Path, width: int, height: int, profile: Path, settle_s: float) -> dict[str, Any]:
    errors, probe = asyncio.run(
        load_page(CHROMIUM, report.resolve().as_uri(), profile, _PROBE, settle_s=settle_s, timeout_s=300,
                  screenshot=out, viewport=(width, height))
    )  # fmt: skip
    for e in errors:
        print(f"page error: {e}")
    return probe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="the PNG to write")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--report", type=Path, help="an existing report (HTML)")
    src.add_argument("--sweep", type=Path, help="an existing sweep (or run) folder: its report is built first")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=800)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds to wait after the load event for plotly to draw")
    args = ap.parse_args()
    if not (Path(CHROMIUM).exists() and os.access(CHROMIUM, os.X_OK)):
        raise SystemExit(f"{CHROMIUM} not found (Debian: apt-get install -y chromium; or set BENCH_CHROMIUM)")
    with tempfile.TemporaryDirectory(prefix="bench-shot-") as tmp:
        report = args.report
        if report is None:
            sweep = args.sweep
            if sweep is None:
                sweep = Path(tmp) / "sweep"
                print("running the README's main job (simulated engine, virtual time) ...", flush=True)
                _bench(*MAIN_JOB, "--out", str(sweep))
            report = Path(tmp) / "report.html"
            _bench("report", str(sweep), "--out", str(report))
        profile = Path(tmp) / "chromium-profile"
        profile.mkdir()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        probe = screenshot(report, args.out, args.width, args.height, profile, args.settle)
    print(f"{args.out} ({args.out.stat().st_size:,} bytes, {args.width}x{args.height})")
    for key in ("name", "capacity"):
        item = probe.get(key)
        where = "not found" if item is None else (f"{item['text']!r}, " + ("in" if item["bottom"] <= probe["height"] else "below") + " the first screen")
        print(f"  headline {key}: {where}")
    print(f"  figures drawn: {probe.get('figures')}")


if __name__ == "__main__":
    main()
