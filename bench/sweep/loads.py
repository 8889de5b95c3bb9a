"""One measured load inside a cell: schedule, run folder, metrics, saturation verdict."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bench_llm.analysis.capacity_points import PointMetrics, point_metrics
from bench_llm.analysis.capacity_saturation import Saturation, admission_saturation, open_loop_saturation
from bench_llm.analysis.load import Run, load_run
from bench_llm.analysis.server_signals import server_signals
from bench_llm.analysis.slo import SLO
from bench_llm.bench.exact_prompts import OFF, exact_by_default, sample_prompts
from bench_llm.bench.sweep.spec import SweepSpec, WorkloadSpec, spec_from_dict
from bench_llm.bench.virtual import VirtualEngine
from bench_llm.core.config import ConfigError, from_mapping
from bench_llm.core.errors import BenchError
from bench_llm.launch.profiles import adapter_for_engine
from bench_llm.loadgen.runner import RunOptions
from bench_llm.loadgen.transport import Timeouts
from bench_llm.results.reader import read_run_meta, read_server_metrics
from bench_llm.results.schema import RUN_FILE
from bench_llm.results.sweep_rows import RunMeta
from bench_llm.results.writer import write_run_meta
from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.prompts import make_synth, word_prompts_exact
from bench_llm.workloads.spec import Schedule

if TYPE_CHECKING:
    import pyarrow as pa

    from bench_llm.loadgen.otlp import OtlpReceiver


class RemoteLoadError(BenchError):
    """A load run elsewhere failed (its Job failed, its results did not come back): the cell
    fails with ``reason``; ``log_tail``: the last lines of its log."""

    def __init__(self, reason: str, log_tail: str = "") -> None:
        super().__init__(reason)
        self.log_tail = log_tail


class RemoteLoads(Protocol):
    """Runs a load elsewhere (a cluster's load Job, ``bench.sweep.cluster_kube``) and leaves its
    run folder in ``run_dir``; (measured requests it should have, interrupted)."""

    def run_load(self, run_dir: Path, job: LoadJob) -> tuple[int, bool]: ...


@dataclass(frozen=True)
class Measured:
    """What ``run_load`` gives back for one run: its figures (with ``missing_rows``: scheduled
    requests that have no row in the results, a results-writing fault), its saturation verdict
    and whether it was interrupted."""

    figures: PointMetrics
    missing_rows: int
    saturation: Saturation
    interrupted: bool

    def columns(self) -> dict[str, Any]:
        """The run's figures as ``points.parquet`` columns (``PointRow.metrics``)."""
        return {**self.figures.as_row(), "missing_rows": self.missing_rows}


@dataclass(frozen=True)
class Load:
    kind: str  # "rate" | "concurrency"
    value: float
    workload: WorkloadSpec
    repeat: int = 0
    #: "load" (a listed load), "probe" (capacity search) or "baseline" (one request at a time)
    role: str = "load"
    #: measured requests (None: the sweep's)
    requests: int | None = None
    #: position of this load in its cell: each load gets its own prompts, so a later load
    #: never hits the prefix cache on an earlier load's prompts (same lengths and arrivals
    #: process, different text)
    seq: int = 0

    @property
    def probe(self) -> bool:
        return self.role == "probe"

    def label(self, several_workloads: bool, repeats: int) -> str:
        v = f"{self.value:g}"
        core = f"rate-{v}" if self.kind == "rate" else f"conc-{int(self.value)}"
        if self.role == "baseline":
            core = "baseline-" + core
        if several_workloads:
            core = f"{self.workload.tag}-{core}"
        if repeats > 1:
            core += f"-r{self.repeat + 1}"
        return core

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> Load:
        """A load as ``to_row`` wrote it (ConfigError naming the key of a value of the wrong kind)."""
        return from_mapping(cls, dict(d), "load")


@dataclass(frozen=True)
class LoadJob:
    """One load as it runs elsewhere (a cluster's load Job): ``run_load``'s arguments but the
    run folder, the engine's URL and the client's own (the pod has its own)."""

    spec: SweepSpec
    load: Load
    served_model: str
    extra: RunMeta
    warmup: int
    engine_version: str | None = None

    def to_row(self) -> dict[str, Any]:
        # the load's pod starts no engine: the engine's environment (secrets among it) stays here
        return {"spec": replace(self.spec, engine_env=()).as_dict(), "load": self.load.to_row(), "served_model": self.served_model,
                "extra": self.extra.to_row(), "warmup": self.warmup, "engine_version": self.engine_version}  # fmt: skip

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> LoadJob:
        """A job as ``to_row`` wrote it; ConfigError (a ``BenchError``, one line) for what is not one."""
        known = {"spec", "load", "served_model", "extra", "warmup", "engine_version"}
        unknown = sorted(set(d) - known)
        if unknown or not {"spec", "load", "served_model", "extra", "warmup"} <= set(d):
            raise ConfigError(f"a load job has the keys {', '.join(sorted(known))}; this one has {', '.join(sorted(d))}")
        spec, extra = d["spec"], d["extra"]
        if not isinstance(spec, dict) or not isinstance(extra, Mapping) or not isinstance(d["load"], Mapping):
            raise ConfigError("a load job's spec, load and extra are tables")
        meta = RunMeta.from_row(extra)
        served, warmup, version = d["served_model"], d["warmup"], d.get("engine_version")
        if meta is None or not isinstance(served, str) or isinstance(warmup, bool) or not isinstance(warmup, int) \
                or not (version is None or isinstance(version, str)):  # fmt: skip
            raise ConfigError("a load job's extra is a sweep run's metadata, served_model a string, warmup an integer")
        return cls(spec_from_dict(spec), Load.from_row(d["load"]), served, meta, warmup, version)


#: (engine URL, model) -> whether it counts the word prompts at their requested lengths
#: (``word_prompts_exact``; None: it cannot say): asked once per engine, not per load.
_WORDS_EXACT: dict[tuple[str, str], bool | None] = {}


def build_schedule(load: Load, spec: SweepSpec, warmup: int, url: str | None = None, salt: int | None = None) -> Schedule:
    """The load's requests. ``url``: the cell's engine, asked when the workload's
    ``tokenize_url`` is "auto", or by default where its engine offers tokenisation
    (bench/exact_prompts.py: made exact where it counts the word prompts otherwise);
    ``salt``: mixed into the prompt text (the sweep's own)."""
    w = load.workload
    if url and url.startswith("http") and exact_by_default(w.tokenize_url, w.tokenizer, spec.engine, True):
        words = _build_schedule(load, spec, warmup, None, salt)
        key = (url, spec.model)
        if key not in _WORDS_EXACT:
            _WORDS_EXACT[key] = word_prompts_exact(url, spec.model, sample_prompts(words))[0]
        if _WORDS_EXACT[key] is False:
            try:
                return _build_schedule(load, spec, warmup, url, salt)
            except BenchError:  # it counts, but cannot make them exact: word prompts, said per load
                _WORDS_EXACT[key] = None
        return words
    tokenize_url = url if w.tokenize_url == "auto" else (None if w.tokenize_url in OFF else w.tokenize_url)
    return _build_schedule(load, spec, warmup, tokenize_url, salt)


def _build_schedule(load: Load, spec: SweepSpec, warmup: int, tokenize_url: str | None, salt: int | None) -> Schedule:
    w = load.workload
    n = load.requests or spec.loads.requests
    rate = load.value if load.kind == "rate" else None
    conc = int(load.value) if load.kind == "concurrency" else None
    seed = w.seed + 1000 * load.seq + load.repeat
    try:
        synth = make_synth(w.tokenizer, tokenize_url, spec.model)
    except WorkloadError as exc:
        raise BenchError(f"workload {w.tag}: {exc}") from None
    if w.name:
        try:
            from bench_llm.workloads.catalog import build_named_schedule
        except ImportError:
            raise BenchError("named workloads need the workload catalogue, which this install lacks") from None
        return build_named_schedule(  # type: ignore[no-any-return]
            w.name, requests=n, rate=rate, arrival=w.arrival, concurrency=conc, warmup=warmup, seed=seed,
            salt=salt, synth=synth if (w.tokenizer or tokenize_url) else None,
        )  # fmt: skip
    from bench_llm.workloads.synthetic import SyntheticWorkload

    return SyntheticWorkload(
        requests=n,
        input_tokens=w.input_tokens,
        output_tokens=w.output_tokens,
        rate=rate,
        arrival=w.arrival,
        concurrency=conc,
        warmup=warmup,
        seed=seed,
        salt=salt,
    ).schedule(synth)


def sweep_salt(sweep_id: str | None) -> int | None:
    """The prompt salt of a sweep: from its id, so a resumed sweep keeps it and another
    sweep against the same server shares no cached prefix with it."""
    try:
        return int(str(sweep_id), 16) & 0xFFFFFFFF
    except ValueError:
        return None


def drain_timeout(spec: SweepSpec, w: WorkloadSpec) -> float:
    """How long in-flight requests may run after the last send.

    With an end-to-end bound known from the SLOs, a request still running at twice that
    bound cannot meet it any more, so waiting longer only costs time; it counts as a miss.
    """
    if spec.loads.drain_timeout_s is not None:
        return spec.loads.drain_timeout_s
    slo = spec.slo
    bound_ms: float | None = slo.get("e2e_ms")
    if bound_ms is None and "ttft_ms" in slo and "tpot_ms" in slo and not w.name:
        bound_ms = slo["ttft_ms"] + slo["tpot_ms"] * w.output_tokens
    if bound_ms is None:
        return 120.0
    return max(5.0, 2.0 * bound_ms / 1000.0)


def run_load(
    *,
    spec: SweepSpec,
    load: Load,
    run_dir: Path,
    url: str,
    served_model: str,
    extra: RunMeta,
    warmup: int,
    progress: bool | None,
    engine_version: str | None = None,
    virtual: VirtualEngine | None = None,
    otlp: OtlpReceiver | None = None,
    remote: RemoteLoads | None = None,
) -> Measured:
    """Run one load into ``run_dir`` (on ``virtual``'s model in virtual time when given).
    ``otlp``: the receiver the cell's engine exports
    its spans to; the load's own go to its run folder (``server_spans.parquet``). ``remote``:
    the load runs there (this function, in a cluster's pod) and its run folder is judged here."""
    if remote is not None:
        job = LoadJob(spec, load, served_model, extra, warmup, engine_version)
        expected, interrupted = remote.run_load(run_dir, job)
        return _judge(load_run(run_dir), read_server_metrics(run_dir), SLO.from_dict(spec.slo), load, expected, interrupted)
    from bench_llm.bench.execute import RunConfig, execute_run
    from bench_llm.bench.virtual import simulate_run
    from bench_llm.core.eventloop import run_async

    schedule = build_schedule(load, spec, warmup, url, sweep_salt(extra.sweep_id))
    # a workload file's [request] extra_body reaches the sweep's requests as it does bench run's
    adapter = adapter_for_engine(spec.engine, model=served_model, api=spec.api, engine_version=engine_version,
                                 extra_body=schedule.request.extra_body)
    slo = SLO.from_dict(spec.slo)
    cfg = RunConfig(
        out=run_dir,
        url=url,
        engine=spec.engine,
        model=spec.model,
        schedule=schedule,
        options=RunOptions(progress=progress, drain_timeout_s=drain_timeout(spec, load.workload)),
        timeouts=Timeouts(stall=spec.stall_timeout_s),
        command=("bench", "sweep"),
        workers=spec.workers,
        clock=spec.effective_clock,
        config={
            "slo": slo.as_dict(),
            "attainment_pct": spec.attainment_pct,
            "target_rate": spec.target_rate,
            "target_concurrency": spec.target_concurrency,
            "sweep": spec.as_dict(),
        },
        extra=extra.to_row(),
        engine_version=engine_version,  # the cell's engine: its /metrics names (docs/engines.md)
    )
    if virtual is None:
        # execute_run scrapes the engine's /metrics into the run folder throughout the load
        result = run_async(lambda: execute_run(cfg, adapter, otlp=otlp))
        run = load_run(run_dir)
        return _judge(run, read_server_metrics(run_dir), slo, load, len(schedule.measured), bool(result.stats.interrupted))
    # the simulated run's tables as written, not read back; its run table is written once, with
    # the saturation verdict (or without it, should judging the load fail)
    simulated = simulate_run(cfg, virtual)
    try:
        interrupted = bool(simulated.result.stats.interrupted)
        return _judge(simulated.run(), simulated.server_metrics, slo, load, len(schedule.measured), interrupted)
    except BaseException:
        write_run_meta(simulated.result.run_dir, simulated.meta)
        raise


def _judge(
    run: Run, server_metrics: pa.Table | None, slo: SLO, load: Load, expected: int, interrupted: bool
) -> Measured:
    """``run_load``'s answer for a run: its metrics and saturation verdict (also recorded in
    its run table, ``_mark_saturation``)."""
    signals = server_signals(server_metrics)
    figures = point_metrics(run, slo, signals, server_metrics)
    missing = expected - figures.requests if figures.requests < expected and not interrupted else 0
    sat = open_loop_saturation(run, signals, slo) if load.kind == "rate" else admission_saturation(run)
    if sat.undecided and not figures.under_sampled:
        # the timing tests cannot judge this run: it cannot pass, and is measured again, longer
        figures = replace(figures, under_sampled=sat.undecided, more_requests_needed=sat.undecided_more)
    _mark_saturation(run.path, sat, run.meta)
    return Measured(figures, missing, sat, interrupted)


def _mark_saturation(run_dir: Path, sat: Saturation, meta: dict[str, Any] | None = None) -> None:
    """Record the verdict in the run's own metadata (extra_json.saturated); ``meta``: that
    metadata as already read (``load_run``, or a simulated run's not written yet), so it is
    not read a second time."""
    if meta is None:
        if not (run_dir / RUN_FILE).exists():
            return
        meta = read_run_meta(run_dir)
    meta = dict(meta)
    extra = dict(meta.get("extra") or {})
    sweep = RunMeta.from_row(extra)
    if sweep is not None:  # a sweep's run (only those are judged here)
        extra.update(replace(sweep, saturated=sat.saturated, saturation_reasons=tuple(sat.reasons)).to_row())
    meta["extra_json"] = extra
    write_run_meta(run_dir, meta)


def fmt(v: float, unit: str = "", digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}{unit}"
