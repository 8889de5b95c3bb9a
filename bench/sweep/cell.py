"""One cell: launch, readiness, warm-up, prefix-cache reset, the measured loads, teardown.

Every load is an ordinary run folder; the cell's ``points.parquet`` is rewritten after each
load so a crash loses at most the load in progress. An engine that fails to start or dies
mid-cell fails the cell with its log tail; the sweep goes on.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pandas as pd

from bench_llm.analysis.capacity import CapacitySearch, LoadJudgement, Probe, judge_load
from bench_llm.analysis.capacity_saturation import Saturation, closed_loop_plateau
from bench_llm.analysis.capacity_steady import LIFETIMES
from bench_llm.analysis.invariants import ONE_READ_SHARE_MAX
from bench_llm.analysis.recommend_diagnosis import diagnose_cell
from bench_llm.analysis.recommend_io import load_points
from bench_llm.analysis.recommend_pooling import pooled_loads, rate_probes
from bench_llm.analysis.slo import SLO
from bench_llm.bench.errors import too_few_succeeded
from bench_llm.bench.sweep import store
from bench_llm.bench.sweep.engines import (
    CellEngine,
    EngineStartError,
    Launcher,
    VirtualHandle,
    alive,
    reset_prefix_cache,
    tail,
)
from bench_llm.bench.sweep.loads import Load, fmt, run_load
from bench_llm.bench.sweep.matrix import tuning_json
from bench_llm.bench.sweep.spec import SweepSpec, WorkloadSpec
from bench_llm.bench.virtual import VirtualEngine
from bench_llm.launch.config import ParallelConfig

if TYPE_CHECKING:
    from bench_llm.loadgen.otlp import OtlpReceiver

Echo = Callable[[str], None]

#: Requests in the one-at-a-time baseline that opens a capacity search.
BASELINE_REQUESTS = 6
#: A capacity probe sends for at least this many one-at-a-time latencies (see LoadSpec.min_window_s).
WINDOW_E2E_MULTIPLE = 8.0
#: Most extra runs of one load beyond its repeats (a re-measurement, then doubling sizes).
MAX_REMEASURES = 3
#: Most confirmation loads per capacity search: each failed one moves the search below it.
MAX_CONFIRMATIONS = 3


class SweepInterrupted(Exception):
    """Ctrl-C / SIGTERM during a load: the sweep stops; --resume reruns this cell."""


@dataclass
class CellOutcome:
    status: str  # complete | failed
    reason: str | None = None
    log_tail: str | None = None
    points: list[dict[str, Any]] = field(default_factory=list)
    #: workload tag -> capacity record (capacity search / rate sweeps)
    capacity: dict[str, dict[str, Any]] = field(default_factory=dict)
    engine_version: str | None = None
    engine_argv: str | None = None
    #: what the cell's engine says about itself (version and server-info routes, launch/profiles.py)
    engine_info: dict[str, Any] | None = None
    prefix_cache_reset: str | None = None
    #: what limits a complete cell, from its points (``limiting_factor``); computed where the
    #: cell ran, so the sweep's own process reads no Parquet while cells run (bench/sweep/parallel.py)
    limiting_factor: str | None = None


def failed_deployment(points: list[dict[str, Any]]) -> str | None:
    """Why a cell whose loads (nearly) all failed is a failed deployment, its most frequent
    errors first (None: enough of its requests succeeded, ``bench.errors.too_few_succeeded``)."""
    done = [p for p in points if p.get("status") in ("complete", "interrupted")]
    ok = sum(int(p.get("ok") or 0) for p in done)
    counted = sum(int(p.get("requests") or 0) - int(p.get("cancelled") or 0) for p in done)
    if not done or not too_few_succeeded(ok, counted):
        return None
    errors: dict[str, int] = {}
    for p in done:
        if p.get("top_error"):
            errors[str(p["top_error"])] = errors.get(str(p["top_error"]), 0) + int(p.get("failed") or 0)
    top = sorted(errors, key=lambda e: -errors[e])[:3]
    head = f"requests failed: {' | '.join(top)}; " if top else "requests failed; "
    return head + f"{counted - ok} of {counted} requests of its loads failed (read the engine log)"


def config_columns(spec: SweepSpec, cfg: ParallelConfig, cell_id: str) -> dict[str, Any]:
    return {
        "cell_id": cell_id,
        "engine": spec.for_cell(cfg).engine,
        "model": spec.model,
        "gpu": spec.gpu,
        "tp": cfg.tp,
        "pp": cfg.pp,
        "dp": cfg.dp,
        "ep": cfg.ep,
        "dcp": cfg.dcp,
        "pcp": cfg.pcp,
        "disagg": str(cfg.disagg) if cfg.disagg else None,
        "gpus": cfg.gpus,
        "axes": cfg.axes,
        "tuning": tuning_json(cfg),
    }


def workload_columns(w: WorkloadSpec) -> dict[str, Any]:
    """The workload values a point ran with: its tag, and the named workload or the synthetic
    lengths (each a workload axis of the sweep, ``MatrixSpec``)."""
    return {
        "workload": w.tag,
        "workload_name": w.name,
        "input_tokens": None if w.name else w.input_tokens,
        "output_tokens": None if w.name else w.output_tokens,
    }


def cell_engine(spec: SweepSpec, cfg: ParallelConfig) -> CellEngine:
    """What the launcher gets for one cell (a tuning cell's flags travel in ``cfg.extra_args``)."""
    env = tuple((name, value) for name, _, value in (item.partition("=") for item in spec.engine_env))
    return CellEngine(
        engine=spec.for_cell(cfg).engine,
        model=spec.model,
        gpu=spec.gpu,
        parallel=cfg,
        gpus_available=spec.gpus,
        extra_args=tuple(spec.engine_args),
        env=env,
        ready_timeout_s=spec.ready_timeout_s,
        engine_version=spec.engine_version,
    )


def limiting_factor(sweep_dir: Path, spec: SweepSpec, cell_id: str) -> str | None:
    """A complete cell's limiting resource, read from its points (the first workload's)."""
    try:
        pts = load_points(sweep_dir, cell_id=cell_id)
        if pts.empty:
            return None
        pts = pts[pts["workload"] == spec.cell_workloads[0].tag]
        return diagnose_cell(pts, spec.slo, spec.attainment_pct, spec.confidence).limiting_factor
    except Exception as exc:  # a diagnosis problem must never lose a measured cell
        return f"unknown ({type(exc).__name__}: {exc})"


class CellRunner:
    def __init__(
        self,
        spec: SweepSpec,
        sweep_dir: Path,
        sweep_id: str,
        launcher: Launcher,
        echo: Echo,
        progress: bool | None = None,
        capacity_hint: Callable[[ParallelConfig, str], float | None] | None = None,
        otlp: OtlpReceiver | None = None,
    ) -> None:
        self.spec = spec
        self.sweep_dir = sweep_dir
        self.sweep_id = sweep_id
        self.launcher = launcher
        self.echo = echo
        self.progress = progress
        self.capacity_hint = capacity_hint
        #: the sweep's OTLP receiver (``bench sweep --otlp-receiver``): each launched engine
        #: exports its request spans to it, each load's run folder keeps its own
        self.otlp = otlp
        #: the cell's engine when it runs in virtual time
        self.virtual: VirtualEngine | None = None

    def run(self, cfg: ParallelConfig, cell_id: str, index: str, prior: list[dict[str, Any]] | None = None) -> CellOutcome:
        """Measure the cell (``measure_cell``); a complete cell with what limits it."""
        out = self.measure_cell(cfg, cell_id, index, prior)
        if out.status == "complete":
            failed = failed_deployment(out.points)
            if failed is not None:  # (nearly) every request failed: no configuration was measured
                out.status, out.reason = "failed", failed
                self.echo(f"{index} {cell_id}: FAILED: {failed}")
                return out
        if out.status == "complete" and self.spec.slo:
            out.limiting_factor = limiting_factor(self.sweep_dir, self.spec, cell_id)
        return out

    def measure_cell(self, cfg: ParallelConfig, cell_id: str, index: str,
                     prior: list[dict[str, Any]] | None = None) -> CellOutcome:  # fmt: skip
        """Measure the cell. ``prior``: a complete cell's points, re-judged at the sweep's
        (changed) SLOs (orchestrate.rejudged_points): its capacity searches continue from them, and
        only the loads the new verdicts need are measured, the engine started only for them."""
        spec = self.spec.for_cell(cfg)
        cdir = store.cell_dir(self.sweep_dir, cell_id)
        cdir.mkdir(parents=True, exist_ok=True)
        priors: dict[str, list[dict[str, Any]]] = {}
        if prior is not None:
            priors = {w.tag: [p for p in prior if p.get("workload") == w.tag] for w in spec.cell_workloads}
            wanted = missing_loads(spec, priors)
            self.echo(
                f"{index} {cell_id}: measured loads re-judged at {SLO.from_dict(spec.slo)}: "
                + (f"probing the missing loads, from {', '.join(wanted)}" if wanted else "no load missing")
            )
            if not wanted:
                out = CellOutcome("complete", points=list(prior))
                for w in spec.cell_workloads:
                    _WorkloadLoads(self, cfg, cell_id, index, w, "", "", out, False, priors[w.tag]).run()
                store.write_points(self.sweep_dir, cell_id, out.points)
                return out
        log_path = cdir / "engine.log"
        if prior is not None and log_path.exists():
            log_path = cdir / f"engine-resumed-{time.time_ns()}.log"
        engine = cell_engine(spec, cfg)
        if self.otlp is not None:
            from bench_llm.bench.launch_engine import otlp_launch

            args, env = otlp_launch(spec.engine, self.otlp.endpoint)
            engine = replace(engine, extra_args=(*engine.extra_args, *args), env=(*engine.env, *env))
        self.echo(f"{index} {cell_id} ({cfg.gpus} GPU{'s' if cfg.gpus != 1 else ''}): starting {spec.engine}...")
        t0 = time.monotonic()
        try:
            handle = self.launcher.start(engine, log_path)
        except EngineStartError as exc:
            text = str(exc)
            # the launcher's message carries the tail of the process that failed (a replica's
            # own log for DP / disaggregated cells); fall back to the cell's logs
            log = text.split("last log lines:", 1)[1].strip("\n") if "last log lines:" in text else ""
            log = log or _logs_tail(cdir) or text
            return CellOutcome("failed", _start_failure(text, log), log)
        out = CellOutcome("complete", points=list(prior or ()))
        self.virtual = handle.engine if isinstance(handle, VirtualHandle) else None
        out.engine_version = getattr(handle, "version", None) or spec.engine_version
        argv = getattr(handle, "argv", None)
        out.engine_argv = json.dumps(list(argv)) if argv else None
        out.engine_info = getattr(handle, "info", None) or None
        try:
            self.echo(f"{index} {cell_id}: ready after {time.monotonic() - t0:.1f} s at {handle.url}")
            served = _served_model(spec)
            first_run = True
            for w in spec.cell_workloads:
                # all loads of one workload; False when the cell must stop (engine died)
                rows = None if prior is None else priors[w.tag]
                ok = _WorkloadLoads(self, cfg, cell_id, index, w, handle.url, served, out, first_run, rows).run()
                first_run = False
                if not ok:
                    break
        finally:
            handle.stop()
        return out

    def _echo_point(self, index: str, cell_id: str, label: str, row: dict[str, Any], secs: float) -> None:
        parts = [
            f"{index} {cell_id} {label}:",
            f"{row['ok']}/{row['requests']} ok",
            f"{fmt(row['throughput_rps'], ' req/s', 2)}",
        ]
        if not math.isnan(row.get("attainment", float("nan"))):
            parts.append(f"SLO met {100 * row['attainment']:.0f}%")
        parts.append(f"TTFT p90 {fmt(row['ttft_p90_ms'], ' ms')}")
        parts.append(f"TPOT p90 {fmt(row['tpot_p90_ms'], ' ms', 1)}")
        parts.append(f"({secs:.1f} s)")
        line = " ".join(parts)
        if row.get("anomalies"):
            line += f"  ANOMALIES: {row['anomalies']} records excluded"
        if row.get("untrustworthy"):
            line += f"  UNTRUSTWORTHY: {row['untrustworthy']}"
        if row.get("under_sampled"):
            line += f"  {_shout(str(row['under_sampled']))}"
        if row.get("one_read_share", 0.0) > ONE_READ_SHARE_MAX:
            line += f"  TPOT not measurable: {100 * row['one_read_share']:.0f}% of responses in one read"
        if row.get("prompt_approximate"):
            line += f"  PROMPTS APPROXIMATE: {row['prompt_approximate']}"
        if row.get("saturated"):
            line += f"  SATURATED: {row['saturation_reason']}"
        if row.get("top_error"):
            line += f"  errors: {row['top_error']}"
        if row.get("missing_rows"):
            line += f"  WARNING: {row['missing_rows']} scheduled requests have no row in the results"
        self.echo(line)


@dataclass
class _WorkloadLoads:
    """The loads of one workload in one cell (``run``), one step per method: a run, its points
    row, a pooled load, a capacity search, a list of loads. Holds the state the steps share:
    whether the warm-up is still due and the sequence number of the next run."""

    runner: CellRunner
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
    prior: list[dict[str, Any]] | None = None
    seq: int = 0

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

    def measure(self, load: Load, workers: int | None = None) -> tuple[dict[str, Any], bool] | None:
        """Run one load (with its repeats pooled by the caller); None if the engine died.
        ``workers``: client processes for this run (None: the sweep's)."""
        spec, runner, out = self.spec, self.runner, self.out
        # re-measurements of a load come after its repeats, and are labelled as further repeats
        label = load.label(len(spec.cell_workloads) > 1, max(spec.repeats, load.repeat + 1))
        run_dir = store.load_dir(runner.sweep_dir, self.cell_id, label)
        out.prefix_cache_reset = "fresh engine (virtual time)" if self.virtual else reset_prefix_cache(spec.engine, self.url)
        warmup = spec.loads.warmup if self.first else 0
        self.first = False
        t = time.monotonic()
        metrics, sat, interrupted = self._run_load(load, label, run_dir, warmup, workers)
        row = self._point_row(load, label, run_dir, warmup, metrics, sat, interrupted)
        out.points.append(row)
        store.write_points(runner.sweep_dir, self.cell_id, out.points)
        runner._echo_point(self.index, self.cell_id, label, row, time.monotonic() - t)
        if interrupted:
            raise SweepInterrupted(self.cell_id)
        if self.virtual is None and not alive(self.url, spec.engine):
            out.status = "failed"
            out.reason = f"engine stopped answering during load {label}"
            out.log_tail = _logs_tail(store.cell_dir(runner.sweep_dir, self.cell_id))
            return None
        return row, bool(row["saturated"])

    def _run_load(
        self, load: Load, label: str, run_dir: Path, warmup: int, workers: int | None
    ) -> tuple[dict[str, Any], Saturation, bool]:
        """One run folder of ``load``: (metrics, saturation, interrupted); measured once more
        when a results-writing fault lost rows."""
        spec, runner, cfg = self.spec, self.runner, self.cfg
        extra = {
            "sweep_id": runner.sweep_id,
            "cell": {**cfg.as_dict(), "cell_id": self.cell_id, "engine": spec.engine, "model": spec.model, "gpu": spec.gpu},
            "load": {"kind": load.kind, "value": load.value, "label": label},
            "workload": self.w.tag,
            "repeat": load.repeat,
            "probe": load.probe,
            "role": load.role,
            "saturated": False,
            "prefix_cache": self.out.prefix_cache_reset,
            **({"engine_info": self.out.engine_info} if self.out.engine_info else {}),
        }
        for attempt in range(2):
            metrics, sat, interrupted = run_load(
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
            )
            if not metrics.get("missing_rows") or interrupted or attempt == 1:
                break
            # a results-writing fault lost rows: judging the load on part of it would be
            # wrong, so keep the incomplete folder aside and measure the load again
            kept = store.set_aside_partial(runner.sweep_dir, self.cell_id, run_dir)
            runner.echo(
                f"{self.index} {self.cell_id} {label}: WARNING: {metrics['missing_rows']} requests have no row in the "
                f"results; measuring this load again (incomplete run kept in {kept})"
            )
        return metrics, sat, interrupted

    def _point_row(
        self,
        load: Load,
        label: str,
        run_dir: Path,
        warmup: int,
        metrics: dict[str, Any],
        sat: Saturation,
        interrupted: bool,
    ) -> dict[str, Any]:
        """The ``points.parquet`` row of one run: the cell, the load, its metrics and verdict,
        and a closed-loop plateau against the previous concurrency of the workload."""
        spec, runner = self.spec, self.runner
        row = {
            **config_columns(spec, self.cfg, self.cell_id),
            "sweep_id": runner.sweep_id,
            **workload_columns(self.w),
            "load_label": label,
            "load_kind": load.kind,
            "load_value": float(load.value),
            "repeat": load.repeat,
            "probe": load.probe,
            "role": load.role,
            "status": "interrupted" if interrupted else "complete",
            "saturated": sat.saturated,
            "saturation_reason": str(sat) if sat.saturated else None,
            "run_dir": str(run_dir.relative_to(runner.sweep_dir)),
            "warmup_requests": warmup,
            **metrics,
        }
        if spec.slo:  # this run's own verdict; the load's pools its runs (judge_load)
            own = judge_load([row], spec.attainment_pct, spec.confidence)
            row["verdict"], row["verdict_reason"] = own.verdict, own.reason or None
        if load.kind == "concurrency" and load.role == "load" and self.out.points:
            prev = [
                p
                for p in self.out.points
                if p["workload"] == self.w.tag and p["load_kind"] == "concurrency" and p.get("role") == "load"
            ]
            if prev:
                plateau = closed_loop_plateau(
                    prev[-1]["throughput_rps"], int(prev[-1]["load_value"]), metrics["throughput_rps"], int(load.value)
                )
                if plateau.saturated:
                    row["saturated"] = True
                    row["saturation_reason"] = "; ".join(filter(None, (row["saturation_reason"], str(plateau))))
        return row

    def measure_pooled(
        self, kind: str, value: float, role: str, requests: int | None = None, prior: list[dict[str, Any]] | None = None
    ) -> LoadJudgement | None:
        """Measure one load (its repeats), then more until its sample decides it: a load
        the client could not measure truthfully once more, an undecided one with twice
        the requests per run, up to ``loads.max_requests`` in all, one too short or not
        stationary in a longer run of its own, up to ``loads.max_requests`` (docs/sweeps.md).
        ``prior``: runs of this load measured before (a confirmation: one more run, pooled)."""
        spec, loads, echo = self.spec, self.spec.loads, self.runner.echo
        rows: list[dict[str, Any]] = list(prior or ())

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
        judgement = judge_load(rows, spec.attainment_pct, spec.confidence)
        if role == "baseline" or not spec.slo:
            return judgement
        remeasured = False
        last = requests or loads.requests
        while True:
            workers = None
            if judgement.untrustworthy and not remeasured:
                remeasured, n = True, last
                # a saturated client gets twice the load-generating processes
                workers = min(64, 2 * spec.workers) if "client saturated" in judgement.untrustworthy else None
                more = f" with {workers} client processes" if workers else ""
                echo(f"{self.index} {self.cell_id}: {fmt_load(kind, value)}: measuring again{more}: {judgement.reason}")
            elif judgement.needs_more and len(rows) - spec.repeats - len(prior or ()) < MAX_REMEASURES:
                if judgement.under_sampled:  # a longer run, judged alone (judge_load): up to max_requests
                    n = min(max(2 * last, last + _needed(judgement.under_sampled)), loads.max_requests)
                    if n <= last and last >= loads.max_requests:
                        break  # the longest run allowed did not settle: not stationary
                else:  # more of the same, pooled: up to max_requests in all
                    n = min(2 * last, loads.max_requests - sum(int(r["requests"]) for r in rows))
                if n < 1:
                    break
                echo(f"{self.index} {self.cell_id}: {fmt_load(kind, value)} undecided ({judgement.reason}); {n} more requests")
            else:
                break
            if not one(n, workers):
                return None
            last = n
            judgement = judge_load(rows, spec.attainment_pct, spec.confidence)
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
            base_e2e_s = float(out.points[-1].get("e2e_p50_ms", float("nan"))) / 1000.0
        else:  # re-judged: the baseline and the probes made are known
            judged = prior_loads(self.spec, self.prior)
            known, base_verdict = list(judged.probes), judged.base_verdict
            base_att, base_e2e_s = judged.base_attainment, judged.base_e2e_s
        window = loads.min_window_s if loads.min_window_s is not None else WINDOW_E2E_MULTIPLE * base_e2e_s
        if not math.isfinite(window):
            window = 0.0
        if base_verdict == "fail":  # decidedly, on a handful of requests: none pass there
            out.capacity[w.tag] = {
                "method": "search",
                "capacity_rps": None,
                "upper_rps": None,
                "precision": loads.capacity_precision,
                "achieved_precision": None,
                "converged": True,
                "probes": 0,
                "note": f"fails the SLOs even one request at a time ({100 * base_att:.0f}% met)",
            }
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
        confirmed: dict[str, Any] | None = None
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
            if confirmed["verdict"] == "pass":
                # the capacity's probe is now the load with its confirmation pooled (as recommend reads it)
                search.probes = [p for p in search.probes if abs(p.rate - cap) > 1e-9]
                search.record(Probe(cap, True, confirmed["pooled_attainment"], sure=bool(confirmed["sure"])))
                break
            # the answer did not hold on a longer, fresh-seed run: the search goes on below it
            search.record(Probe(cap, False, confirmed["attainment"], False, confirmed["verdict"] == "undecided",
                                confirmed["reason"] or ""))  # fmt: skip
            search.max_probes = max(search.max_probes + 1, len(search.probes) + MAX_REMEASURES)
        result = search.result()
        if confirmed is not None and confirmed["rate"] != result.capacity_rps:
            confirmed = None  # the last confirmation failed and no budget was left for another
        out.capacity[w.tag] = {
            "confirmation": confirmed,
            "method": "search",
            "capacity_rps": result.capacity_rps,
            "upper_rps": result.upper_rps,
            "interval_low_rps": result.interval_low_rps,
            "interval_high_rps": result.interval_high_rps,
            "precision": result.precision,
            "achieved_precision": result.achieved_precision,
            "converged": result.converged,
            "probes": len(result.probes),
            "undecided": list(result.undecided),
            "level": result.level,
            "note": result.note,
        }
        echo(f"{index} {cell_id}: capacity {_cap_text(result.capacity_rps, result.upper_rps, cfg.gpus)}"
             + _interval_text(result.interval_low_rps, result.interval_high_rps))  # fmt: skip
        if result.capacity_rps is not None and self.spec.slo:
            echo(f"{index} {cell_id}: {confirmation_text(confirmed, float(self.spec.confidence))}")
        if result.undecided:
            echo(f"{index} {cell_id}: {result.note}")
        return True

    def long_window(self) -> float:
        """``LIFETIMES`` lifetimes of a long request (E2E p90) at the passing rate loads of
        this workload so far, in seconds (0 before any passed)."""
        life = [
            float(p.get("e2e_p90_ms") or 0.0) / 1000.0
            for p in self.out.points
            if p.get("workload") == self.w.tag and p.get("load_kind") == "rate" and p.get("verdict") == "pass"
        ]
        life = [v for v in life if math.isfinite(v)]
        return LIFETIMES * max(life) if life else 0.0

    def confirm(self, rate: float) -> dict[str, Any] | None:
        """Re-run the capacity found as a confirmation load: ``loads.max_requests`` requests
        (longer than any probe) with a fresh seed, pooled with the probe's own runs. Its
        verdict, attainment and interval (None: the engine died)."""
        prior = [
            p
            for p in self.out.points
            if p.get("workload") == self.w.tag and p.get("load_kind") == "rate" and p.get("role") != "baseline"
            and p.get("status") in ("complete", "interrupted") and abs(float(p["load_value"]) - rate) < 1e-9
        ]  # fmt: skip
        n = self.spec.loads.max_requests
        self.runner.echo(f"{self.index} {self.cell_id}: confirming {rate:g} req/s: {n} requests, a fresh seed")
        before = len(self.out.points)
        j = self.measure_pooled("rate", rate, "confirm", n, prior)
        if j is None:
            return None
        runs = self.out.points[before:]
        last = runs[-1] if runs else {}
        return {
            "rate": rate,
            "verdict": j.verdict,
            "reason": j.reason or None,
            "requests": int(last.get("requests") or 0),
            "attainment": float(last.get("attainment", math.nan)),
            "pooled_requests": j.judged,
            "pooled_attainment": j.attainment,
            "low": j.low,
            "high": j.high,
            "sure": j.sure,
        }

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
                {
                    **config_columns(spec, self.cfg, self.cell_id),
                    "sweep_id": self.runner.sweep_id,
                    **workload_columns(self.w),
                    "load_label": label,
                    "load_kind": k2,
                    "load_value": float(v2),
                    "repeat": 0,
                    "probe": False,
                    "role": "load",
                    "status": "skipped",
                    "saturated": True,
                    "saturation_reason": f"skipped: saturated at {kind} {value:g}",
                }
            )
        store.write_points(self.runner.sweep_dir, self.cell_id, out.points)

    def _rate_list_capacity(self, probes: list[Probe]) -> None:
        from bench_llm.analysis.capacity import capacity_from_probes

        result = capacity_from_probes(probes, precision=float("nan"))
        self.out.capacity[self.w.tag] = {
            "method": "rate list",
            "capacity_rps": result.capacity_rps,
            "upper_rps": result.upper_rps,
            "precision": None,
            "achieved_precision": result.achieved_precision,
            "converged": result.upper_rps is not None,
            "probes": len(probes),
            "undecided": list(result.undecided),
            "level": result.level,
            "note": result.note,
        }
        cap = _cap_text(result.capacity_rps, result.upper_rps, self.cfg.gpus)
        self.runner.echo(f"{self.index} {self.cell_id}: capacity {cap}")


