"""bench's simulator beside NVIDIA AIConfigurator on the measured H200 rows (issue 35), per (backend, model, mode).

Two steps, because AIConfigurator lives in its own scratch virtualenv outside the repository (never
installed into bench's, never committed):

1. ``/tmp/aic/bin/python benchmarks/aic_compare.py estimate OUT.json [--rows CSV] [--limit N]
   [--cache DIR] [--timeout S]``: with aiconfigurator importable, its estimate
   (``aiconfigurator.cli.api.cli_estimate``, the ``estimate`` CLI's engine) of every row whose model it
   bundles, at the row's layout, lengths and batch size. Names it does not bundle map to the bundled
   Meta-Llama ones (Llama-3.1-8B-Instruct[-FP8] -> meta-llama/Meta-Llama-3.1-8B, Llama-3.1-70B ->
   meta-llama/Meta-Llama-3.1-70B). The row's engine version is asked for first; where the package refuses
   it (it answers only for its queryable slots, current/previous/next) the ``current`` database of that
   backend on h200_sxm is used, and the result records both. A row it refuses otherwise is recorded with
   its error. Resumable and incremental: each distinct set of arguments is estimated once and appended to
   ``DIR/estimates.jsonl`` (default /tmp/aic-cache, outside the repository) the moment it is done; a rerun
   reads it back and estimates only what is missing. Each estimate is bounded (``--timeout``, default
   120 s of wall time, by SIGALRM in the one process) and recorded as refused ("timeout") past it.
2. ``.venv/bin/python benchmarks/aic_compare.py compare OUT.json``: bench's figures for the rows
   AIConfigurator estimated (``sim.silicon.score`` on those rows) beside its, per group: TTFT and TPOT
   within ±20 % and median |error| for each, how many of the group's rows were estimated, and the refused
   ones counted by reason.

Without aiconfigurator, ``estimate`` says so and exits 0 (a skip, not a failure); ``compare`` needs only
bench and the JSON. The rows' file is found as ``sim.silicon.default_path`` finds it (or ``--rows``).
"""

from __future__ import annotations

import csv
import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

#: the rows' model names -> the bundled model AIConfigurator is asked about
AIC_MODEL = (("Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B"), ("Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B"),
             ("DeepSeek-V3", "deepseek-ai/DeepSeek-V3"), ("DeepSeek-R1", "deepseek-ai/DeepSeek-R1"))


def _aic_model(path: str) -> str | None:
    return next((m for needle, m in AIC_MODEL if needle in path), None)


def _i(s: str | None) -> int | None:
    return int(s) if s and s.strip() else None


def _kwargs(r: dict[str, str]) -> dict[str, object]:
    """The row as ``cli_estimate`` arguments (its layout, lengths, batch size and quantisation)."""
    kw: dict[str, object] = dict(
        model_path=_aic_model(r["model_path"]), system_name="h200_sxm", mode=r["mode"], backend_name=r["backend"],
        isl=int(r["isl"]), osl=int(r["osl"]), gemm_quant_mode=r["gemm_quant_mode"] or None,
    )
    if r["moe_quant_mode"].strip():
        kw["moe_quant_mode"] = r["moe_quant_mode"]
    if r["mode"] == "agg":
        kw.update(batch_size=_i(r["batch_size"]), tp_size=_i(r["tp_size"]) or 1, pp_size=_i(r["pp_size"]) or 1,
                  attention_dp_size=_i(r["attention_dp_size"]) or 1, moe_tp_size=_i(r["moe_tp_size"]),
                  moe_ep_size=_i(r["moe_ep_size"]))
    else:
        for pool in ("prefill", "decode"):
            for f in ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size", "batch_size",
                      "num_workers"):
                kw[f"{pool}_{f}"] = _i(r[f"{pool}_{f}"])
    return {k: v for k, v in kw.items() if v is not None}


#: where per-row estimates are cached (outside the repository): one JSON line per distinct set of arguments
DEFAULT_CACHE = Path("/tmp/aic-cache")
#: seconds one estimate may take before it is recorded as refused ("timeout") and the run moves on
DEFAULT_TIMEOUT_S = 120.0


class _Timeout(Exception):
    pass


