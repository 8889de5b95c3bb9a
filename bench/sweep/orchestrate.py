"""Running a whole sweep: plan the cells, run each in turn (in virtual time several at once,
``bench.sweep.parallel``), resume, recommend."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench_llm.analysis.recommend_io import JUDGING
from bench_llm.bench.sweep import store
from bench_llm.bench.sweep.cell import CellRunner
from bench_llm.bench.sweep.cell_outcome import CellOutcome, SweepInterrupted, config_columns
from bench_llm.bench.sweep.engines import DefaultLauncher, DeploymentLauncher, Launcher, VirtualLauncher
from bench_llm.bench.sweep.fingerprint import cell_fingerprint
from bench_llm.bench.sweep.matrix import PlannedCell, expand, impossible_matrix
from bench_llm.bench.sweep.model_error import model_error_columns
from bench_llm.bench.sweep.parallel import CellTask, SweepContext, child_start_method, prestart, run_cells, worker_count
from bench_llm.bench.sweep.repeat_workers import repeat_workers
from bench_llm.bench.sweep.spec import LEGACY_DEFAULTS, WORKLOAD_AXES, SweepSpec, spec_from_dict
from bench_llm.core import __version__
from bench_llm.core.errors import BenchError
from bench_llm.launch.config import ParallelConfig
from bench_llm.results.outdir import LOCK_FILE
from bench_llm.results.sweep_rows import (
    CapacityRecord,
    CellRow,
    Judging,
    PointRow,
    SweepFile,
    capacity_json,
    point_rows,
)

if TYPE_CHECKING:
    from bench_llm.loadgen.otlp import OtlpReceiver

Echo = Callable[[str], None]

#: Spec fields that may change between a sweep and its --resume: they do not alter measured
#: cells, or (JUDGING: the SLOs, attainment target, confidence) only how their loads are judged;
#: then the measured loads are re-judged and each search probes what the new verdicts need.
RESUMABLE_CHANGES = {"matrix", "gpus", "target_rate", "target_concurrency", "ready_timeout_s", *JUDGING}

FINISHED = ("complete", "skipped")

#: The matrix's workload axes (MatrixSpec): unlike its other axes they may not change on resume.


@dataclass(frozen=True)
class SweepResult:
    sweep_dir: Path
    ran: tuple[str, ...]
    reused: tuple[str, ...]
    failed: tuple[str, ...]
    skipped: tuple[str, ...]
    interrupted: bool = False


class _Book:
    """A sweep's cell rows while its cells run (one process or several, ``bench.sweep.parallel``):
    a cell's row is marked running when it starts and stored with its outcome when it ends."""

    def __init__(self, spec: SweepSpec, sweep_dir: Path, rows: dict[str, CellRow], rejudge: set[str],
                 save: Callable[[], None]) -> None:  # fmt: skip
        self.spec, self.sweep_dir, self.rows, self.rejudge, self.save = spec, sweep_dir, rows, rejudge, save
        self.ran: set[str] = set()
        self.priors: dict[str, list[PointRow] | None] = {}

    def started(self, task: CellTask) -> CellTask:
        """The cell's row before it runs; the task with a re-judged cell's points."""
        spec, sweep_dir, cid = self.spec, self.sweep_dir, task.cell_id
        prior = rejudged_points(sweep_dir, cid, spec) if cid in self.rejudge else None
        self.priors[cid] = prior
        if prior is None:
            store.set_aside_partial(sweep_dir, cid)
            self.rows[cid] = replace(self.rows[cid], status="running", reason=None, log_tail=None,
                                     started_unix_s=time.time(), ended_unix_s=None,
                                     fingerprint=json.dumps(cell_fingerprint(spec.model), sort_keys=True))  # fmt: skip
            self.save()
        return replace(task, prior=prior)

    def stopped(self, task: CellTask) -> None:
        """A cell cut short (Ctrl-C): --resume runs it again; a re-judged cell stays complete
        (its earlier loads stand)."""
        if self.priors.get(task.cell_id) is None:
            self.rows[task.cell_id] = replace(self.rows[task.cell_id], status="running",
                                              reason="interrupted; rerun with --resume")  # fmt: skip
            self.save()

    def finished(self, task: CellTask, outcome: CellOutcome, echo: Echo) -> None:
        """A cell's outcome into its row, stored at once."""
        spec, row, i = self.spec, self.rows[task.cell_id], task.index
        self.ran.add(task.cell_id)
        if self.priors.get(task.cell_id) is not None and outcome.status == "failed":
            # the cell's measured loads stand; its verdicts at these SLOs wait on the missing loads
            echo(f"{i} {task.cell_id}: the missing loads were not measured: {outcome.reason}")
            return
        row = _record_outcome(row, outcome, rejudged=self.priors.get(task.cell_id) is not None)
        row = _set_capacity(row, outcome.capacity, spec, task.config)
        if row.status == "complete" and spec.slo:
            row = replace(row, limiting_factor=outcome.limiting_factor)
        self.rows[task.cell_id] = row
        self.save()
        if outcome.status == "failed":
            echo(f"{i} {task.cell_id}: FAILED: {outcome.reason}")
            for line in (outcome.log_tail or "").splitlines()[-8:]:
                echo(f"    | {line}")


