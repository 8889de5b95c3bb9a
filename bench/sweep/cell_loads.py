"""The loads of one workload in one cell (``WorkloadLoads``): each run and its points row, a
load measured until its sample decides it, the capacity search with its confirmation loads,
and a list of loads.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bench_llm.analysis.capacity import LoadJudgement, Probe, judge_load
from bench_llm.analysis.capacity_client import client_limit, client_limit_text
from bench_llm.analysis.capacity_repeats import REPEAT_POINTS
from bench_llm.analysis.capacity_saturation import closed_loop_plateau
from bench_llm.analysis.capacity_steady import LIFETIMES
from bench_llm.bench.sweep import store
from bench_llm.bench.sweep.cell_echo import Echo, cap_text, confirmation_text, echo_point, fmt_load, interval_text
from bench_llm.bench.sweep.cell_outcome import (
    CellOutcome,
    SweepInterrupted,
    config_columns,
    logs_tail,
    workload_columns,
)
from bench_llm.bench.sweep.cell_repeats import SEQ_STRIDE, host_load, run_repeats
from bench_llm.bench.sweep.cell_search import gap_search, prior_loads, seeded_capacity_search
from bench_llm.bench.sweep.engines import alive, reset_prefix_cache
from bench_llm.bench.sweep.loads import Load, Measured, run_load
from bench_llm.bench.sweep.model_error import model_error_columns
from bench_llm.bench.sweep.spec import SweepSpec, WorkloadSpec
from bench_llm.bench.virtual import VirtualEngine
from bench_llm.launch.config import ParallelConfig
from bench_llm.results.sweep_rows import (
    Confirmation,
    LoadRef,
    PointRow,
    RunMeta,
    capacity_record,
    point_rows,
)

if TYPE_CHECKING:
    from bench_llm.loadgen.otlp import OtlpReceiver

#: Requests in the one-at-a-time baseline that opens a capacity search.
BASELINE_REQUESTS = 6
#: A capacity probe sends for at least this many one-at-a-time latencies (see LoadSpec.min_window_s).
WINDOW_E2E_MULTIPLE = 8.0
#: Most extra runs of one load beyond its repeats (a re-measurement, then doubling sizes).
MAX_REMEASURES = 3
#: Most confirmation loads per capacity search: each failed one moves the search below it.
MAX_CONFIRMATIONS = 3
#: In real time a confirmation sends for at least this long (seconds), whatever
#: ``loads.max_requests``: real vLLM passed 600 requests (4.5 s) at 132.8 req/s and met 2 % over
#: 60 s, its queue still building (docs/sweeps.md). Virtual time confirms with max_requests (4,000).
CONFIRM_MIN_S = 60.0


class CellContext(Protocol):
    """What a workload's loads read of the cell that runs them (``bench.sweep.cell.CellRunner``)."""

    spec: SweepSpec
    sweep_dir: Path
    sweep_id: str
    echo: Echo
    progress: bool | None
    capacity_hint: Callable[[ParallelConfig, str], float | None] | None
    otlp: OtlpReceiver | None
    virtual: VirtualEngine | None
    remote: Any