class PriorLoads(NamedTuple):
    """A cell's measured loads of one workload, pooled and judged as the sweep judges them."""

    probes: tuple[Probe, ...]  # the rate loads, as capacity-search probes
    base_verdict: str | None  # the one-at-a-time baseline's verdict (None: none measured)
    base_attainment: float
    base_e2e_s: float


def prior_loads(spec: SweepSpec, rows: list[dict[str, Any]]) -> PriorLoads:
    pooled = pooled_loads(pd.DataFrame(rows), spec.attainment_pct, spec.confidence) if rows else pd.DataFrame()
    if pooled.empty:
        return PriorLoads((), None, math.nan, math.nan)
    base = pooled[pooled["_base"]]
    b = base.iloc[0] if len(base) else None

    def num(key: str) -> float:
        v = b.get(key) if b is not None else None
        return float(v) if v is not None else math.nan

    verdict = b.get("verdict") if b is not None else None
    return PriorLoads(tuple(rate_probes(pooled)), verdict, num("attainment"), num("e2e_p50_ms") / 1000.0)


def seeded_capacity_search(spec: SweepSpec, start: float, base_e2e_s: float, known: list[Probe] | None = None) -> CapacitySearch:
    """A cell's capacity search from ``start``; ``known``: probes measured before (a resumed,
    re-judged cell), from which the search goes on as if it had made them itself."""
    loads = spec.loads
    known = list(known or ())
    return CapacitySearch(
        start=start,
        precision=loads.capacity_precision,
        max_probes=len(known) + loads.capacity_max_probes,
        max_rate=loads.capacity_max_rate,
        # a quarter of the one-at-a-time rate is nearly unloaded: a configuration that
        # passed one at a time but fails there is reported below it rather than probed
        # at ever slower (and ever longer) rates
        min_rate=max(
            loads.capacity_min_rate,
            0.25 / base_e2e_s if math.isfinite(base_e2e_s) and base_e2e_s > 0 else 0.0,
        ),
        probes=known,
    )