def _check_resume(stored: SweepFile, spec: SweepSpec) -> None:
    old = {**LEGACY_DEFAULTS, **(stored.spec or {})}
    new = spec.as_dict()
    differ = sorted(k for k in new if k not in RESUMABLE_CHANGES and _norm(old.get(k)) != _norm(new[k]))
    # a workload axis is measured inside every cell: a finished cell would lack a new value
    differ += [f"matrix.{k}" for k in WORKLOAD_AXES if _norm((old.get("matrix") or {}).get(k) or []) != _norm(new["matrix"][k])]
    if differ:
        raise BenchError(
            f"--resume: this sweep was defined differently ({', '.join(differ)} changed); "
            "rerun with the same settings or choose a new --out"
        )


def _norm(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    if isinstance(v, dict):  # a field added since (None by default) is no change
        return {k: _norm(x) for k, x in v.items() if x is not None}
    return v


def stored_spec(sweep_dir: Path) -> SweepSpec | None:
    data = store.read_sweep_file(sweep_dir)
    if data is None or data.spec is None:
        return None
    return spec_from_dict(dict(data.spec))


def run_sweep(
    spec: SweepSpec,
    sweep_dir: Path,
    *,
    resume: bool = False,
    retry_failed: bool = False,
    launcher: Launcher | None = None,
    echo: Echo = print,
    progress: bool | None = None,
    command: tuple[str, ...] = (),
    otlp: OtlpReceiver | None = None,
    jobs: int | None = 1,
    hold: Callable[[str], str | None] | None = None,
) -> SweepResult:
    """``hold``: cell id -> why the cell is held back this time (recorded as skipped with that
    reason; a later call, resumed, decides again) or None to run it (``bench.sweep.plan``).
    ``jobs``: cells run at once in virtual time (None: one per CPU, ``bench sweep``'s
    default; ``bench.sweep.parallel``);
    a sweep in real time runs one cell at a time (``SettingError`` when more are asked).
    ``otlp``: one started receiver for the whole sweep (``bench sweep --otlp-receiver``); each
    launched cell's engine exports its request spans to it (cells run one at a time, and each
    load takes only the spans that arrive during it, joined by request id)."""
    spec, launcher = _with_launcher(spec, launcher)
    if otlp is not None and spec.virtual:
        raise BenchError("--otlp-receiver: a sweep in virtual time has no engine to send spans; use --clock auto")
    if otlp is not None and spec.cluster is not None:  # the nodes' engines must reach it (cluster.otlp_refusal)
        from bench_llm.bench.sweep.cluster import otlp_refusal

        if (why := otlp_refusal(spec.cluster, jobs)) is not None:
            raise BenchError(why)
    sweep_dir = Path(sweep_dir)
    stored, sweep_id = _open_sweep(spec, sweep_dir, resume)
    planned = expand(spec, launcher.unsupported)
    if hasattr(launcher, "manager_refusals"):  # a cluster's manager asked before anything starts
        planned = launcher.manager_refusals(spec, planned)
    if (impossible := impossible_matrix(planned)) is not None:  # refused before anything is written
        raise BenchError(impossible)
    # refused before anything is written; on a cluster cells run side by side as concurrent jobs
    workers = worker_count(jobs, len(planned), spec.virtual, side_by_side=spec.cluster is not None)
    _write_sweep_json(sweep_dir, sweep_id, spec, stored, command, planned)
    previous = {r.cell_id: r for r in store.read_cell_rows(sweep_dir)}
    # complete cells judged under other SLOs than these: re-judged, their gaps probed
    was = judging({**LEGACY_DEFAULTS, **(stored.spec or {})}) if stored else judging(spec.as_dict())
    rejudge = {cid for cid, r in previous.items() if r.status == "complete" and _judged_at(r, was) != judging(spec.as_dict())}
    rows = _initial_rows(spec, planned, previous, retry_failed)
    held = _hold(spec, planned, rows, hold)

    def save() -> None:
        # cells not started yet are not written: cells.parquet lists complete|failed|skipped|running
        store.write_cell_rows(sweep_dir, [r for r in rows.values() if r.status != "pending"])

    save()
    if resume and hasattr(launcher, "recover"):  # the jobs a killed sweep left on the cluster
        for job in launcher.recover(sweep_dir):
            echo(f"cancelled job {job}, left running by the interrupted sweep")
    todo = [
        c
        for c in planned
        if not c.skip_reason and c.cell_id not in held and (rows[c.cell_id].status not in ("complete", "failed") or c.cell_id in rejudge)
    ]
    total = len(todo)
    workers = min(workers, total)
    if workers > 1:
        prestart()  # a fork server, when the cells come from one (resumed), imports bench meanwhile
    reused = _announce(echo, sweep_id, sweep_dir, planned, todo, rows, resume)
    # in virtual time a cell's answer is its own: its search does not start from what other
    # cells found, so a cell gives the same figures alone, in any matrix, in any process
    hint = None if spec.virtual else _capacity_hint(rows)
    book = _Book(spec, sweep_dir, rows, rejudge, save)
    tasks = [CellTask(i, c.cell_id, c.config, f"[{i}/{total}]") for i, c in enumerate(todo, 1)]
    if workers > 1:
        ctx = SweepContext(spec, sweep_dir, sweep_id, progress, None if spec.virtual else launcher, jobs)
        interrupted = run_cells(tasks, ctx, workers, echo, book.started, book.finished, book.stopped)
    else:
        runner = CellRunner(spec, sweep_dir, sweep_id, launcher, echo, progress, hint, otlp)
        interrupted = False
        with repeat_workers(spec, jobs, child_start_method) if tasks else contextlib.nullcontext():  # a cell's repeat searches side by side
            for task in tasks:
                task = book.started(task)
                try:
                    outcome = runner.run(task.config, task.cell_id, task.index, task.prior)
                except (SweepInterrupted, KeyboardInterrupt):
                    book.stopped(task)
                    interrupted = True
                    break
                book.finished(task, outcome, echo)
    ran = [c.cell_id for c in todo if c.cell_id in book.ran]
    final = list(rows.values())
    return SweepResult(
        sweep_dir,
        tuple(ran),
        tuple(reused),
        tuple(r.cell_id for r in final if r.status == "failed"),
        tuple(r.cell_id for r in final if r.status == "skipped"),
        interrupted,
    )


def _hold(spec: SweepSpec, planned: list[PlannedCell], rows: dict[str, CellRow],
          hold: Callable[[str], str | None] | None) -> set[str]:
    """The cells ``hold`` holds back this time, their rows marked skipped with its reason; a cell
    held back earlier (skipped, though the matrix can run it) and released now is pending again."""
    held: set[str] = set()
    if hold is None:
        return held
    for c in planned:
        row = rows[c.cell_id]
        if c.skip_reason or row.status not in ("pending", "running", "skipped"):
            continue
        reason = hold(c.cell_id)
        if reason is not None:
            held.add(c.cell_id)
            rows[c.cell_id] = _base_row(spec, c, "skipped", reason)
        elif row.status == "skipped":
            rows[c.cell_id] = _base_row(spec, c, "pending", None)
    return held


def _with_launcher(spec: SweepSpec, launcher: Launcher | None) -> tuple[SweepSpec, Launcher]:
    """The spec with its clock settled and validated, and the launcher that starts (or finds)
    its engines: the one given, the spec's running deployments, virtual, or the default."""
    if launcher is not None and spec.clock is None:
        spec = replace(spec, clock="auto")  # a launcher starts engines: they are measured live
    spec = spec.with_clock()
    spec.validate()
    if launcher is None and spec.endpoints:  # running deployments: measured where they are
        launcher = DeploymentLauncher({e.name: e.url for e in spec.endpoints})
    if launcher is None and spec.cluster is not None:  # placed on the cluster's nodes by its manager
        from bench_llm.bench.sweep.cluster import ClusterLauncher

        launcher = ClusterLauncher(spec.cluster)
    if launcher is None:
        launcher = VirtualLauncher() if spec.virtual else DefaultLauncher(spec.engine_version)
    return spec, launcher


def _open_sweep(spec: SweepSpec, sweep_dir: Path, resume: bool) -> tuple[SweepFile | None, str]:
    """The sweep already stored in ``sweep_dir`` (checked against ``spec`` on --resume) or None,
    and the sweep's id; ``BenchError`` for a directory that may not be used."""
    stored = store.read_sweep_file(sweep_dir)
    if stored is not None and not resume:
        raise BenchError(f"{sweep_dir} already holds a sweep; pass --resume to finish it, or choose another --out")
    if stored is not None:
        _check_resume(stored, spec)
        return stored, stored.sweep_id
    if sweep_dir.exists() and any(p.name != LOCK_FILE for p in sweep_dir.iterdir()):
        raise BenchError(f"{sweep_dir} exists and is not empty; choose another --out")
    return None, _virtual_sweep_id(spec) if spec.virtual else uuid.uuid4().hex[:12]


def _write_sweep_json(sweep_dir: Path, sweep_id: str, spec: SweepSpec, stored: SweepFile | None,
                      command: tuple[str, ...], planned: list[PlannedCell]) -> None:
    """The sweep's definition (sweep.json); a resumed sweep keeps its command and creation time."""
    created = stored.created_unix_s if stored is not None and stored.created_unix_s is not None else time.time()
    store.write_sweep_json(
        sweep_dir,
        SweepFile(
            sweep_id=sweep_id,
            bench_version=__version__,
            spec=spec.as_dict(),
            command=(stored.command if stored is not None else None) or (" ".join(command) if command else None),
            cells=tuple(c.cell_id for c in planned),
            created_unix_s=created,
            updated_unix_s=time.time(),
        ),
    )


def _initial_rows(spec: SweepSpec, planned: list[PlannedCell], previous: dict[str, CellRow],
                  retry_failed: bool) -> dict[str, CellRow]:
    """Each cell's row before the run: kept from ``previous`` when finished (or failed without
    --retry-failed), else pending or skipped."""
    rows: dict[str, CellRow] = {}
    for c in planned:
        old = previous.get(c.cell_id)
        if old and (old.status in FINISHED or (old.status == "failed" and not retry_failed)):
            rows[c.cell_id] = old
        else:
            rows[c.cell_id] = _base_row(spec, c, "skipped" if c.skip_reason else "pending", c.skip_reason)
    # cells of an earlier matrix that this one no longer lists are kept (their data is on disk)
    for cid, old in previous.items():
        rows.setdefault(cid, old)
    return rows


def _announce(echo: Echo, sweep_id: str, sweep_dir: Path, planned: list[PlannedCell], todo: list[PlannedCell],
              rows: dict[str, CellRow], resume: bool) -> list[str]:
    """Print the sweep's plan and each cell skipped or kept; the ids of the cells kept."""
    total = len(todo)
    echo(
        f"sweep {sweep_id}: {len(planned)} cells, {total} to run"
        + (f", {sum(1 for c in planned if c.skip_reason)} skipped" if any(c.skip_reason for c in planned) else "")
        + (f", {len(planned) - total - sum(1 for c in planned if c.skip_reason)} already done" if resume else "")
        + f" -> {sweep_dir}"
    )
    reused: list[str] = []
    for c in planned:
        if c.skip_reason:
            echo(f"skip {c.cell_id}: {c.skip_reason}")
        elif c.cell_id not in [t.cell_id for t in todo]:
            reused.append(c.cell_id)
            echo(f"done {c.cell_id}: {rows[c.cell_id].status} (kept from the earlier run)")
    return reused


def _record_outcome(row: CellRow, outcome: CellOutcome, rejudged: bool) -> CellRow:
    """A run cell's row after its run: status, reason, end time, the engine it ran on. A
    re-judged cell run without a launch keeps the engine fields it had."""
    row = replace(row, status=outcome.status, reason=outcome.reason, log_tail=outcome.log_tail, ended_unix_s=time.time())
    # re-judged without a launch: kept
    if not rejudged or outcome.engine_version is not None:
        row = replace(row, engine_version=outcome.engine_version)
    if not rejudged or outcome.engine_argv is not None:
        row = replace(row, engine_argv=outcome.engine_argv)
    if not rejudged or outcome.prefix_cache_reset is not None:
        row = replace(row, prefix_cache_reset=outcome.prefix_cache_reset)
    if outcome.engine_info:
        row = replace(row, engine_info=json.dumps(outcome.engine_info, sort_keys=True, default=str))
    elif not rejudged:
        row = replace(row, engine_info=None)
    return row


def _virtual_sweep_id(spec: SweepSpec) -> str:
    """In virtual time the sweep's answer is a function of its definition, and so is its id
    (it is on every point: the same sweep gives byte-identical points)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(spec.as_dict(), sort_keys=True).encode()).hexdigest()[:12]


def _base_row(spec: SweepSpec, c: PlannedCell, status: str, reason: str | None) -> CellRow:
    return CellRow(config_columns(spec, c.config, c.cell_id), status, reason)


def _set_capacity(row: CellRow, capacity: dict[str, CapacityRecord], spec: SweepSpec, cfg: ParallelConfig) -> CellRow:
    if not capacity:
        return row
    # the settings its verdicts were made under
    judged = {tag: record.with_judged(judging(spec.as_dict())) for tag, record in capacity.items()}
    first = judged.get(spec.cell_workloads[0].tag) or next(iter(judged.values()))
    cap = first.capacity_rps
    per_gpu = cap / cfg.gpus if cap is not None else None
    # the simulated engine's error, on its cell
    return replace(row, capacity_rps=cap, capacity_rps_per_gpu=per_gpu, capacity_json=capacity_json(judged),
                   model_error=model_error_columns(spec.engine, spec.engine_args) or None)  # fmt: skip


def judging(spec: dict[str, Any]) -> Judging:
    """The settings a sweep's verdicts depend on (analysis.recommend_io.JUDGING), comparable."""
    return Judging.from_row({k: _norm(spec.get(k)) for k in JUDGING})


def _judged_at(row: CellRow, default: Judging) -> Judging:
    """The settings a complete cell's verdicts were made under (``default``: a cell stored
    before cells recorded them, or one without a capacity record)."""
    records = row.capacity.values()
    return next((r.judged for r in records if r.judged is not None), default)


def rejudged_points(sweep_dir: Path, cell_id: str, spec: SweepSpec) -> list[PointRow]:
    """A complete cell's points with attainment and verdicts recomputed from their run folders
    under the spec's SLOs (what ``bench recommend --slo`` does, kept in points.parquet)."""
    from bench_llm.analysis.capacity import judge_load
    from bench_llm.analysis.recommend_io import rescored
    from bench_llm.analysis.slo import SLO

    slo = SLO.from_dict(spec.slo)
    rows = []
    for row in store.read_points(sweep_dir, cell_id):
        row = rescored(sweep_dir, row, slo)
        if spec.slo and row.measured:
            own = judge_load(point_rows([row]), spec.attainment_pct, spec.confidence)
            row = row.with_verdict(own.verdict, own.reason or None)
        rows.append(row)
    return rows


def _capacity_hint(rows: dict[str, CellRow]) -> Callable[[ParallelConfig, str], float | None]:
    """Start each capacity search near what earlier cells found, scaled by GPUs."""

    def hint(cfg: ParallelConfig, workload: str) -> float | None:
        per_gpu = []
        for r in rows.values():
            if r.status == "complete" and r.capacity_json:
                record = r.capacity.get(workload)
                cap = record.capacity_rps if record is not None else None
                if cap:
                    per_gpu.append(cap / r.cell.gpus)
        if not per_gpu:
            return None
        return max(per_gpu) * cfg.gpus

    return hint
