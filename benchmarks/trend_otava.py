"""bench trend's change points against Apache Otava's, on the same series (issue 38).

Usage::

    python benchmarks/trend_otava.py [--otava-venv DIR] [--make-otava-venv] [--reps 20] [--noise 0.02]
                                     [--sweep]

Series (one point per nightly commit, level 10, noise ``--noise`` relative, drawn twice: Gaussian
and Student-t with 4 degrees of freedom, whose outliers are what nightly runs on a shared host
show):

* ``revert5``: 30 nights, +10 % on nights 16-20, fixed on night 21 (2 edges);
* ``bump10``: 30 nights, +10 % on nights 11-20 (2 edges);
* ``steps19``: 300 nights, the 30-night store copied 10 times: +10 % on nights 21-30 of each
  copy (19 edges);
* ``store30``: the basic nightly scenario, TTFT +5 % from night 11 and TPOT +10 % from night
  21 (one edge each), and one night 30 % worse in both (not an edge);
* ``noise``: 200 series of 30 nights without any change (every change point is a false alarm),
  and 50 of 300 nights.

A found change point is a hit when within one commit of a true edge (``exact``: at it), else a
false alarm. bench: ``analysis.changepoint.e_divisive`` at its defaults. Otava:
``otava.analysis.compute_change_points`` (window 50, min magnitude 0, its default
``max_pvalue`` 0.001, and at the p that gives it as few false alarms as bench), run in its own
virtual environment (``--otava-venv``; ``--make-otava-venv`` creates it with pip: Otava is
never a dependency of bench). ``--sweep`` adds bench's false-alarm cost of each ``p_max``
(docs/reporting.md's table).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench_llm.analysis.changepoint import P_MAX, e_divisive

_OTAVA_RUNNER = """
import json, sys
from otava.analysis import compute_change_points
job = json.load(sys.stdin)
out = []
for z in job["series"]:
    cps, _ = compute_change_points([float(v) for v in z], window_len=50, max_pvalue=job["p"], min_magnitude=0.0)
    out.append([int(c.index) for c in cps])
json.dump(out, sys.stdout)
"""


def _noise(rng: np.random.Generator, n: int, kind: str, level: float) -> np.ndarray:
    draw = rng.standard_t(4, n) if kind == "t4" else rng.standard_normal(n)
    return 10.0 * (1 + level * draw)


def scenarios(seed: int, kind: str, level: float, reps: int) -> dict[str, list[tuple[np.ndarray, list[int]]]]:
    """name -> [(series, true edges)]"""
    rng = np.random.default_rng(seed)
    out: dict[str, list[tuple[np.ndarray, list[int]]]] = {k: [] for k in ("revert5", "bump10", "steps19", "store30")}
    for _ in range(reps):
        z = _noise(rng, 30, kind, level)
        z[15:20] *= 1.10
        out["revert5"].append((z, [15, 20]))
        z = _noise(rng, 30, kind, level)
        z[10:20] *= 1.10
        out["bump10"].append((z, [10, 20]))
        z = _noise(rng, 300, kind, level)
        truth = []
        for c in range(10):
            z[30 * c + 20 : 30 * c + 30] *= 1.10
            truth += [30 * c + 20] + ([30 * c + 30] if c < 9 else [])
        out["steps19"].append((z, truth))
        for at, shift in ((10, 0.05), (20, 0.10)):  # TTFT, TPOT of the 30-night store
            z = _noise(rng, 30, kind, level)
            z[at:] *= 1 + shift
            z[25] *= 1.30  # a lone bad night
            out["store30"].append((z, [at]))
    out["noise30"] = [(_noise(rng, 30, kind, level), []) for _ in range(200)]
    out["noise300"] = [(_noise(rng, 300, kind, level), []) for _ in range(50)]
    return out


def score(found: list[list[int]], cases: list[tuple[np.ndarray, list[int]]]) -> dict[str, int]:
    s = {"edges": 0, "hit": 0, "exact": 0, "false": 0}
    for idx, (_, truth) in zip(found, cases):
        s["edges"] += len(truth)
        s["hit"] += sum(any(abs(i - t) <= 1 for i in idx) for t in truth)
        s["exact"] += sum(t in idx for t in truth)
        s["false"] += sum(all(abs(i - t) > 1 for t in truth) for i in idx)
    return s


def bench_detector(p_max: float = P_MAX) -> Callable[[list[np.ndarray]], list[list[int]]]:
    return lambda series: [[c.index for c in e_divisive(z, p_max)] for z in series]


def otava_detector(python: Path, p: float) -> Callable[[list[np.ndarray]], list[list[int]]]:
    def run(series: list[np.ndarray]) -> list[list[int]]:
        job = json.dumps({"p": p, "series": [z.tolist() for z in series]})
        out = subprocess.run([str(python), "-c", _OTAVA_RUNNER], input=job, capture_output=True, text=True, check=True, timeout=600)
        return json.loads(out.stdout)

    return run


def culprit(kind: str, level: float, reps: int, otava: Path | None) -> None:
    """Replay nightly: each series cut after each night from the change on; the first night a
    change point within 3 commits of the true one is reported, and what it names: the right
    commit, an uncertain span holding it (bench only), or a wrong commit / a span without it."""
    print(f"\nfirst night reported ({kind} noise {100 * level:g} %, {reps} series each): nights after the change (median), "
          "right commit / uncertain span with the right one / WRONG")  # fmt: skip
    rng = np.random.default_rng(7)
    for shift, at in ((0.10, 20), (0.05, 10)):
        series = []
        for _ in range(reps):
            z = _noise(rng, 30, kind, level)
            z[at:] *= 1 + shift
            series.append(z)
        prefixes = [z[:night] for z in series for night in range(at + 1, 31)]
        per = 30 - at
        rows = {"bench": [[(c.index, c.span) for c in e_divisive(p)] for p in prefixes]}
        if otava is not None:
            rows["otava 0.001"] = [[(i, (i, i)) for i in idx] for idx in otava_detector(otava, 0.001)(prefixes)]
        for name, found in rows.items():
            nights, right, span, wrong, never = [], 0, 0, 0, 0
            for k in range(reps):
                for j in range(per):
                    near = [(i, sp) for i, sp in found[k * per + j] if abs(i - at) <= 3]
                    if near:
                        i, (lo, hi) = near[0]
                        nights.append(j + 1)
                        if lo == hi:
                            right += i == at
                            wrong += i != at
                        else:
                            span += lo <= at <= hi
                            wrong += not lo <= at <= hi
                        break
                else:
                    never += 1
            med = f"{np.median(nights):.0f}" if nights else "-"
            print(f"  +{100 * shift:g} % at night {at + 1}, {name:<12}: {med} nights; {right} / {span} / {wrong}; never reported {never}")


def make_venv(where: Path) -> Path:
    """A scratch virtual environment with Otava (its analysis needs only numpy and scipy; the
    rest of its dependencies serve its data sources and are not installed)."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    pip = where / "bin" / "pip"
    subprocess.run([str(pip), "install", "-q", "--no-deps", "apache-otava==0.8.0"], check=True)
    subprocess.run([str(pip), "install", "-q", "numpy", "scipy"], check=True)
    return where / "bin" / "python"