#: A re-judged rate list halves below its lowest listed rate down to this fraction of it (a
#: list has no one-at-a-time baseline to say how low "unloaded" is); below that it stays unknown.
GAP_FLOOR = 1 / 8


def gap_search(spec: SweepSpec, probes: list[Probe]) -> CapacitySearch | None:
    """A rate list re-judged so that no listed rate passes: halve below the lowest until one
    passes, at most down to GAP_FLOOR of it (the bracket is the answer; a list sets no
    precision). None: no gap."""
    if not spec.slo or not probes or any(p.passed for p in probes):
        return None
    loads = spec.loads
    lowest = min(p.rate for p in probes)
    return CapacitySearch(
        start=lowest,
        precision=math.inf,
        max_probes=len(probes) + loads.capacity_max_probes,
        max_rate=loads.capacity_max_rate,
        min_rate=max(loads.capacity_min_rate, GAP_FLOOR * lowest),
        probes=list(probes),
    )


def missing_loads(spec: SweepSpec, priors: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The next load each workload's re-judged search would probe (empty: the measured loads
    decide every verdict, nothing to measure)."""
    out = []
    for w in spec.cell_workloads:
        judged = prior_loads(spec, priors.get(w.tag) or [])
        search: CapacitySearch | None
        if spec.loads.capacity:
            if judged.base_verdict == "fail":
                continue
            e2e = judged.base_e2e_s
            start = spec.loads.capacity_start or (2.0 / e2e if math.isfinite(e2e) and e2e > 0 else 1.0)
            search = seeded_capacity_search(spec, start, e2e, list(judged.probes))
        else:
            search = gap_search(spec, list(judged.probes))
        rate = search.next_rate() if search is not None else None
        if rate is not None:
            out.append(f"{w.tag} at {rate:g} req/s" if len(spec.cell_workloads) > 1 else f"{rate:g} req/s")
    return out


def _needed(reason: str) -> int:
    """The N of a too-short run's reason ("undecided: N more requests needed (...)"): how many
    more requests than it sent a run needs to be long enough (0: it did not say)."""
    import re

    m = re.search(r"(\d+) more requests needed", reason)
    return 0 if m is None else int(m.group(1))


def fmt_load(kind: str, value: float) -> str:
    return f"{value:g} req/s" if kind == "rate" else f"concurrency {int(value)}"


def confirmation_text(c: dict[str, Any] | None, level: float) -> str:
    """The confirmation line printed beside a capacity."""
    if c is None:
        return "capacity NOT CONFIRMED: every confirmation load failed (the capacity is the highest passing probe below them)"
    att = 100 * float(c["attainment"])
    head = f"confirmed: {c['requests']} requests at {c['rate']:g} req/s (fresh seed) met {att:.1f}%"
    if c["verdict"] != "pass":
        head = f"NOT confirmed ({c['verdict']}): {c['requests']} requests at {c['rate']:g} req/s (fresh seed) met {att:.1f}%"
    return head + f"; with its probe, {100 * float(c['pooled_attainment']):.1f}% of {c['pooled_requests']}, {100 * level:g}% interval {100 * float(c['low']):.1f}-{100 * float(c['high']):.1f}%"


def _interval_text(low: float | None, upper: float | None) -> str:
    if low is None:
        return ""
    return f"; interval [{low:g}, {f'{upper:g}' if upper is not None else 'inf'}) req/s"


def _shout(reason: str) -> str:
    """A load's reason with its first clause upper-cased ("UNDECIDED: 26 more requests
    needed ...", "NOT STATIONARY: ..."); "UNDER-SAMPLED: ..." for any other."""
    head, sep, rest = reason.partition(": ")
    if sep and head in ("undecided", "not stationary"):
        return f"{head.upper()}: {rest}"
    return f"UNDER-SAMPLED: {reason}"


