"""The simulator against measured serving points on H200 GPUs (NVIDIA AIConfigurator's silicon rows).

The rows live outside the repository (``../shared/reference/silicon/h200_silicon.csv``, with a
README saying how they were measured); nothing of them is copied here. Each row is one deployment
point: an engine (vLLM, SGLang, TRT-LLM), a model, a parallel layout (aggregated, or prefill and
decode pools), fixed input/output lengths and a closed-loop concurrency C, with the client's mean
TTFT and mean TPOT. ``score`` runs every row the simulator has a model preset for (Llama-3.1-8B/70B,
DeepSeek-V3/R1) in virtual time and compares both figures.

How a row is run (``simulate``): the load is the one the measuring client sent, driven by the
same virtual-time client bench's own ``--concurrency`` runs use (``sim.virtual.run``): all C
streams start together, and each sends its next request the instant its last one ended. AIPerf
sent 20 requests per stream after a warm-up; here each stream sends ``WAVES`` and the first
(synchronised) wave counts for 1/20 of the mean, the later ones for the rest: the same weights a
20-request run gives, at a seventh of the cost. The warm-up is left out: with random prompts (no
prefix hits) it changes nothing the measured phase sees, since bench's runner, like AIPerf, starts
the measured phase when the warm-up has ended.

The engine settings each row runs with are ``engine_timing``'s: the engine's profile (its own
serving overhead, admission limit, CUDA-graph limit), FP8 weights, and the KV-cache dtype the
engine uses by default for an FP8 checkpoint (``EngineProfile.kv_dtype_fp8``). The sources give
no launch flags; these are assumptions, listed in docs/simulator.md.
"""

from __future__ import annotations

import csv
import math
import multiprocessing
import os
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench_llm.sim.backend import ModelBackend
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.presets import PROFILES
from bench_llm.sim.virtual import Outcome, Plan, Send, run

#: where the rows are looked for, in order (the first that exists): $BENCH_SILICON_ROWS, then
#: ``shared/reference/silicon/`` in a parent of the repository or of the working directory
ENV = "BENCH_SILICON_ROWS"
_REL = Path("shared") / "reference" / "silicon" / "h200_silicon.csv"
#: requests per stream simulated (the first synchronised, the rest refills); AIPerf sent 20
WAVES = 3
MEASURED_PER_STREAM = 20
#: the prefill workers' per-step prompt tokens beyond the ISL (AIConfigurator's generator rules)
PREFILL_TOKENS_SLACK = 1500
#: Measurement campaigns that ran DeepSeek with multi-token prediction (MTP), as (backend, mode, the day the
#: source says the rows were measured). The source has no MTP column; the inference rests on the rows
#: themselves, not on the model: every TRT-LLM aggregated DeepSeek row measured that day whose configuration
#: (lengths, concurrency, layout) was also measured on 2025-12-15 (15 of its 41 rows) has 1.2-1.9x less TPOT
#: than that measurement, and most have more TTFT (``mtp_evidence``); the next campaign (2026-01-28, two
#: rows) has one row at the earlier TPOT, so it is not taken for MTP. AIConfigurator, whose generated benchmarks measured
#: them, set MTP with one draft token by default for DeepSeek at the time (aiconfigurator sdk/task.py before
#: 2026-06: ``nextn = 1 if ctx.model_family == "DEEPSEEK"``, accept rates [0.85, 0, ...]; its CLI templates
#: ``nextn: 1 # mtp 1`` since 2025-09), which its generator turns into TRT-LLM's ``speculative_config``
#: (decoding_type MTP, num_nextn_predict_layers). Those rows run with MTP_DRAFTS drafts at MTP_ACCEPT.
MTP_CAMPAIGNS = frozenset({("trtllm", "agg", "2026-01-14")})
MTP_DRAFTS = 1
#: AIConfigurator's default acceptance of DeepSeek's first MTP draft token (not fitted here)
MTP_ACCEPT = 0.85
#: the engines the rows name -> the profile that models each
PROFILE_OF = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm"}


def default_path() -> Path | None:
    """The rows' file, or None when it is not on this machine."""
    env = os.environ.get(ENV)
    if env:
        return Path(env)
    here, cwd = Path(__file__).resolve().parent.parent, Path.cwd().resolve()
    # the repository's and the working directory's parents (a git worktree may sit a level deeper)
    for base in (*here.parents[:3], cwd, *cwd.parents[:3]):
        if (base / _REL).is_file():
            return base / _REL
    return None