@dataclass
class WorkloadLoads:
    """The loads of one workload in one cell (``run``), one step per method: a run, its points
    row, a pooled load, a capacity search, a list of loads. Holds the state the steps share:
    whether the warm-up is still due and the sequence number of the next run."""

    runner: CellContext
    cfg: ParallelConfig
    cell_id: str
    index: str
    w: WorkloadSpec
    url: str
    served: str
    out: CellOutcome
    #: the warm-up goes with the cell's first run
    first: bool
    #: this workload's measured points, re-judged at the sweep's (changed) SLOs (a resumed
    #: cell, ``CellRunner.run``): the searches go on from them
    prior: list[PointRow] | None = None
    seq: int = 0
    #: a repeat search's run folders and points file (bench/sweep/cell_repeats.py)
    label_prefix: str = ""
    points_file: str = store.POINTS_FILE

    def __post_init__(self) -> None:
        self.seq = len(self.prior or ())  # a later load never reuses an earlier one's prompts (Load.seq)

    @cached_property
    def spec(self) -> SweepSpec:
        return self.runner.spec.for_cell(self.cfg)  # a deployment's own engine (EndpointSpec.engine)

    @property
    def virtual(self) -> VirtualEngine | None:
        return self.runner.virtual

    def run(self) -> bool:
        """All loads of the workload; False when the cell must stop (engine died)."""
        return self.capacity_search() if self.spec.loads.capacity else self.load_list()

    def measure(self, load: Load, workers: int | None = None) -> tuple[PointRow, bool] | None:
        """Run one load (with its repeats pooled by the caller); None if the engine died.
        ``workers``: client processes for this run (None: the sweep's)."""
        spec, runner, out = self.spec, self.runner, self.out
        # re-measurements of a load come after its repeats, and are labelled as further repeats
        label = self.label_prefix + load.label(len(spec.cell_workloads) > 1, max(spec.repeats, load.repeat + 1))
        run_dir = store.load_dir(runner.sweep_dir, self.cell_id, label)
        remote = self.runner.remote
        out.prefix_cache_reset = ("fresh engine (virtual time)" if self.virtual else remote.reset_note if remote
                                  else reset_prefix_cache(spec.engine, self.url))  # fmt: skip
        warmup = spec.loads.warmup if self.first else 0
        self.first = False
        t = time.monotonic()
        measured = self._run_load(load, label, run_dir, warmup, workers)
        row = self._point_row(load, label, run_dir, warmup, measured)
        # a client-limited load's lever: analysis/capacity_client.py
        row = row.with_metrics({**row.metrics, "client_workers": workers or spec.workers})
        interrupted = measured.interrupted
        out.points.append(row)
        store.write_points(runner.sweep_dir, self.cell_id, out.points, self.points_file)
        echo_point(runner.echo, self.index, self.cell_id, label, row, time.monotonic() - t)
        if interrupted:
            raise SweepInterrupted(self.cell_id)
        if self.virtual is None and not (remote.alive() if remote else alive(self.url, spec.engine)):
            out.status = "failed"
            out.reason = f"engine stopped answering during load {label}"
            out.log_tail = logs_tail(store.cell_dir(runner.sweep_dir, self.cell_id))
            return None
        return row, row.saturated

    def _run_load(
        self, load: Load, label: str, run_dir: Path, warmup: int, workers: int | None
    ) -> Measured:
        """One run folder of ``load``, measured once more when a results-writing fault lost rows."""
        spec, runner, cfg = self.spec, self.runner, self.cfg
        extra = RunMeta(
            sweep_id=runner.sweep_id,
            cell={**cfg.as_dict(), "cell_id": self.cell_id, "engine": spec.engine, "model": spec.model, "gpu": spec.gpu},
            load=LoadRef(load.kind, load.value, label),
            workload=self.w.tag,
            repeat=load.repeat,
            probe=load.probe,
            role=load.role,
            prefix_cache=self.out.prefix_cache_reset,
            engine_info=self.out.engine_info,
        )
        for attempt in range(2):
            measured = run_load(
                spec=spec if workers is None else replace(spec, workers=workers),
                load=load,
                run_dir=run_dir,
                url=self.url,
                served_model=self.served,
                extra=extra,
                warmup=warmup,
                progress=runner.progress,
                engine_version=self.out.engine_version,
                virtual=self.virtual,
                otlp=runner.otlp,
                remote=runner.remote,
            )
            if not measured.missing_rows or measured.interrupted or attempt == 1:
                break
            # a results-writing fault lost rows: judging the load on part of it would be
            # wrong, so keep the incomplete folder aside and measure the load again
            kept = store.set_aside_partial(runner.sweep_dir, self.cell_id, run_dir)
            runner.echo(
                f"{self.index} {self.cell_id} {label}: WARNING: {measured.missing_rows} requests have no row in the "
                f"results; measuring this load again (incomplete run kept in {kept})"
            )
        return measured

    def _point_row(
        self,
        load: Load,
        label: str,
        run_dir: Path,
        warmup: int,
        measured: Measured,
    ) -> PointRow:
        """The ``points.parquet`` row of one run: the cell, the load, its metrics and verdict,
        and a closed-loop plateau against the previous concurrency of the workload."""
        spec, runner, sat = self.spec, self.runner, measured.saturation
        row = PointRow(
            cell=config_columns(spec, self.cfg, self.cell_id),
            sweep_id=runner.sweep_id,
            workload=workload_columns(self.w),
            load=LoadRef(load.kind, float(load.value), label),
            repeat=load.repeat,
            probe=load.probe,
            role=load.role,
            status="interrupted" if measured.interrupted else "complete",
            saturated=sat.saturated,
            saturation_reason=str(sat) if sat.saturated else None,
            run_dir=str(run_dir.relative_to(runner.sweep_dir)),
            warmup_requests=warmup,
            # a simulated engine's figures carry the model's error (results/schema.MODEL_ERROR_FIELDS)
            metrics={**measured.columns(), **model_error_columns(spec.engine, spec.engine_args)},
        )
        if spec.slo:  # this run's own verdict; the load's pools its runs (judge_load)
            own = judge_load(point_rows([row]), spec.attainment_pct, spec.confidence)
            row = row.with_verdict(own.verdict, own.reason or None)
        if load.kind == "concurrency" and load.role == "load" and self.out.points:
            prev = [
                p
                for p in self.out.points
                if p.workload.workload == self.w.tag and p.load.kind == "concurrency" and p.role == "load"
            ]
            if prev:
                plateau = closed_loop_plateau(
                    prev[-1].figure("throughput_rps"), int(prev[-1].load.value), measured.figures.throughput_rps,
                    int(load.value),
                )
                if plateau.saturated:
                    row = replace(row, saturated=True,
                                  saturation_reason="; ".join(filter(None, (row.saturation_reason, str(plateau)))))  # fmt: skip
        return row

    def measure_pooled(
        self, kind: str, value: float, role: str, requests: int | None = None, prior: list[PointRow] | None = None
    ) -> LoadJudgement | None:
        """Measure one load (its repeats), then more until its sample decides it: a load
        the client could not measure truthfully once more, an undecided one with twice
        the requests per run, up to ``loads.max_requests`` in all, one too short or not
        stationary in a longer run of its own, up to ``loads.max_requests`` (docs/sweeps.md).
        ``prior``: runs of this load measured before (a confirmation: one more run, pooled)."""
        spec, loads, echo = self.spec, self.spec.loads, self.runner.echo
        rows: list[PointRow] = list(prior or ())

        def one(n: int | None, workers: int | None = None) -> bool:
            res = self.measure(Load(kind, value, self.w, len(rows), role, n, seq=self.seq), workers)
            self.seq += 1
            if res is None:
                return False
            rows.append(res[0])
            return True

        for _ in range(spec.repeats if role not in ("baseline", "confirm") else 1):
            if not one(requests):
                return None
        judgement = judge_load(point_rows(rows), spec.attainment_pct, spec.confidence)
        if role == "baseline" or not spec.slo:
            return judgement
        remeasured = False
        last = requests or loads.requests
        while True:
            workers = None
            if judgement.untrustworthy and not remeasured:
                remeasured, n = True, last
                # a saturated client gets twice the load-generating processes
                # (read from the rows' client_saturated flag: a policy never matches a reason's wording)
                saturated = any(r.metrics.get("untrustworthy") and r.metrics.get("client_saturated") for r in rows)
                workers = min(64, 2 * spec.workers) if saturated else None
                more = f" with {workers} client processes" if workers else ""
                echo(f"{self.index} {self.cell_id}: {fmt_load(kind, value)}: measuring again{more}: {judgement.reason}")
            elif judgement.needs_more and len(rows) - spec.repeats - len(prior or ()) < MAX_REMEASURES:
                if judgement.under_sampled:  # a longer run, judged alone (judge_load): up to max_requests
                    n = min(max(2 * last, last + judgement.more_requests), loads.max_requests)
                    if n <= last and last >= loads.max_requests:
                        break  # the longest run allowed did not settle: not stationary
                else:  # more of the same, pooled: up to max_requests in all
                    n = min(2 * last, loads.max_requests - sum(r.requests for r in rows))
                if n < 1:
                    break
                echo(f"{self.index} {self.cell_id}: {fmt_load(kind, value)} undecided ({judgement.reason}); {n} more requests")
            else:
                break
            if not one(n, workers):
                return None
            last = n
            judgement = judge_load(point_rows(rows), spec.attainment_pct, spec.confidence)
        return judgement

    def probe_of(self, value: float, j: LoadJudgement) -> Probe:
        if not self.spec.slo:  # no SLO: a load passes unless saturated
            return Probe(value, not j.saturated, j.attainment, j.saturated)
        return Probe(value, j.passed, j.attainment, j.saturated, j.undecided, j.reason, j.sure)

    def requests_for(self, rate: float, window_s: float) -> int:
        loads = self.spec.loads
        return int(min(loads.max_requests, max(loads.requests, math.ceil(rate * window_s))))

    def capacity_search(self) -> bool:
        """``loads.capacity``: a one-at-a-time baseline, then rate probes until the capacity
        is bracketed to the precision asked; False when the engine died."""
        loads, out, w, cfg = self.spec.loads, self.out, self.w, self.cfg
        index, cell_id, echo = self.index, self.cell_id, self.runner.echo
        known: list[Probe] = []
        base_verdict: str | None
        if self.prior is None:
            base = self.measure_pooled("concurrency", 1, "baseline", min(loads.requests, BASELINE_REQUESTS))
            if base is None:
                return False
            base_verdict, base_att = base.verdict, base.attainment
            base_e2e_s = out.points[-1].figure("e2e_p50_ms") / 1000.0
        else:  # re-judged: the baseline and the probes made are known
            judged = prior_loads(self.spec, self.prior)
            known, base_verdict = list(judged.probes), judged.base_verdict
            base_att, base_e2e_s = judged.base_attainment, judged.base_e2e_s
        window = loads.min_window_s if loads.min_window_s is not None else WINDOW_E2E_MULTIPLE * base_e2e_s
        if not math.isfinite(window):
            window = 0.0
        if base_verdict == "fail":  # decidedly, on a handful of requests: none pass there
            out.capacity[w.tag] = capacity_record(
                "search",
                optional=(),
                capacity_rps=None,
                upper_rps=None,
                precision=loads.capacity_precision,
                achieved_precision=None,
                converged=True,
                probes=0,
                note=f"fails the SLOs even one request at a time ({100 * base_att:.0f}% met)",
            )
            echo(f"{index} {cell_id}: capacity none: fails the SLOs even one request at a time")
            return True
        # later cells start near what earlier cells found per GPU (fewer probes)
        hint = self.runner.capacity_hint
        start = hint(cfg, w.tag) if hint else None
        if start is None:
            start = loads.capacity_start
        if start is None:
            start = 2.0 / base_e2e_s if math.isfinite(base_e2e_s) and base_e2e_s > 0 else 1.0
        search = seeded_capacity_search(self.spec, start, base_e2e_s, known)
        confirmed: Confirmation | None = None
        for attempt in range(MAX_CONFIRMATIONS + 1):
            while (rate := search.next_rate()) is not None:
                # each probe sends for LIFETIMES long-request lifetimes of the loads passed so far
                res = self.measure_pooled("rate", rate, "probe", self.requests_for(rate, max(window, self.long_window())))
                if res is None:
                    return False
                search.record(self.probe_of(rate, res))
            cap = search.result().capacity_rps
            if cap is None or not self.spec.slo or attempt == MAX_CONFIRMATIONS:
                break
            confirmed = self.confirm(cap)
            if confirmed is None:
                return False
            if confirmed.passed:
                # the capacity's probe is now the load with its confirmation pooled (as recommend reads it)
                search.probes = [p for p in search.probes if abs(p.rate - cap) > 1e-9]
                search.record(Probe(cap, True, confirmed.pooled_attainment, sure=confirmed.sure))
                break
            # the answer did not hold on a longer, fresh-seed run: the search goes on below it
            search.record(Probe(cap, False, confirmed.attainment, False, confirmed.verdict == "undecided",
                                confirmed.reason or ""))  # fmt: skip
            search.max_probes = max(search.max_probes + 1, len(search.probes) + MAX_REMEASURES)
        result = search.result()
        if confirmed is not None and confirmed.rate != result.capacity_rps:
            confirmed = None  # the last confirmation failed and no budget was left for another
        out.capacity[w.tag] = capacity_record(
            "search",
            confirmation=confirmed,
            capacity_rps=result.capacity_rps,
            upper_rps=result.upper_rps,
            interval_low_rps=result.interval_low_rps,
            interval_high_rps=result.interval_high_rps,
            precision=result.precision,
            achieved_precision=result.achieved_precision,
            converged=result.converged,
            probes=len(result.probes),
            undecided=tuple(result.undecided),
            level=result.level,
            note=result.note,
        )
        if not self.label_prefix and self.prior is None and result.capacity_rps is not None and self.spec.slo:
            if not run_repeats(self, result):  # fresh seeds: the interval (bench/sweep/cell_repeats.py)
                return False
        points = [p for p in out.points if p.workload.workload == w.tag]
        limit = client_limit(points, result.capacity_rps, result.upper_rps, self.spec.workers)
        record = out.capacity[w.tag]
        if limit is not None:  # a lower bound (or nothing) the client could measure: it says so first
            limit, load_note = host_load(limit)
            echo(f"{index} {cell_id}: {client_limit_text(limit, result.capacity_rps)}{load_note}")
            out.capacity[w.tag] = record.with_extra(client_limit=limit)
        else:
            echo(f"{index} {cell_id}: capacity {cap_text(result.capacity_rps, result.upper_rps, cfg.gpus)}"
                 + interval_text(record.interval_low_rps, record.interval_high_rps))  # fmt: skip
        if result.capacity_rps is not None and self.spec.slo:
            echo(f"{index} {cell_id}: {confirmation_text(confirmed, float(self.spec.confidence))}")
        if result.undecided:
            echo(f"{index} {cell_id}: {result.note}")
        return True

    def repeat(self, k: int, runner: CellContext) -> WorkloadLoads:
        """The k-th repeat of this capacity search (bench/sweep/cell_repeats.py): the baseline
        reused, its own seeds (loads numbered from k × SEQ_STRIDE), run folders and points file."""
        base = [p for p in self.out.points if p.workload.workload == self.w.tag and p.role == "baseline"]
        sub = replace(self, runner=runner, out=CellOutcome("complete", points=[]), first=False, prior=base,
                      label_prefix=f"seed{k}-", points_file=REPEAT_POINTS.format(k=k))  # fmt: skip
        sub.seq = k * SEQ_STRIDE
        return sub

    def long_window(self) -> float:
        """``LIFETIMES`` lifetimes of a long request (E2E p90) at the passing rate loads of
        this workload so far, in seconds (0 before any passed)."""
        life = [
            float(p.metrics.get("e2e_p90_ms") or 0.0) / 1000.0
            for p in self.out.points
            if p.workload.workload == self.w.tag and p.load.kind == "rate" and p.verdict == "pass"
        ]
        life = [v for v in life if math.isfinite(v)]
        return LIFETIMES * max(life) if life else 0.0

    def confirm(self, rate: float) -> Confirmation | None:
        """Re-run the capacity found as a confirmation load: ``loads.max_requests`` requests
        (longer than any probe) with a fresh seed, pooled with the probe's own runs. Its
        verdict, attainment and interval (None: the engine died)."""
        prior = [
            p
            for p in self.out.points
            if p.workload.workload == self.w.tag and p.load.kind == "rate" and p.role != "baseline"
            and p.measured and abs(p.load.value - rate) < 1e-9
        ]  # fmt: skip
        n = self.spec.loads.max_requests
        if self.virtual is None:
            n = max(n, math.ceil(rate * CONFIRM_MIN_S))
        self.runner.echo(f"{self.index} {self.cell_id}: confirming {rate:g} req/s: {n} requests, a fresh seed")
        before = len(self.out.points)
        j = self.measure_pooled("rate", rate, "confirm", n, prior)
        if j is None:
            return None
        runs = self.out.points[before:]
        last = runs[-1] if runs else None
        return Confirmation(
            rate=rate,
            verdict=j.verdict,
            reason=j.reason or None,
            requests=last.requests if last is not None else 0,
            attainment=float(last.metrics.get("attainment", math.nan)) if last is not None else math.nan,
            pooled_requests=j.judged,
            pooled_attainment=j.attainment,
            low=j.low,
            high=j.high,
            sure=j.sure,
        )

    def load_list(self) -> bool:
        """The listed rates or concurrencies, lowest first (the rest skipped once one saturates
        with ``loads.stop_at_saturation``); with SLOs and rates, the capacity they bracket.
        False when the engine died."""
        loads = self.spec.loads
        values: list[tuple[str, float]] = (
            [("rate", r) for r in sorted(loads.rates)]
            if loads.rates
            else [("concurrency", float(c)) for c in sorted(loads.concurrency)]
        )
        kind = values[0][0] if values else "rate"
        probes: list[Probe] = []
        if self.prior is not None:  # the listed loads were measured: only a gap below them is probed
            values = []
            probes = list(prior_loads(self.spec, self.prior).probes)
            gap = gap_search(self.spec, probes)
            while gap is not None and (rate := gap.next_rate()) is not None:
                res = self.measure_pooled("rate", rate, "probe", self.requests_for(rate, loads.min_window_s or 0.0))
                if res is None:
                    return False
                gap.record(self.probe_of(rate, res))
            probes = gap.probes if gap is not None else probes
        for i, (kind, value) in enumerate(values):
            res = self.measure_pooled(
                kind, value, "load", self.requests_for(value, loads.min_window_s or 0.0) if kind == "rate" else None
            )
            if res is None:
                return False
            probes.append(self.probe_of(value, res))
            if res.saturated and loads.stop_at_saturation and i + 1 < len(values):
                self._skip_above(kind, value, values[i + 1 :])
                break
        if kind == "rate" and self.spec.slo:
            self._rate_list_capacity(probes)
        return True

    def _skip_above(self, kind: str, value: float, rest: list[tuple[str, float]]) -> None:
        """Record the loads above a saturated one as skipped points."""
        spec, out = self.spec, self.out
        skipped = ", ".join(f"{v:g}" for _, v in rest)
        self.runner.echo(f"{self.index} {self.cell_id}: saturated at {kind} {value:g}; skipping higher loads ({skipped})")
        for k2, v2 in rest:
            label = Load(k2, v2, self.w).label(len(spec.cell_workloads) > 1, 1)
            out.points.append(
                PointRow(
                    cell=config_columns(spec, self.cfg, self.cell_id),
                    sweep_id=self.runner.sweep_id,
                    workload=workload_columns(self.w),
                    load=LoadRef(k2, float(v2), label),
                    repeat=0,
                    probe=False,
                    role="load",
                    status="skipped",
                    saturated=True,
                    saturation_reason=f"skipped: saturated at {kind} {value:g}",
                )
            )
        store.write_points(self.runner.sweep_dir, self.cell_id, out.points)

    def _rate_list_capacity(self, probes: list[Probe]) -> None:
        from bench_llm.analysis.capacity import capacity_from_probes

        result = capacity_from_probes(probes, precision=float("nan"))
        self.out.capacity[self.w.tag] = capacity_record(
            "rate list",
            optional=("undecided", "level"),
            capacity_rps=result.capacity_rps,
            upper_rps=result.upper_rps,
            precision=None,
            achieved_precision=result.achieved_precision,
            converged=result.upper_rps is not None,
            probes=len(probes),
            undecided=tuple(result.undecided),
            level=result.level,
            note=result.note,
        )
        cap = cap_text(result.capacity_rps, result.upper_rps, self.cfg.gpus)
        self.runner.echo(f"{self.index} {self.cell_id}: capacity {cap}")