def _cap_text(cap: float | None, upper: float | None, gpus: int) -> str:
    if cap is None:
        return "none (no load met the SLOs" + (f"; lowest tried failed at {upper:g} req/s)" if upper else ")")
    up = f" (fails at {upper:g})" if upper is not None else " (no failing load found: a lower bound)"
    return f"{cap:g} req/s, {cap / gpus:.3g} req/s per GPU{up}"


def _start_failure(said: str, log: str) -> str:
    """One line: the engine's last meaningful log line first, then what the launcher saw."""
    said = said.splitlines()[0] if said else "no reason given"
    said = said.split("; last log lines")[0].rstrip(":; ")
    last = [ln.strip() for ln in log.splitlines() if ln.strip()]
    if last and last[-1] not in said:
        return f"engine failed to start: {last[-1][:300]} ({said})"
    return f"engine failed to start: {said}"


def _logs_tail(cdir: Path, lines: int = 20) -> str:
    """The tail of the cell's engine log(s): engine.log, then any per-process logs."""
    logs = sorted(cdir.glob("engine*.log"), key=lambda p: (p.name != "engine.log", p.name))
    parts = []
    for p in logs:
        t = tail(p, lines)
        if t:
            parts.append(t if len(logs) == 1 else f"== {p.name} ==\n{t}")
    return "\n".join(parts)


def _served_model(spec: SweepSpec) -> str:
    return spec.model