@dataclass(frozen=True)
class Point:
    """One measured row, as the simulator runs it."""

    id: str
    backend: str  # vllm, sglang, trtllm
    model: str  # model preset
    mode: str  # agg, disagg
    isl: int
    osl: int
    concurrency: int
    tp: int  # attention tensor-parallel degree (per pool: the decode pool's)
    dp: int  # attention data-parallel ranks
    ep: int  # expert-parallel width (1: experts TP-sharded)
    prefill: int  # disagg: prefill instances (0: aggregated)
    decode: int
    #: disagg: the prefill pool's (TP, DP, EP) per instance, when the row gives it (else the decode pool's)
    prefill_layout: tuple[int, int, int] = (0, 0, 0)
    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    #: disagg: running requests per prefill rank (the row's ``prefill_batch_size``; blank: 1, the generator's
    #: default)
    prefill_batch: int = 1
    #: MTP draft tokens per step the row is run with (``MTP_CAMPAIGNS``; 0: none)
    spec_tokens: int = 0
    #: the day the source says the row was measured ("" when it does not; not part of ``key``)
    measured: str = ""

    @property
    def group(self) -> str:
        return f"{self.backend} {self.model} {self.mode}"

    @property
    def key(self) -> tuple[object, ...]:
        """What the simulation depends on (rows with the same key are simulated once)."""
        return (self.backend, self.model, self.mode, self.isl, self.osl, self.concurrency, self.tp, self.dp, self.ep,
                self.prefill, self.decode, self.prefill_layout, self.prefill_batch, self.spec_tokens)


def _int(s: str | None, default: int = 1) -> int:
    return int(s) if s and s.strip() else default


def _model(path: str) -> str | None:
    for needle, preset in (("Llama-3.1-8B", "llama-3.1-8b"), ("Llama-3.1-70B", "llama-3.1-70b"),
                           ("DeepSeek-V3", "deepseek-v3"), ("DeepSeek-R1", "deepseek-v3")):
        if needle in path:
            return preset  # DeepSeek-R1 has DeepSeek-V3's architecture (the same public config)
    return None