def _bounded(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()`` stopped after ``seconds`` of wall time (SIGALRM in this one process: no worker process)."""
    import signal

    def _alarm(_sig: int, _frame: object) -> None:
        raise _Timeout(f"no estimate within {seconds:g} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _version_refused(e: Exception) -> bool:
    """AIConfigurator refuses a raw engine version outside its queryable slots (current/previous/next)."""
    return isinstance(e, ValueError) and "version" in str(e) and ("slot" in str(e) or "not supported" in str(e))


def _estimate_one(cli_estimate: Callable[..., Any], kw: dict[str, object], version: str,
                  timeout_s: float) -> dict[str, object]:
    """One row's estimate: at the row's engine version, else (refused) at the package's ``current`` database."""
    asked = version or "current"
    for ver in ([asked, "current"] if asked != "current" else ["current"]):
        try:
            res = _bounded(lambda v=ver: cli_estimate(**kw, backend_version=v), timeout_s)
            return {"ttft_ms": float(res.ttft), "tpot_ms": float(res.tpot), "version": str(res.backend_version),
                    "asked": asked}
        except _Timeout as e:
            return {"error": f"timeout: {e}", "asked": asked}
        except Exception as e:  # noqa: BLE001 - a refused row is recorded, not fatal
            if ver != "current" and _version_refused(e):
                continue
            return {"error": f"{type(e).__name__}: {str(e)[:300]}", "asked": asked, "version": ver}
    raise AssertionError("unreachable")


def estimate(out: Path, rows: Path, limit: int | None, cache_dir: Path = DEFAULT_CACHE,
             timeout_s: float = DEFAULT_TIMEOUT_S, cli_estimate: Callable[..., Any] | None = None) -> int:
    """Every row's estimate into ``out`` (row id -> result), resumable: each distinct set of arguments is
    estimated once and appended to ``cache_dir/estimates.jsonl`` as soon as it is done, so a stopped run
    (or another row with the same arguments) picks it up again. ``cli_estimate``: AIConfigurator's (imported
    here when not given)."""
    if cli_estimate is None:
        try:
            from aiconfigurator.cli.api import cli_estimate  # type: ignore[import-not-found]
        except ImportError:
            print("aiconfigurator is not installed here: skipped (pip install aiconfigurator in a scratch venv)")
            return 0
    logging.disable(logging.WARNING)
    with rows.open(newline="") as f:
        todo = [r for r in csv.DictReader(f) if _aic_model(r["model_path"]) and r["backend"] in ("vllm", "sglang",
                                                                                                "trtllm")]
    todo = _round_robin(todo)[:limit]
    cache_dir.mkdir(parents=True, exist_ok=True)
    cache_file = cache_dir / "estimates.jsonl"
    cache: dict[str, dict[str, object]] = {}
    if cache_file.is_file():
        for line in cache_file.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                cache[entry["key"]] = entry["result"]
    done: dict[str, dict[str, object]] = {}
    for i, r in enumerate(todo):
        kw = _kwargs(r)
        key = json.dumps({**kw, "version": r["backend_version"]}, sort_keys=True)
        if key not in cache:
            cache[key] = _estimate_one(cli_estimate, kw, r["backend_version"], timeout_s)
            with cache_file.open("a") as f:
                f.write(json.dumps({"key": key, "result": cache[key]}) + "\n")
            print(f"{i + 1}/{len(todo)} {r['id']} {cache[key]}", flush=True)
        done[r["id"]] = cache[key]
        if i % 20 == 19 or i == len(todo) - 1:
            out.write_text(json.dumps(done, indent=0, sort_keys=True))
    out.write_text(json.dumps(done, indent=0, sort_keys=True))
    print(f"{len(done)} rows into {out} ({sum(1 for v in done.values() if 'error' in v)} refused; "
          f"cache {cache_file})")
    return 0


def _round_robin(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows one group (backend, model, mode) at a time in turn, so a partial run (``--limit``, or one
    stopped early: the JSON is written after every row and a rerun resumes) covers every group."""
    groups: dict[tuple[str, str, str], list[dict[str, str]]] = {}
    for r in rows:
        groups.setdefault((r["backend"], str(_aic_model(r["model_path"])), r["mode"]), []).append(r)
    queues = list(groups.values())
    out: list[dict[str, str]] = []
    for i in range(max((len(q) for q in queues), default=0)):
        out += [q[i] for q in queues if i < len(q)]
    return out


def _within(ratios: list[float]) -> int:
    return sum(1 for x in ratios if abs(x - 1) <= 0.2)


def _cell(ratios: list[float]) -> str:
    if not ratios:
        return f"{'-':>14}"
    return f"{_within(ratios):>3}/{len(ratios):<3} {statistics.median(abs(x - 1) for x in ratios):>6.0%}"


#: refusal messages -> the short reason the table counts (first match; anything else: its exception type)
REASONS = (("prefill_batch_size is required", "no prefill batch size (P/D row)"),
           ("does not fit in GPU memory", "does not fit (batch KV at C)"), ("timeout", "timeout"),
           ("version", "engine version"))


def _reason(error: str) -> str:
    return next((short for needle, short in REASONS if needle in error), error.split(":")[0])


def compare(aic_json: Path, rows: Path | None) -> int:
    """Both estimators on the rows AIConfigurator estimated (bench is run on those rows only); per group, how
    many rows it estimated and refused, and why."""
    from bench_llm.sim import silicon

    path = rows or silicon.default_path()
    if path is None:
        print(f"no H200 silicon rows (set ${silicon.ENV}): skipped")
        return 0
    results = json.loads(aic_json.read_text())
    aic = {k: v for k, v in results.items() if "ttft_ms" in v}
    points = silicon.load(path)
    every: dict[str, int] = {}
    refused: dict[str, dict[str, int]] = {}
    for p in points:
        every[p.group] = every.get(p.group, 0) + 1
        if p.id in results and "error" in results[p.id]:
            why = refused.setdefault(p.group, {})
            reason = _reason(str(results[p.id]["error"]))
            why[reason] = why.get(reason, 0) + 1
    scored = silicon.score([p for p in points if p.id in aic])
    groups: dict[str, list[tuple[float, float, float, float]]] = {}
    for s in scored:
        a = aic[s.point.id]
        groups.setdefault(s.point.group, []).append(
            (*s.ratios, float(a["ttft_ms"]) / s.point.ttft_ms, float(a["tpot_ms"]) / s.point.tpot_ms))
    asked = sum(1 for p in points if p.id in results)
    print(f"H200 rows ({path}): {asked} of {len(points)} asked of AIConfigurator ({aic_json}), {len(aic)} estimated; "
          "cells: within ±20 % / rows, median |error|")
    print(f"{'group':<28} {'est/rows':>9} {'bench TTFT':>14} {'AIC TTFT':>14} {'bench TPOT':>14} {'AIC TPOT':>14}  refused")
    total: list[tuple[float, float, float, float]] = []
    all_refused: dict[str, int] = {}
    for name in [*sorted(every), "all"]:
        g = total if name == "all" else groups.get(name, [])
        if name != "all":
            total += g
            for reason, n in refused.get(name, {}).items():
                all_refused[reason] = all_refused.get(reason, 0) + n
        why = all_refused if name == "all" else refused.get(name, {})
        n = sum(every.values()) if name == "all" else every[name]
        print(f"{name:<28} {len(g):>4}/{n:<4} {_cell([x[0] for x in g])} {_cell([x[2] for x in g])} "
              f"{_cell([x[1] for x in g])} {_cell([x[3] for x in g])}  "
              + ", ".join(f"{k} {v}" for k, v in sorted(why.items())))
    both_b = _within([x[0] for x in total]) + _within([x[1] for x in total])
    both_a = _within([x[2] for x in total]) + _within([x[3] for x in total])
    print(f"figures within ±20 % on these {len(total)} rows: bench {both_b} of {2 * len(total)}, "
          f"AIConfigurator {both_a} of {2 * len(total)}")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("estimate", "compare"):
        print(__doc__)
        return 2
    rows = Path(argv[argv.index("--rows") + 1]) if "--rows" in argv else None
    if argv[0] == "estimate":
        if rows is None:
            found = _default_rows()
            if found is None:
                print("no H200 silicon rows: skipped")
                return 0
            rows = found
        limit = int(argv[argv.index("--limit") + 1]) if "--limit" in argv else None
        cache = Path(argv[argv.index("--cache") + 1]) if "--cache" in argv else DEFAULT_CACHE
        timeout_s = float(argv[argv.index("--timeout") + 1]) if "--timeout" in argv else DEFAULT_TIMEOUT_S
        return estimate(Path(argv[1]), rows, limit, cache, timeout_s)
    return compare(Path(argv[1]), rows)


def _default_rows() -> Path | None:
    """``sim.silicon.default_path``'s search without importing bench (the scratch venv lacks it)."""
    import os

    env = os.environ.get("BENCH_SILICON_ROWS")
    if env:
        return Path(env)
    rel = Path("shared") / "reference" / "silicon" / "h200_silicon.csv"
    here = Path(__file__).resolve().parent
    for base in (*here.parents[:4], Path.cwd(), *Path.cwd().parents[:3]):
        if (base / rel).is_file():
            return base / rel
    return None


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
