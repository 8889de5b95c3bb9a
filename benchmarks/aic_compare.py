"""bench's simulator beside NVIDIA AIConfigurator on the measured H200 rows (issue 35), per (backend, model, mode).

Two steps, because AIConfigurator lives in its own scratch virtualenv outside the repository (never
installed into bench's, never committed):

1. ``/tmp/aic/bin/python benchmarks/aic_compare.py estimate OUT.json [--rows CSV] [--limit N]``: with
   aiconfigurator importable, its estimate (``aiconfigurator.cli.api.cli_estimate``, the ``estimate``
   CLI's engine) of every row whose model it bundles, at the row's layout, lengths and batch size. Names
   it does not bundle map to the bundled Meta-Llama ones (Llama-3.1-8B-Instruct[-FP8] ->
   meta-llama/Meta-Llama-3.1-8B, Llama-3.1-70B -> meta-llama/Meta-Llama-3.1-70B); the row's engine
   version is not asked for: the package bundles one ("current") database per backend and GPU, which is
   used for every row. A row it refuses is recorded with its error.
2. ``.venv/bin/python benchmarks/aic_compare.py compare OUT.json``: bench's figures for the rows
   AIConfigurator estimated (``sim.silicon.score`` on those rows) beside its, per group: TTFT and TPOT
   within ±20 % and median |error| for each, and how many of the group's rows were estimated.

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


def estimate(out: Path, rows: Path, limit: int | None) -> int:
    try:
        from aiconfigurator.cli.api import cli_estimate  # type: ignore[import-not-found]
    except ImportError:
        print("aiconfigurator is not installed here: skipped (pip install aiconfigurator in a scratch venv)")
        return 0
    logging.disable(logging.WARNING)
    with rows.open(newline="") as f:
        todo = [r for r in csv.DictReader(f) if _aic_model(r["model_path"]) and r["backend"] in ("vllm", "sglang",
                                                                                                "trtllm")]
    todo = _round_robin(todo)
    done: dict[str, dict[str, object]] = json.loads(out.read_text()) if out.is_file() else {}
    seen: dict[str, dict[str, object]] = {}  # the same arguments are estimated once
    for r in todo[:limit]:
        if r["id"] in done:
            continue
        kw = _kwargs(r)
        key = json.dumps(kw, sort_keys=True)
        if key not in seen:
            try:
                res = cli_estimate(**kw)
                seen[key] = {"ttft_ms": float(res.ttft), "tpot_ms": float(res.tpot),
                             "version": str(res.backend_version)}
            except Exception as e:  # noqa: BLE001 - a refused row is recorded, not fatal
                seen[key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        done[r["id"]] = seen[key]
        out.write_text(json.dumps(done, indent=0, sort_keys=True))
    print(f"{len(done)} rows estimated into {out} "
          f"({sum(1 for v in done.values() if 'error' in v)} refused)")
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


def compare(aic_json: Path, rows: Path | None) -> int:
    """Both estimators on the rows AIConfigurator estimated (bench is run on those rows only)."""
    from bench_llm.sim import silicon

    path = rows or silicon.default_path()
    if path is None:
        print(f"no H200 silicon rows (set ${silicon.ENV}): skipped")
        return 0
    aic = {k: v for k, v in json.loads(aic_json.read_text()).items() if "ttft_ms" in v}
    points = silicon.load(path)
    every: dict[str, int] = {}
    for p in points:
        every[p.group] = every.get(p.group, 0) + 1
    scored = silicon.score([p for p in points if p.id in aic])
    groups: dict[str, list[tuple[float, float, float, float]]] = {}
    for s in scored:
        a = aic[s.point.id]
        groups.setdefault(s.point.group, []).append(
            (*s.ratios, float(a["ttft_ms"]) / s.point.ttft_ms, float(a["tpot_ms"]) / s.point.tpot_ms))
    print(f"H200 rows ({path}) that AIConfigurator estimated ({aic_json}); cells: within ±20 % / rows, median |error|")
    print(f"{'group':<28} {'rows':>9} {'bench TTFT':>14} {'AIC TTFT':>14} {'bench TPOT':>14} {'AIC TPOT':>14}")
    total: list[tuple[float, float, float, float]] = []
    for name in [*sorted(every), "all"]:
        g = total if name == "all" else groups.get(name, [])
        if name != "all":
            total += g
        n = sum(every.values()) if name == "all" else every[name]
        print(f"{name:<28} {len(g):>4}/{n:<4} {_cell([x[0] for x in g])} {_cell([x[2] for x in g])} "
              f"{_cell([x[1] for x in g])} {_cell([x[3] for x in g])}")
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
        return estimate(Path(argv[1]), rows, limit)
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