def _layout(tp: int, adp: int, moe_tp: int, moe_ep: int) -> tuple[int, int, int]:
    """(attention TP, attention DP, EP) on one 8-GPU node. A few rows label a width of 64 for the
    8 GPUs they ran on (``tp_size`` 64 or ``attention_dp_size`` 64 with MoE TP8 x EP8): capped at 8."""
    world = min(8, max(tp, adp, moe_tp * moe_ep, 1))
    dp = min(max(adp, 1), world)
    return max(1, world // dp), dp, min(moe_ep, world) if moe_ep > 1 else 1


def _figures(r: dict[str, str]) -> tuple[object, ...]:
    """A measurement's identity: the same engine, lengths, concurrency and figures."""
    given = re.search(r"silicon_concurrency=(\d+)", r.get("silicon_data_source", ""))
    return (r["backend"], r["isl"], r["osl"], given.group(1) if given else None,
            round(float(r["silicon_ttft_ms"]), 1), round(float(r["silicon_tpot_ms"]), 2))


def measured_day(r: dict[str, str]) -> str:
    """The day a row was measured, as its source says (``measured=YYYY-MM-DD...``; "" when it does not)."""
    m = re.search(r"measured=(\d{4}-\d\d-\d\d)", r.get("silicon_data_source", ""))
    return m.group(1) if m else ""


def _spec_tokens(model: str, backend: str, mode: str, day: str) -> int:
    """MTP draft tokens of a DeepSeek row's campaign (``MTP_CAMPAIGNS``), else 0."""
    return MTP_DRAFTS if model == "deepseek-v3" and (backend, mode, day) in MTP_CAMPAIGNS else 0


def _deployment(r: dict[str, str]) -> tuple[str, ...]:
    """A disaggregated row's worker counts and decode pool layout (what its concurrency is made of)."""
    return tuple(r[k].strip() for k in ("prefill_num_workers", "decode_num_workers", "decode_batch_size",
                                         "decode_tp_size", "decode_attention_dp_size", "decode_moe_ep_size"))


def load(path: Path) -> list[Point]:
    """The rows of ``path`` whose model has a preset (the others are not scored).

    Some disaggregated rows leave the worker counts (and so the concurrency per decode worker)
    blank; most are the same measurement as a row that gives them (the same engine, lengths,
    concurrency, TTFT and TPOT, under another label): those take that row's counts and pool
    layout. Others were measured at the concurrency of a labelled row (same engine and lengths) whose
    labelled rows all agree on the deployment: they take it (the prefill layout of the first such row).
    The rest run one prefill and one decode instance."""
    with path.open(newline="") as f:
        raw = [r for r in csv.DictReader(f) if _model(r["model_path"]) and r["backend"] in PROFILE_OF]
    labelled = [r for r in raw if r["mode"] == "disagg" and r["decode_num_workers"].strip()]
    known = {_figures(r): r for r in labelled}
    # the same engine, lengths and concurrency: AIConfigurator sets C = decode workers x decode batch (x DP ranks)
    # for the deployment it measures, so a row at a labelled row's C ran that deployment, as long as every
    # labelled row at that C agrees on the decode pool and the prefill worker count (a re-measurement: the
    # README's own rows measured twice)
    by_c: dict[tuple[object, ...], list[dict[str, str]]] = {}
    for r in labelled:
        by_c.setdefault(_figures(r)[:4], []).append(r)
    same_c = {k: v[0] for k, v in by_c.items() if len({_deployment(r) for r in v}) == 1}
    out = []
    for r in raw:
        model = _model(r["model_path"])
        assert model is not None
        given = re.search(r"silicon_concurrency=(\d+)", r.get("silicon_data_source", ""))
        day = measured_day(r)
        pf = (0, 0, 0)
        pbs = 1
        if r["mode"] == "agg":
            tp, dp, ep = _layout(_int(r["tp_size"]), _int(r["attention_dp_size"]), _int(r["moe_tp_size"]),
                                 _int(r["moe_ep_size"]))
            pre = dec = 0
            c = _int(r["batch_size"]) * dp
        else:
            d = known.get(_figures(r)) or same_c.get(_figures(r)[:4], r)
            tp, dp, ep = _layout(_int(d["decode_tp_size"]), _int(d["decode_attention_dp_size"]),
                                 _int(d["decode_moe_tp_size"]), _int(d["decode_moe_ep_size"]))
            pre, dec = _int(d["prefill_num_workers"]), _int(d["decode_num_workers"])
            c = _int(d["decode_batch_size"]) * dp * dec
            pbs = _int(d["prefill_batch_size"])
            if d["prefill_tp_size"].strip():
                pf = _layout(_int(d["prefill_tp_size"]), _int(d["prefill_attention_dp_size"]),
                             _int(d["prefill_moe_tp_size"]), _int(d["prefill_moe_ep_size"]))
        out.append(Point(r["id"], r["backend"], model, r["mode"], int(r["isl"]), int(r["osl"]),
                         int(given.group(1)) if given else c, tp, dp, ep, pre, dec,
                         pf if pf != (tp, dp, ep) else (0, 0, 0),
                         float(r["silicon_ttft_ms"]), float(r["silicon_tpot_ms"]), pbs,
                         _spec_tokens(model, r["backend"], r["mode"], day), day))
    return out


def mtp_evidence(points: Sequence[Point]) -> list[tuple[float, float]]:
    """For each row run with MTP, (TPOT, TTFT) of the same configuration measured earlier (on a day before
    the row's) over the row's own: the measured figures alone, no model (``MTP_CAMPAIGNS``)."""
    def config(p: Point) -> tuple[object, ...]:
        return (p.backend, p.model, p.mode, p.isl, p.osl, p.concurrency, p.tp, p.dp, p.ep, p.prefill, p.decode)

    plain: dict[tuple[object, ...], list[Point]] = {}
    for p in points:
        if not p.spec_tokens:
            plain.setdefault(config(p), []).append(p)
    out = []
    for p in points:
        for q in plain.get(config(p), []) if p.spec_tokens else []:
            if q.measured < p.measured:
                out.append((q.tpot_ms / p.tpot_ms, q.ttft_ms / p.ttft_ms))
    return out


def engine_timing(p: Point) -> ModelTiming:
    """The modelled engine a row runs on (module docstring: the assumptions)."""
    prof = PROFILES[PROFILE_OF[p.backend]]
    ptp, pdp, pep = p.prefill_layout
    seqs = budget = 0
    if p.mode == "disagg":
        # the prefill workers as AIConfigurator's generator launches them (rule_plugin/{trtllm,sglang}.rule):
        # max_batch_size = the prefill batch size (SGLang --max-running-requests), and a step's prompt tokens
        # capped at ISL + 1 500 (TRT-LLM max_num_tokens, rounded up to its 32-token blocks; SGLang
        # --max-prefill-tokens)
        budget = p.isl + PREFILL_TOKENS_SLACK
        if p.backend == "trtllm":
            budget = -(-budget // 32) * 32
        seqs = p.prefill_batch
    return ModelTiming(p.model, "h200", "fp8", tp=p.tp, dp=p.dp, ep=p.ep,
                       disagg_prefill=p.prefill, disagg_decode=p.decode, prefill_tp=ptp, prefill_dp=pdp, prefill_ep=pep,
                       profile=prof.name,
                       enable_prefix_caching=False, router="least-queue",
                       prefill_max_num_seqs=seqs, prefill_max_num_batched_tokens=budget,
                       spec_tokens=p.spec_tokens, spec_accept=MTP_ACCEPT)


def outcome_means(outcomes: Sequence[Outcome]) -> tuple[float, float]:
    """(mean TTFT ms, mean TPOT ms) of simulated requests, as the rows' client measured them."""
    ttft = [(o.token_ns[0] - o.intended_ns) / 1e6 for o in outcomes]
    tpot = [(o.token_ns[-1] - o.token_ns[0]) / 1e6 / max(1, len(o.token_ns) - 1) for o in outcomes]
    return statistics.fmean(ttft), statistics.fmean(tpot)


def wave_weighted(first: tuple[float, float], later: tuple[float, float]) -> tuple[float, float]:
    """The means of a 20-request-per-stream run from its first (synchronised) wave and the rest."""
    w = 1 / MEASURED_PER_STREAM
    return w * first[0] + (1 - w) * later[0], w * first[1] + (1 - w) * later[1]


def simulate(p: Point) -> tuple[float, float]:
    """(mean TTFT ms, mean TPOT ms) of the row's closed loop in virtual time (module docstring)."""
    c = p.concurrency
    res = run(ModelBackend(engine_timing(p)), [Send(p.isl, p.osl) for _ in range(c * WAVES)], Plan(concurrency=c))
    # a closed loop takes the sends in order: the first c are the synchronised first wave
    return wave_weighted(outcome_means(res.outcomes[:c]), outcome_means(res.outcomes[c:]))


@dataclass(frozen=True)
class Scored:
    point: Point
    ttft_ms: float
    tpot_ms: float

    @property
    def ratios(self) -> tuple[float, float]:
        return self.ttft_ms / self.point.ttft_ms, self.tpot_ms / self.point.tpot_ms


def _simulate_key(p: Point) -> tuple[float, float]:
    return simulate(p)


def score(points: Sequence[Point], workers: int = 1) -> list[Scored]:
    """Every point simulated (each distinct configuration once), in ``workers`` processes."""
    unique: dict[tuple[object, ...], Point] = {}
    for p in points:
        unique.setdefault(p.key, p)
    todo = sorted(unique.values(), key=lambda p: -p.concurrency * p.osl)  # costliest first
    if workers > 1:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            done = dict(zip((p.key for p in todo), pool.map(_simulate_key, todo, chunksize=4)))
    else:
        done = {p.key: simulate(p) for p in todo}
    return [Scored(p, *done[p.key]) for p in points]


# -- summary -------------------------------------------------------------------------------------
def _within(ratios: Iterable[float]) -> int:
    return sum(1 for r in ratios if abs(r - 1) <= 0.20)


def _median_err(ratios: Sequence[float]) -> float:
    return statistics.median(abs(r - 1) for r in ratios) if ratios else math.nan


def _worst(ratios: Sequence[float]) -> float:
    return max(ratios, key=lambda r: abs(math.log(r))) if ratios else math.nan


def group_table(scored: Sequence[Scored]) -> str:
    """Per (backend, model, mode): rows, TTFT and TPOT within ±20 %, median |error|, worst ratio."""
    groups: dict[str, list[Scored]] = {}
    for s in scored:
        groups.setdefault(s.point.group, []).append(s)
    head = (f"{'group':<28} {'rows':>4}  {'TTFT ±20%':>10} {'med|err|':>8} {'worst':>7}  "
            f"{'TPOT ±20%':>10} {'med|err|':>8} {'worst':>7}")
    lines = [head]

    def line(name: str, rows: Sequence[Scored]) -> str:
        t = [s.ratios[0] for s in rows]
        p = [s.ratios[1] for s in rows]
        return (f"{name:<28} {len(rows):>4}  {_within(t):>4} ({_within(t) / len(rows):>3.0%}) {_median_err(t):>8.0%} "
                f"{_worst(t):>7.2f}  {_within(p):>4} ({_within(p) / len(rows):>3.0%}) {_median_err(p):>8.0%} "
                f"{_worst(p):>7.2f}")

    for name in sorted(groups):
        lines.append(line(name, groups[name]))
    lines.append(line("all", scored))
    n = len(scored)
    both = _within(s.ratios[0] for s in scored) + _within(s.ratios[1] for s in scored)
    lines.append(f"figures within ±20 %: {both} of {2 * n} ({both / (2 * n):.1%})")
    return "\n".join(lines)


def rows_table(scored: Sequence[Scored]) -> str:
    lines = [f"{'group':<28} {'isl/osl':>10} {'C':>5} {'layout':<22} {'TTFT meas':>9} {'sim':>9} {'ratio':>6} "
             f"{'TPOT meas':>9} {'sim':>7} {'ratio':>6}"]
    for s in scored:
        p = s.point
        layout = f"tp{p.tp} dp{p.dp} ep{p.ep}" + (f" P{p.prefill}:D{p.decode}" if p.mode == "disagg" else "")
        if any(p.prefill_layout):
            layout += " P:tp{}dp{}ep{}".format(*p.prefill_layout)
        if p.spec_tokens:
            layout += f" mtp{p.spec_tokens}"
        lines.append(f"{p.group:<28} {p.isl:>5}/{p.osl:<4} {p.concurrency:>5} {layout:<22} {p.ttft_ms:>9.0f} "
                     f"{s.ttft_ms:>9.0f} {s.ratios[0]:>6.2f} {p.tpot_ms:>9.1f} {s.tpot_ms:>7.1f} {s.ratios[1]:>6.2f}")
    return "\n".join(lines)


#: Constants fitted on these rows: name -> (the rows it was fitted on, how many). Everything else the
#: rows run on was set before they were scored, or from the engines' own defaults (docs/simulator.md).
FITTED: dict[str, tuple[str, int]] = {
    "sglang.per_seq_us": ("SGLang Llama-3.1-8B TPOT, every row (C 20-512, TP1-8)", 46),
    "vllm/sglang.tp_skew_cap_tp": ("vLLM Llama-3.1-70B and SGLang DeepSeek aggregated TPOT (TP8 rows)", 105),
    "trtllm.mla_layer_us": ("TRT-LLM DeepSeek aggregated TPOT, with ep_a2a_scale on a grid", 88),
    "trtllm.ep_a2a_scale": ("TRT-LLM DeepSeek aggregated TPOT, with mla_layer_us on a grid", 88),
    "trtllm.disagg_handoff_ms": ("TRT-LLM DeepSeek disaggregated TTFT at C <= 64 on the rows whose deployment is "
                                 "known, median gap", 15),
    "sglang.disagg_handoff_ms": ("SGLang DeepSeek disaggregated TTFT at C <= 64, median gap", 40),
}


def _campaigns() -> str:
    return ", ".join(f"{b} {m} measured {d}" for b, m, d in sorted(MTP_CAMPAIGNS))


def report(path: Path, workers: int | None = None, per_row: bool = False) -> str:
    """The scored rows of ``path``: per (backend, model, mode), then the constants fitted on them."""
    from bench_llm.sim.validation import default_workers

    points = load(path)
    scored = score(points, default_workers() if workers is None else workers)
    fitted = "; ".join(f"{k} on {v[1]} rows ({v[0]})" for k, v in FITTED.items())
    lines = [f"H200 silicon rows ({path}): {len(points)} rows of models with a preset, "
             f"{len({p.key for p in points})} distinct configurations, virtual time, the client's closed loop"]
    if per_row:
        lines.append(rows_table(scored))
    lines.append(group_table(scored))
    pairs = mtp_evidence(points)
    if pairs:
        tpot = sorted(r for r, _ in pairs)
        ttft = sorted(r for _, r in pairs)
        lines.append(f"run with MTP ({MTP_DRAFTS} draft token, acceptance {MTP_ACCEPT}, not fitted): "
                     f"{sum(1 for p in points if p.spec_tokens)} rows of the campaigns {_campaigns()}; the same "
                     f"configurations measured earlier had TPOT {tpot[0]:.2f}-{tpot[-1]:.2f}x theirs (median "
                     f"{statistics.median(tpot):.2f}), TTFT {ttft[0]:.2f}-{ttft[-1]:.2f}x ({len(pairs)} pairs)")
    lines.append(f"constants fitted on these rows: {len(FITTED)} ({fitted}); every row was seen when terms were "
                 f"added (in-sample figures; docs/simulator.md)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``[PATH] [--per-row] [--workers N]``: the report of ``report`` (default path: ``default_path()``)."""
    path = Path(argv[0]) if argv and not argv[0].startswith("-") else default_path()
    if path is None:
        print(f"no H200 silicon rows (set ${ENV})", file=sys.stderr)
        return 1
    workers = int(argv[argv.index("--workers") + 1]) if "--workers" in argv else None
    print(report(path, workers, "--per-row" in argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
