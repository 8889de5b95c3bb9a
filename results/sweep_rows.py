"""The sweep's rows as typed values, one vocabulary (docs/sweeps.md): a point (one row of a
cell's ``points.parquet``: one run of one load), a capacity record (one per cell and workload,
``cells.parquet``'s ``capacity_json``), and the sweep's part of a run's metadata (the run
table's ``extra_json``).

``to_row()`` / ``from_row()`` are the one place their keys are spelled for Parquet and JSON:
bench/sweep builds the values and writes ``to_row()``; every reader goes through ``from_row``,
which also reads what earlier versions wrote (a run's metadata named its load
``"load": {"kind", "value", "label"}``; it is now ``load_kind``/``load_value``/``load_label``,
as the point row always had it).

Why a load was not simply measured and passed is a ``Reason``: a code that policies test
(``ReasonCode``) and a message for people, which nothing decides by.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from bench_llm.results.schema import MODEL_ERROR_FIELDS


class ReasonCode(enum.StrEnum):
    """What kept a load (or a cell) from a plain verdict."""

    #: the client could not measure it truthfully (saturated client, anomalous records)
    UNTRUSTWORTHY = "untrustworthy"
    #: the engine could not keep up with the load offered
    SATURATED = "saturated"
    #: its sample cannot decide it yet (interval straddles the target, too short, not stationary)
    UNDECIDED = "undecided"
    #: it (or its deployment) failed
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Reason:
    """A code to decide by and a message to print. ``more_requests``: for an under-sampled
    run, how many more requests a run needs to be long enough (0: unknown or not that case)."""

    code: ReasonCode
    message: str
    more_requests: int = 0

    def __str__(self) -> str:
        return self.message


# --- the load -------------------------------------------------------------------------------

LOAD_KINDS = ("rate", "concurrency")


@dataclass(frozen=True, slots=True)
class LoadRef:
    """Which load a run measured: its kind (``rate`` | ``concurrency``), value and folder label."""

    kind: str
    value: float
    label: str

    def to_row(self) -> dict[str, Any]:
        return {"load_label": self.label, "load_kind": self.kind, "load_value": float(self.value)}

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> LoadRef | None:
        """The load of a row in either spelling (None: the row names none)."""
        old = d.get("load")
        if isinstance(old, Mapping):  # run metadata written before the one vocabulary
            kind, value, label = old.get("kind"), old.get("value"), old.get("label")
        else:
            kind, value, label = d.get("load_kind"), d.get("load_value"), d.get("load_label")
        if kind is None and value is None and label is None:
            return None
        return cls(str(kind or ""), _float(value), str(label or ""))


# --- the cell's columns ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CellColumns:
    """A cell's configuration as its points (and cells.parquet) have it."""

    cell_id: str
    engine: str
    model: str
    gpu: str | None
    tp: int
    pp: int
    dp: int
    ep: int
    dcp: int
    pcp: int
    disagg: str | None
    gpus: int
    axes: int
    #: the tuning-axis values as JSON (``{"max-num-seqs": "8"}``); None: none
    tuning: str | None

    def to_row(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> CellColumns:
        return cls(
            cell_id=str(d.get("cell_id") or ""),
            engine=str(d.get("engine") or ""),
            model=str(d.get("model") or ""),
            gpu=d.get("gpu"),
            **{k: _int(d.get(k), 1) for k in ("tp", "pp", "dp", "ep", "dcp", "pcp")},
            disagg=d.get("disagg"),
            gpus=_int(d.get("gpus"), 0),
            axes=_int(d.get("axes"), 0),
            tuning=d.get("tuning"),
        )


@dataclass(frozen=True, slots=True)
class WorkloadColumns:
    """The workload a point ran: its tag, and the named workload or the synthetic lengths."""

    workload: str
    workload_name: str | None
    input_tokens: int | None
    output_tokens: int | None

    def to_row(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> WorkloadColumns:
        return cls(str(d.get("workload") or ""), d.get("workload_name"), _opt_int(d.get("input_tokens")),
                   _opt_int(d.get("output_tokens")))  # fmt: skip


# --- the point row -----------------------------------------------------------------------------

#: The point row's own keys (the rest of a row are the run's measured figures).
_POINT_KEYS = frozenset(
    {"sweep_id", "load_label", "load_kind", "load_value", "repeat", "probe", "role", "status", "saturated",
     "saturation_reason", "run_dir", "warmup_requests", "verdict", "verdict_reason"}
)  # fmt: skip
_CELL_KEYS = frozenset(f.name for f in fields(CellColumns))
_WORKLOAD_KEYS = frozenset(f.name for f in fields(WorkloadColumns))


@dataclass(frozen=True, slots=True)
class PointRow:
    """One run of one load of a cell (a ``points.parquet`` row): the cell, the workload, the
    load, its status and saturation, the run's measured figures (``metrics``: the columns of
    ``analysis.capacity_points.PointMetrics.as_row``, per-SLO ``miss_share_<bound>`` among
    them), and this run's own verdict (None: judged without an SLO, or not run)."""

    cell: CellColumns
    sweep_id: str
    workload: WorkloadColumns
    load: LoadRef
    repeat: int
    probe: bool
    role: str  # load | probe | baseline | confirm
    status: str  # complete | interrupted | skipped
    saturated: bool
    saturation_reason: str | None
    run_dir: str | None = None  # None: not run (skipped)
    warmup_requests: int | None = None
    #: the run's figures by column name (a wide, open set: analysis declares it)
    metrics: Mapping[str, Any] = field(default_factory=dict)
    verdict: str | None = None
    verdict_reason: str | None = None

    # the figures bench/sweep decides by
    @property
    def requests(self) -> int:
        return _int(self.metrics.get("requests"), 0)

    @property
    def ok(self) -> int:
        return _int(self.metrics.get("ok"), 0)

    @property
    def measured(self) -> bool:
        """The load ran (complete, or cut short and kept)."""
        return self.status in ("complete", "interrupted")

    def figure(self, name: str) -> float:
        """A measured figure as a float (NaN where absent or not a number)."""
        return _float(self.metrics.get(name))

    def with_verdict(self, verdict: str | None, reason: str | None) -> PointRow:
        return replace(self, verdict=verdict, verdict_reason=reason)

    def with_metrics(self, metrics: Mapping[str, Any]) -> PointRow:
        return replace(self, metrics=dict(metrics))

    def to_row(self) -> dict[str, Any]:
        """The ``points.parquet`` row, its columns in the order the sweep has always written
        them; a key whose value was never set (a skipped load's run folder, a verdict without
        an SLO) is not written."""
        row: dict[str, Any] = {**self.cell.to_row(), "sweep_id": self.sweep_id, **self.workload.to_row(),
                               **self.load.to_row(), "repeat": self.repeat, "probe": self.probe, "role": self.role,
                               "status": self.status, "saturated": self.saturated,
                               "saturation_reason": self.saturation_reason}  # fmt: skip
        if self.run_dir is not None:
            row["run_dir"] = self.run_dir
        if self.warmup_requests is not None:
            row["warmup_requests"] = self.warmup_requests
        row.update(self.metrics)
        if self.verdict is not None:
            row["verdict"], row["verdict_reason"] = self.verdict, self.verdict_reason
        return row

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> PointRow:
        known = _POINT_KEYS | _CELL_KEYS | _WORKLOAD_KEYS
        return cls(
            cell=CellColumns.from_row(d),
            sweep_id=str(d.get("sweep_id") or ""),
            workload=WorkloadColumns.from_row(d),
            load=LoadRef.from_row(d) or LoadRef("", math.nan, ""),
            repeat=_int(d.get("repeat"), 0),
            probe=bool(d.get("probe")),
            role=str(d.get("role") or "load"),
            status=str(d.get("status") or ""),
            saturated=bool(d.get("saturated")),
            saturation_reason=d.get("saturation_reason"),
            run_dir=d.get("run_dir"),
            warmup_requests=_opt_int(d.get("warmup_requests")),
            metrics={k: v for k, v in d.items() if k not in known},
            verdict=d.get("verdict"),
            verdict_reason=d.get("verdict_reason"),
        )


def point_rows(rows: list[PointRow]) -> list[dict[str, Any]]:
    """Rows for ``pandas.DataFrame`` / ``judge_load`` (which read columns by name)."""
    return [r.to_row() for r in rows]


# --- the capacity record -----------------------------------------------------------------------


@dataclass(frozen=True)
class Judging:
    """The settings a load's verdict depends on, as the sweep ran them: its SLO bounds, the
    attainment target and the confidence of the verdicts. Values as the definition has them
    (compared, never interpreted here)."""

    slo: Mapping[str, Any] | None
    attainment_pct: Any
    confidence: Any

    def to_row(self) -> dict[str, Any]:
        return {"slo": dict(self.slo) if self.slo is not None else None, "attainment_pct": self.attainment_pct,
                "confidence": self.confidence}  # fmt: skip

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> Judging:
        slo = d.get("slo")
        return cls(dict(slo) if isinstance(slo, Mapping) else slo, d.get("attainment_pct"), d.get("confidence"))


#: The definition's keys a verdict depends on (``Judging``'s fields).
JUDGING_KEYS = tuple(f.name for f in fields(Judging))


@dataclass(frozen=True, slots=True)
class Confirmation:
    """The capacity re-run as a confirmation load, pooled with its probe's own runs."""

    rate: float
    verdict: str
    reason: str | None
    requests: int
    attainment: float
    pooled_requests: int
    pooled_attainment: float
    low: float
    high: float
    sure: bool

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_row(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> Confirmation:
        return cls(_float(d.get("rate")), str(d.get("verdict") or ""), d.get("reason"), _int(d.get("requests"), 0),
                   _float(d.get("attainment")), _int(d.get("pooled_requests"), 0), _float(d.get("pooled_attainment")),
                   _float(d.get("low")), _float(d.get("high")), bool(d.get("sure")))  # fmt: skip


@dataclass(frozen=True, slots=True)
class CapacityRepeats:
    """The repeat capacity searches on fresh workload seeds behind a capacity's interval
    (bench/sweep/cell_repeats.py): each repeat's capacity (None: it found none) and the
    prediction interval from them with the main search's (analysis/capacity_repeats.py; its
    fields None where too few searches found one)."""

    capacities: tuple[float | None, ...]
    level: float | None = None
    low: float | None = None
    high: float | None = None
    resolution: float | None = None

    def to_row(self) -> dict[str, Any]:
        return {"capacities": list(self.capacities), "level": self.level, "low": self.low, "high": self.high,
                "resolution": self.resolution}  # fmt: skip

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> CapacityRepeats:
        caps = d.get("capacities")
        return cls(tuple(_opt_float(c) for c in caps) if isinstance(caps, (list, tuple)) else (),
                   _opt_float(d.get("level")), _opt_float(d.get("low")), _opt_float(d.get("high")),
                   _opt_float(d.get("resolution")))  # fmt: skip


@dataclass(frozen=True, slots=True)
class ClientLimit:
    """The load above a capacity that bench's client could not offer truthfully
    (analysis/capacity_client.py): the capacity is then a lower bound. ``rate``: the lowest
    such load; ``workers``: the most client processes any run of it had; ``reason``: why its
    runs were client-limited; ``host_load_average``: the host's load average when the sweep
    found it (None: not known; not written then)."""

    rate: float
    workers: int
    reason: str
    host_load_average: float | None = None

    def to_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"rate": self.rate, "workers": self.workers, "reason": self.reason}
        if self.host_load_average is not None:
            row["host_load_average"] = self.host_load_average
        return row

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> ClientLimit:
        return cls(_float(d.get("rate")), _int(d.get("workers"), 1), str(d.get("reason") or ""),
                   _opt_float(d.get("host_load_average")))  # fmt: skip


@dataclass(frozen=True, slots=True)
class CapacityRecord:
    """A cell's capacity for one workload, as the sweep found it (``method``: ``search`` or
    ``rate list``), with the settings its verdicts were judged at (``judged``: the spec's
    ``analysis.recommend_io.JUDGING`` values; None before the cell is stored)."""

    method: str
    capacity_rps: float | None
    upper_rps: float | None
    precision: float | None
    achieved_precision: float | None
    converged: bool
    probes: int
    note: str
    interval_low_rps: float | None = None
    interval_high_rps: float | None = None
    undecided: tuple[float, ...] = ()
    level: float | None = None
    #: a search's confirmation load (None: none held, or none was made)
    confirmation: Confirmation | None = None
    judged: Judging | None = None
    #: the repeat searches on fresh workload seeds behind the interval (bench/sweep/cell_repeats.py)
    repeats: CapacityRepeats | None = None
    #: the load above which bench's client could not measure truthfully (analysis/capacity_client.py)
    client_limit: ClientLimit | None = None
    #: which optional keys the record has on disk (a search that stopped at its baseline has
    #: no interval, level, undecided or confirmation keys)
    keys: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def with_judged(self, judged: Judging) -> CapacityRecord:
        return replace(self, judged=judged, keys=self.keys | {"judged"})

    def with_extra(self, **values: Any) -> CapacityRecord:
        """The record with optional keys set (and written): the interval, repeats, client limit."""
        return replace(self, keys=self.keys | set(values), **values)

    def to_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"method": self.method, "capacity_rps": self.capacity_rps, "upper_rps": self.upper_rps,
                               "precision": self.precision, "achieved_precision": self.achieved_precision,
                               "converged": self.converged, "probes": self.probes, "note": self.note}  # fmt: skip
        optional = {
            "interval_low_rps": self.interval_low_rps,
            "interval_high_rps": self.interval_high_rps,
            "undecided": list(self.undecided),
            "level": self.level,
            "confirmation": self.confirmation.to_row() if self.confirmation is not None else None,
            "judged": self.judged.to_row() if self.judged is not None else None,
            "repeats": self.repeats.to_row() if self.repeats is not None else None,
            "client_limit": self.client_limit.to_row() if self.client_limit is not None else None,
        }
        row.update({k: v for k, v in optional.items() if k in self.keys})
        return row

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> CapacityRecord:
        conf, judged, repeats, limit = d.get("confirmation"), d.get("judged"), d.get("repeats"), d.get("client_limit")
        return cls(
            method=str(d.get("method") or ""),
            capacity_rps=_opt_float(d.get("capacity_rps")),
            upper_rps=_opt_float(d.get("upper_rps")),
            precision=_opt_float(d.get("precision")),
            achieved_precision=_opt_float(d.get("achieved_precision")),
            converged=bool(d.get("converged")),
            probes=_int(d.get("probes"), 0),
            note=str(d.get("note") or ""),
            interval_low_rps=_opt_float(d.get("interval_low_rps")),
            interval_high_rps=_opt_float(d.get("interval_high_rps")),
            undecided=tuple(float(x) for x in d.get("undecided") or ()),
            level=_opt_float(d.get("level")),
            confirmation=Confirmation.from_row(conf) if isinstance(conf, Mapping) else None,
            judged=Judging.from_row(judged) if isinstance(judged, Mapping) else None,
            repeats=CapacityRepeats.from_row(repeats) if isinstance(repeats, Mapping) else None,
            client_limit=ClientLimit.from_row(limit) if isinstance(limit, Mapping) else None,
            keys=frozenset(k for k in _CAPACITY_OPTIONAL if k in d),
        )


_CAPACITY_OPTIONAL = ("interval_low_rps", "interval_high_rps", "undecided", "level", "confirmation", "judged",
                      "repeats", "client_limit")


def capacity_record(
    method: str, *, optional: tuple[str, ...] = _CAPACITY_OPTIONAL[:5], **values: Any
) -> CapacityRecord:
    """A record with the optional keys ``optional`` written (the rest of ``values`` are fields)."""
    return CapacityRecord(method=method, keys=frozenset(optional), **values)


def capacity_json(records: Mapping[str, CapacityRecord]) -> str:
    """``cells.parquet``'s ``capacity_json``: workload tag -> its capacity record."""
    return json.dumps({tag: r.to_row() for tag, r in records.items()}, sort_keys=True)


def read_capacity_json(text: str | None) -> dict[str, CapacityRecord]:
    """``capacity_json`` read back (empty: none, or not a JSON object)."""
    data = json.loads(text) if text else {}
    if not isinstance(data, dict):
        return {}
    return {str(tag): CapacityRecord.from_row(r) for tag, r in data.items() if isinstance(r, Mapping)}


# --- the cell row ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CellRow:
    """A cell of the sweep as ``cells.parquet`` has it (``results.sweep_layout.CELLS_SCHEMA``):
    its configuration, status (``pending`` before it is written: complete | failed | skipped |
    running on disk) and reason, capacity (the first workload's, and every workload's record in
    ``capacity_json``), what limits it, the engine it ran on and when."""

    cell: CellColumns
    status: str
    reason: str | None = None
    log_tail: str | None = None
    capacity_rps: float | None = None
    capacity_rps_per_gpu: float | None = None
    limiting_factor: str | None = None
    #: workload tag -> ``CapacityRecord`` as JSON (``capacity_json``; read it with ``capacity``)
    capacity_json: str | None = None
    engine_version: str | None = None
    engine_argv: str | None = None
    #: JSON: what the engine says about itself
    engine_info: str | None = None
    #: JSON: bench's version and commit, the GPUs, the model's config hash (bench.sweep.fingerprint)
    fingerprint: str | None = None
    prefix_cache_reset: str | None = None
    started_unix_s: float | None = None
    ended_unix_s: float | None = None
    #: a simulated engine's error columns (``results.schema.MODEL_ERROR_FIELDS``); None: measured
    model_error: Mapping[str, Any] | None = None

    @property
    def cell_id(self) -> str:
        return self.cell.cell_id

    @property
    def capacity(self) -> dict[str, CapacityRecord]:
        return read_capacity_json(self.capacity_json)

    def to_row(self) -> dict[str, Any]:
        row = self.cell.to_row()
        row.update({f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("cell", "model_error")})
        row.update({f.name: None for f in MODEL_ERROR_FIELDS})  # every cells.parquet column, null when measured
        row.update(self.model_error or {})
        return row

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> CellRow:
        names = [f.name for f in fields(cls) if f.name not in ("cell", "status", "model_error")]
        error = {f.name: d[f.name] for f in MODEL_ERROR_FIELDS if d.get(f.name) is not None}
        return cls(CellColumns.from_row(d), str(d.get("status") or ""), **{k: d.get(k) for k in names},
                   model_error=error or None)  # fmt: skip


# --- the sweep's definition file -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SweepFile:
    """``sweep.json``: the sweep's id, the bench version that wrote it, the definition as run
    (``spec``: ``SweepSpec.as_dict``, read back by ``bench.sweep.spec.spec_from_dict``; None in
    a file without one), the command, the planned cells and when it was created and updated."""

    sweep_id: str
    bench_version: str | None
    spec: Mapping[str, Any] | None
    command: str | None
    cells: tuple[str, ...]
    created_unix_s: float | None
    updated_unix_s: float | None

    def to_row(self) -> dict[str, Any]:
        return {"sweep_id": self.sweep_id, "bench_version": self.bench_version,
                "spec": dict(self.spec) if self.spec is not None else None, "command": self.command,
                "cells": list(self.cells), "created_unix_s": self.created_unix_s,
                "updated_unix_s": self.updated_unix_s}  # fmt: skip

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> SweepFile:
        spec = d.get("spec")
        return cls(
            sweep_id=str(d.get("sweep_id")),
            bench_version=d.get("bench_version"),
            spec=dict(spec) if isinstance(spec, Mapping) else None,
            command=d.get("command"),
            cells=tuple(str(c) for c in d.get("cells") or ()),
            created_unix_s=_opt_float(d.get("created_unix_s")),
            updated_unix_s=_opt_float(d.get("updated_unix_s")),
        )


# --- the sweep's part of a run's metadata ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunMeta:
    """What a sweep records in each load's run metadata (``extra_json``): the sweep, the cell
    (its configuration as ``ParallelConfig.as_dict`` gives it, with the engine, model and GPU),
    the workload, the load, the repeat and role, the prefix-cache reset, and what the engine
    says about itself. ``saturated``/``saturation_reasons``: the load's saturation verdict,
    added once the run is judged."""

    sweep_id: str
    #: the configuration's own dict (``ParallelConfig.as_dict``: its axes and launch details)
    cell: Mapping[str, Any]
    load: LoadRef
    workload: str
    repeat: int
    probe: bool
    role: str
    saturated: bool = False
    prefix_cache: str | None = None
    engine_info: Mapping[str, Any] | None = None
    saturation_reasons: tuple[str, ...] | None = None

    def to_row(self) -> dict[str, Any]:
        row: dict[str, Any] = {"sweep_id": self.sweep_id, "cell": dict(self.cell), **self.load.to_row(),
                               "workload": self.workload, "repeat": self.repeat, "probe": self.probe,
                               "role": self.role, "saturated": self.saturated,
                               "prefix_cache": self.prefix_cache}  # fmt: skip
        if self.engine_info:
            row["engine_info"] = dict(self.engine_info)
        if self.saturation_reasons is not None:
            row["saturation_reasons"] = list(self.saturation_reasons)
        return row

    @classmethod
    def from_row(cls, d: Mapping[str, Any]) -> RunMeta | None:
        """A run's ``extra`` as a sweep wrote it, in this or the earlier spelling (None: not a
        sweep's run: no cell and no load)."""
        cell, load = d.get("cell"), LoadRef.from_row(d)
        if not isinstance(cell, Mapping) and load is None:
            return None
        reasons = d.get("saturation_reasons")
        info = d.get("engine_info")
        return cls(
            sweep_id=str(d.get("sweep_id") or ""),
            cell=dict(cell) if isinstance(cell, Mapping) else {},
            load=load or LoadRef("", math.nan, ""),
            workload=str(d.get("workload") or ""),
            repeat=_int(d.get("repeat"), 0),
            probe=bool(d.get("probe")),
            role=str(d.get("role") or "load"),
            saturated=bool(d.get("saturated")),
            prefix_cache=d.get("prefix_cache"),
            engine_info=dict(info) if isinstance(info, Mapping) else None,
            saturation_reasons=tuple(str(r) for r in reasons) if isinstance(reasons, list) else None,
        )


# --- values as read ----------------------------------------------------------------------------


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _opt_float(v: Any) -> float | None:
    return None if v is None else _float(v)


def _int(v: Any, default: int) -> int:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return default
    return int(f) if math.isfinite(f) else default


def _opt_int(v: Any) -> int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) else None