def table(name: str, runs: dict[str, Callable[[list[np.ndarray]], list[list[int]]]], cases: dict[str, list[tuple[np.ndarray, list[int]]]]) -> None:
    print(f"\n{name}")
    print(f"{'method':<28} {'revert5':>16} {'bump10':>16} {'steps19':>18} {'store30':>16} {'false/200x30':>13} {'false/50x300':>13} {'s':>6}")
    for label, detect in runs.items():
        t0 = time.perf_counter()
        cells = []
        for key in ("revert5", "bump10", "steps19", "store30"):
            s = score(detect([z for z, _ in cases[key]]), cases[key])
            cells.append(f"{s['hit']}/{s['edges']} ({s['exact']}) +{s['false']}")
        f30 = score(detect([z for z, _ in cases["noise30"]]), cases["noise30"])["false"]
        f300 = score(detect([z for z, _ in cases["noise300"]]), cases["noise300"])["false"]
        print(f"{label:<28} {cells[0]:>16} {cells[1]:>16} {cells[2]:>18} {cells[3]:>16} {f30:>13} {f300:>13} {time.perf_counter() - t0:>6.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--otava-venv", type=Path, help="a virtual environment with apache-otava installed")
    ap.add_argument("--make-otava-venv", action="store_true", help="create --otava-venv (default /tmp/otava-venv) with pip first")
    ap.add_argument("--reps", type=int, default=20, help="series per scenario")
    ap.add_argument("--noise", type=float, default=0.02, help="relative noise of a nightly value")
    ap.add_argument("--sweep", action="store_true", help="also bench at other p_max (false-alarm cost)")
    args = ap.parse_args()
    python = None
    if args.make_otava_venv:
        python = make_venv(args.otava_venv or Path("/tmp/otava-venv"))
    elif args.otava_venv:
        python = args.otava_venv / "bin" / "python"
    print("cells: edges found within one commit / true edges (exactly at the commit) +false change points")
    for kind in ("normal", "t4"):
        cases = scenarios(1, kind, args.noise, args.reps)
        runs: dict[str, Callable[[list[np.ndarray]], list[list[int]]]] = {f"bench p_max={P_MAX:g} (default)": bench_detector()}
        if args.sweep:
            runs.update({f"bench p_max={p:g}": bench_detector(p) for p in (1e-5, 3e-5, 3e-4, 1e-3, 1e-2) if p != P_MAX})
        if python is not None:
            runs.update({f"otava max_pvalue={p:g}": otava_detector(python, p) for p in (0.001, 1e-4, 1e-5)})
        elif not args.sweep:
            print("(Otava not run: pass --otava-venv DIR or --make-otava-venv)")
        table(f"noise: {kind}, {100 * args.noise:g} %", runs, cases)
        culprit(kind, args.noise, 2 * args.reps, python)


if __name__ == "__main__":
    main()
