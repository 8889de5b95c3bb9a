"""One cell: launch, readiness, warm-up, prefix-cache reset, the measured loads, teardown.

Every load is an ordinary run folder; the cell's ``points.parquet`` is rewritten after each
load so a crash loses at most the load in progress. An engine that fails to start or dies
mid-cell fails the cell with its log tail; the sweep goes on.

The loads of each workload: bench/sweep/cell_loads.py; the searches a re-judged cell goes on
with: cell_search.py; what a cell gives back: cell_outcome.py; the lines it prints: cell_echo.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench_llm.analysis.recommend_diagnosis import diagnose_cell
from bench_llm.analysis.recommend_io import load_points
from bench_llm.analysis.slo import SLO
from bench_llm.bench.sweep import store
from bench_llm.bench.sweep.cell_echo import Echo
from bench_llm.bench.sweep.cell_loads import WorkloadLoads
from bench_llm.bench.sweep.cell_outcome import CellOutcome, failed_deployment, logs_tail
from bench_llm.bench.sweep.cell_search import missing_loads
from bench_llm.bench.sweep.engines import CellEngine, EngineStartError, Launcher, VirtualHandle
from bench_llm.bench.sweep.loads import RemoteLoadError
from bench_llm.bench.sweep.spec import SweepSpec
from bench_llm.bench.virtual import VirtualEngine
from bench_llm.launch.config import ParallelConfig
from bench_llm.results.sweep_rows import PointRow

if TYPE_CHECKING:
    from bench_llm.loadgen.otlp import OtlpReceiver


def cell_engine(spec: SweepSpec, cfg: ParallelConfig, dry_run: bool = False) -> CellEngine:
    """What the launcher gets for one cell (a tuning cell's flags travel in ``cfg.extra_args``);
    ``dry_run``: a variable passed by name shows ``***`` (``SweepSpec.engine_env_pairs``)."""
    env = spec.engine_env_pairs(dry_run=dry_run)
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
        #: where the cell's loads run when not here (a Kubernetes load Job, ``loads.RemoteLoads``)
        self.remote: Any = None

    def run(self, cfg: ParallelConfig, cell_id: str, index: str, prior: list[PointRow] | None = None) -> CellOutcome:
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
                     prior: list[PointRow] | None = None) -> CellOutcome:  # fmt: skip
        """Measure the cell. ``prior``: a complete cell's points, re-judged at the sweep's
        (changed) SLOs (orchestrate.rejudged_points): its capacity searches continue from them, and
        only the loads the new verdicts need are measured, the engine started only for them."""
        spec = self.spec.for_cell(cfg)
        cdir = store.cell_dir(self.sweep_dir, cell_id)
        cdir.mkdir(parents=True, exist_ok=True)
        priors: dict[str, list[PointRow]] = {}
        if prior is not None:
            priors = {w.tag: [p for p in prior if p.workload.workload == w.tag] for w in spec.cell_workloads}
            wanted = missing_loads(spec, priors)
            self.echo(
                f"{index} {cell_id}: measured loads re-judged at {SLO.from_dict(spec.slo)}: "
                + (f"probing the missing loads, from {', '.join(wanted)}" if wanted else "no load missing")
            )
            if not wanted:
                out = CellOutcome("complete", points=list(prior))
                for w in spec.cell_workloads:
                    WorkloadLoads(self, cfg, cell_id, index, w, "", "", out, False, priors[w.tag]).run()
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
            # the error carries the tail of the process that failed (a replica's own log for
            # DP / disaggregated cells); fall back to the cell's logs
            log = exc.log.strip("\n") or logs_tail(cdir) or str(exc)
            return CellOutcome("failed", _start_failure(exc.summary, log), log)
        out = CellOutcome("complete", points=list(prior or ()))
        self.virtual = handle.engine if isinstance(handle, VirtualHandle) else None
        self.remote = getattr(handle, "remote", None)  # loads run on the cluster (cluster_kube)
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
                ok = WorkloadLoads(self, cfg, cell_id, index, w, handle.url, served, out, first_run, rows).run()
                first_run = False
                if not ok:
                    break
        except RemoteLoadError as exc:  # a load run on the cluster failed: the cell fails, the sweep goes on
            out.status, out.reason, out.log_tail = "failed", str(exc), exc.log_tail or logs_tail(cdir)
        finally:
            handle.stop()
        return out


def _start_failure(said: str, log: str) -> str:
    """One line: the engine's last meaningful log line first, then what the launcher saw."""
    said = said.splitlines()[0].rstrip(":; ") if said else "no reason given"
    last = [ln.strip() for ln in log.splitlines() if ln.strip()]
    if last and last[-1] not in said:
        return f"engine failed to start: {last[-1][:300]} ({said})"
    return f"engine failed to start: {said}"


def _served_model(spec: SweepSpec) -> str:
    return spec.model
