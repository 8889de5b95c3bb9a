"""Probes of why the simulated TTFT misses the measured H200 aggregated rows (issue 35), in virtual time.

Each probe changes one assumption of ``sim.silicon.simulate`` and prints the per-group table of
``bench sim validate --only silicon`` for the aggregated rows (or those of one group):

* ``sync``: the shipped model (all C streams start together after the warm-up; 3 waves, the first
  weighted 1/20).
* ``pool``: the prompts of AIPerf's default synthetic dataset: 100 entries (``--num-dataset-entries``
  default, aiperf ``common/config/config_defaults.py`` ``InputDefaults.NUM_DATASET_ENTRIES``), each
  request drawing one at random with replacement (``dataset/dataset_manager.py``
  ``_return_any_conversation``), the 2C warm-up requests included (AIConfigurator's ``bench_run.sh``
  passes no ``--num-dataset-entries``), on an engine with prefix caching on (the engines' default).
  A measured request at position i of the run repeats an earlier prompt with probability
  1 - 0.99^i; the simulated waves take the mean of that probability over the waves they stand for.
* ``phases``: streams at random phases (each stream's first request has a random fraction of the
  output length and is not counted): each prompt is prefilled nearly alone.
* ``desync``: the first (synchronised) wave as shipped, weighted 1/20, and the other 19/20 as
  ``phases``.
* ``aic``: the shipped closed loop on the engine launched as AIConfigurator's generator does in
  benchmark mode (``aic_launch``).
* ``desync-floor``: ``desync``, with DeepSeek's prefill steps floored at the eager-forward CPU time
  fitted on a 2024 SGLang row (``SGLANG_2024_EAGER_LAYER_US`` per layer, 220 ms for 61 layers): the
  H200 rows' flat ~250 ms DeepSeek TTFT at C 4-16 asks for about that much per prefill step.
* ``waves``: the shipped closed loop run for all 20 requests per stream, mean TTFT per wave.

Usage: ``python benchmarks/silicon_probes.py sync|pool|phases|desync|aic|desync-floor [GROUP-PREFIX] [--rows]`` and
``python benchmarks/silicon_probes.py waves GROUP-PREFIX ISL/OSL C``. Needs the rows
(``../shared/reference/silicon/h200_silicon.csv`` or ``$BENCH_SILICON_ROWS``).
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import sys
from collections.abc import Callable

from bench_llm.sim import silicon
from bench_llm.sim.backend import ModelBackend
from bench_llm.sim.options import ModelTiming
from bench_llm.sim.presets import PROFILES, SGLANG_2024_EAGER_LAYER_US
from bench_llm.sim.virtual import Plan, Send, run

POOL = 100  # AIPerf's default number of synthetic dataset entries
BLOCK = 16
PER_STREAM = silicon.MEASURED_PER_STREAM


def _prompt(pid: int, isl: int) -> tuple[int, ...]:
    return tuple(pid * 1_000_003 + b + 1 for b in range(isl // BLOCK))


def pool(p: silicon.Point) -> tuple[float, float]:
    """The row's closed loop on AIPerf's 100-prompt dataset with prefix caching on (module docstring)."""
    c, waves = p.concurrency, silicon.WAVES
    rng = random.Random(100)  # AIConfigurator's --random-seed

    def repeat(i: int) -> float:
        return 1 - (1 - 1 / POOL) ** i

    later = statistics.fmean(repeat(i) for i in range(3 * c, (2 + PER_STREAM) * c))
    seen: list[int] = []
    sends = []
    for k in range((2 + waves) * c):
        if seen and rng.random() < (repeat(k) if k < 3 * c else later):
            pid = rng.choice(seen)
        else:
            pid = len(seen)
            seen.append(pid)
        sends.append(Send(p.isl, p.osl, _prompt(pid, p.isl), warmup=k < 2 * c))
    timing = dataclasses.replace(silicon.engine_timing(p), enable_prefix_caching=True)
    out = run(ModelBackend(timing), sends, Plan(concurrency=c, warmup_concurrency=c)).outcomes[2 * c:]
    return silicon.wave_weighted(silicon.outcome_means(out[:c]), silicon.outcome_means(out[c:]))


def phases(p: silicon.Point, timing: ModelTiming | None = None) -> tuple[float, float]:
    """Streams at random phases: each stream's first request (not counted) has a random fraction of the
    output length, then ``WAVES`` requests per stream."""
    c = p.concurrency
    rng = random.Random(7)
    sends = [Send(p.isl, max(1, int(p.osl * rng.random()))) for _ in range(c)]
    sends += [Send(p.isl, p.osl)] * (c * silicon.WAVES)
    engine = ModelBackend(timing or silicon.engine_timing(p))
    return silicon.outcome_means(run(engine, sends, Plan(concurrency=c)).outcomes[c:])


def desync(p: silicon.Point, timing: ModelTiming | None = None) -> tuple[float, float]:
    """The synchronised first wave (1/20), then streams at random phases (19/20)."""
    c = p.concurrency
    engine = ModelBackend(timing or silicon.engine_timing(p))
    first = silicon.outcome_means(run(engine, [Send(p.isl, p.osl)] * c, Plan(concurrency=c)).outcomes)
    return silicon.wave_weighted(first, phases(p, timing))


def desync_floor(p: silicon.Point) -> tuple[float, float]:
    """``desync`` with DeepSeek's prefill-carrying steps at least ``SGLANG_2024_EAGER_LAYER_US`` per layer
    (decode steps stay graphed)."""
    timing = silicon.engine_timing(p)
    if p.model == "deepseek-v3":
        prof = dataclasses.replace(timing.engine_profile, eager_layer_us=SGLANG_2024_EAGER_LAYER_US,
                                   cuda_graph_max_bs=1 << 20)
        timing = dataclasses.replace(timing, profile_spec=prof)
    return desync(p, timing)


def aic_launch(p: silicon.Point) -> ModelTiming:
    """The engine as AIConfigurator's generator launches it in benchmark mode (aiconfigurator 095f58a,
    ``generator/rule_plugin/benchmark/{vllm,trtllm,sglang}.rule``, added 2026-01-30): the running limit is
    the row's batch size per rank; the step's token budget is batch + ISL + 1500 (vLLM
    ``max-num-batched-tokens``, TRT-LLM ``max_num_tokens`` rounded up to 32 tokens) or ISL + 1500 (SGLang
    ``max-prefill-tokens``), and SGLang runs with ``--enable-mixed-chunk`` (prefill chunks share a step with
    the decodes). TRT-LLM's ``enable_chunked_prefill: false`` is not modelled (the budget holds a whole
    prompt)."""
    timing = silicon.engine_timing(p)
    bs = max(1, p.concurrency // max(1, p.dp))
    if p.backend == "sglang":
        mixed = dataclasses.replace(PROFILES["sglang"], policy="v1-chunked")
        return dataclasses.replace(timing, max_num_seqs=bs, max_num_batched_tokens=p.isl + 1500, profile_spec=mixed)
    budget = bs + p.isl + 1500
    if p.backend == "trtllm":
        budget = -(-budget // 32) * 32
    return dataclasses.replace(timing, max_num_seqs=bs, max_num_batched_tokens=budget)


def aic(p: silicon.Point) -> tuple[float, float]:
    """The shipped closed loop on the engine ``aic_launch`` builds."""
    c, waves = p.concurrency, silicon.WAVES
    out = run(ModelBackend(aic_launch(p)), [Send(p.isl, p.osl)] * (c * waves), Plan(concurrency=c)).outcomes
    return silicon.wave_weighted(silicon.outcome_means(out[:c]), silicon.outcome_means(out[c:]))


PROBES: dict[str, Callable[[silicon.Point], tuple[float, float]]] = {
    "sync": silicon.simulate, "pool": pool, "phases": phases, "desync": desync, "aic": aic,
    "desync-floor": desync_floor}


def table(probe: str, group: str, rows: bool) -> str:
    path = silicon.default_path()
    if path is None:
        raise SystemExit(f"no H200 silicon rows (set ${silicon.ENV})")
    points = [p for p in silicon.load(path) if p.mode == "agg" and p.group.startswith(group)]
    done: dict[tuple[object, ...], tuple[float, float]] = {}
    for p in points:
        if p.key not in done:
            done[p.key] = PROBES[probe](p)
    scored = [silicon.Scored(p, *done[p.key]) for p in points]
    return (silicon.rows_table(scored) + "\n" if rows else "") + silicon.group_table(scored)


def waves(group: str, lengths: str, concurrency: int) -> str:
    path = silicon.default_path()
    if path is None:
        raise SystemExit(f"no H200 silicon rows (set ${silicon.ENV})")
    lines = []
    for p in silicon.load(path):
        if p.mode != "agg" or not p.group.startswith(group) or f"{p.isl}/{p.osl}" != lengths:
            continue
        if p.concurrency != concurrency:
            continue
        c = p.concurrency
        out = run(ModelBackend(silicon.engine_timing(p)), [Send(p.isl, p.osl)] * (c * PER_STREAM),
                  Plan(concurrency=c)).outcomes
        per_wave = [silicon.outcome_means(out[w * c:(w + 1) * c])[0] for w in range(PER_STREAM)]
        lines.append(f"{p.group} {lengths} C{c} tp{p.tp} dp{p.dp} ep{p.ep}: measured {p.ttft_ms:.0f} ms; "
                     f"per wave {' '.join(f'{t:.0f}' for t in per_wave)}; mean of 20 {statistics.fmean(per_wave):.0f}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    if not args or args[0] not in (*PROBES, "waves"):
        print(__doc__, file=sys.stderr)
        return 2
    if args[0] == "waves":
        print(waves(args[1], args[2], int(args[3])))
    else:
        print(table(args[0], args[1] if len(args) > 1 else "", "--rows" in argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
