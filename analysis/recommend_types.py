"""The recommendation of a sweep as typed values (``analysis.recommend.recommend`` returns a
``Recommendation``), with its one writer and its one reader.

``Recommendation.to_json()`` is the payload of ``recommendation.json`` and of
``bench recommend --json`` (``recommendation_json`` turns it into the text both write);
``Recommendation.from_json`` / ``read_recommendation`` read it back for the report, the
headline and every other consumer. The shape is the file's (docs/sweeps.md): keys are the
field names; a few keys are written only in some cases, and each such field says when in
its ``omit`` metadata (a predicate of the object and the value), so that a file read and
written again is the same file. A configuration's capacity (``CellCapacity``) is written
flat into the configuration, with the keys of its kind only.

Evidence of a diagnosis stays a dict: its ``miss_share_*``/``server_*`` keys are data.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench_llm.analysis.confidence import CONFIDENCE
from bench_llm.analysis.summary_types import OMIT_NONE, Omit, ToJson, omit_if

#: Field metadata: never written (state the reader recovers from the file's shape).
NOT_WRITTEN = omit_if(lambda obj, v: True)

T = TypeVar("T")


def _of_kinds(*kinds: str) -> dict[str, Omit]:
    """Field metadata: a capacity key written only for capacities of these kinds."""
    return omit_if(lambda obj, v: obj.kind not in kinds)


def _opt(d: dict[str, Any], key: str, read: Callable[[dict[str, Any]], T]) -> T | None:
    v = d.get(key)
    return read(v) if isinstance(v, dict) else None


def _dicts(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def model_interval(capacity_rps: float | None, model_error: float | None) -> tuple[float, float] | None:
    """A simulated capacity as a measured engine may find it, ``[c(1-e), c(1+e)]`` for the
    simulated engine's relative error ``e`` (None: no capacity, or a measured one)."""
    if capacity_rps is None or model_error is None:
        return None
    return capacity_rps * (1 - model_error), capacity_rps * (1 + model_error)


@dataclass(frozen=True, slots=True)
class LoadVerdict(ToJson):
    """One load of a configuration, its repeats pooled and judged (``pooled_loads``)."""

    load: str
    load_kind: str
    load_value: float
    baseline: bool
    passed: bool
    attainment: float | None
    goodput_rps: float | None
    throughput_rps: float | None
    requests: int
    saturated: bool
    saturation_reason: str | None
    runs: list[str] | None
    verdict: str | None
    verdict_reason: str | None
    attainment_low: float | None
    attainment_high: float | None
    untrustworthy: str | None
    under_sampled: str | None
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    tpot_p50_ms: float | None
    tpot_p90_ms: float | None
    e2e_p90_ms: float | None
    #: one of its runs is a confirmation load (docs/sweeps.md, Confirmation)
    confirmed: bool = False

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LoadVerdict:
        required = {"load": "", "load_kind": "", "load_value": math.nan, "baseline": False, "passed": False,
                    "requests": 0, "saturated": False, "confirmed": False}  # fmt: skip
        return cls(**{f.name: d.get(f.name, required.get(f.name)) for f in dataclasses.fields(cls)})


@dataclass(frozen=True, slots=True)
class CellCapacity(ToJson):
    """Capacity of one cell and workload (``cell_capacity``): for rate loads the bracket
    [capacity_rps, upper_rps) of the capacity search; for concurrency loads the highest
    passing concurrency. ``unknown_below_rps``: nothing below this rate was probed and no
    probed rate passed (a gap, not a verdict). A configuration writes these keys flat, only
    those of its kind."""

    kind: str | None = field(default=None, metadata=_of_kinds("rate", "concurrency"))  # None: no measured loads
    capacity_rps: float | None = None
    upper_rps: float | None = field(default=None, metadata=_of_kinds("rate"))
    #: the interval [interval_low_rps, interval_high_rps): its ends decided with a margin
    #: (analysis.capacity.CapacityResult); None where no load was
    interval_low_rps: float | None = field(default=None, metadata=_of_kinds("rate"))
    interval_high_rps: float | None = field(default=None, metadata=_of_kinds("rate"))
    #: the interval is a prediction interval over this many workload seeds' capacity
    #: searches (analysis/capacity_repeats.py); None: the one search's margin-decided interval
    interval_seeds: int | None = field(default=None, metadata=OMIT_NONE)
    precision: float | None = field(default=None, metadata=_of_kinds("rate"))
    achieved_precision: float | None = field(default=None, metadata=_of_kinds("rate"))
    converged: bool | None = field(default=None, metadata=_of_kinds("rate"))
    undecided: list[float] = field(default_factory=list, metadata=_of_kinds("rate"))
    level: float | None = field(default=None, metadata=_of_kinds("rate"))
    note: str = ""
    unknown_below_rps: float | None = field(default=None, metadata=OMIT_NONE)
    max_concurrency: int | None = field(default=None, metadata=_of_kinds("concurrency"))
    throughput_rps_at_max: float | None = field(default=None, metadata=_of_kinds("concurrency"))

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CellCapacity:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["undecided"] = list(d.get("undecided") or [])
        kw["note"] = str(d.get("note") or "")
        return cls(**kw)


@dataclass(frozen=True, slots=True)
class Lightest(ToJson):
    """A configuration's lightest load (the baseline when there is one)."""

    load: str | None
    ttft_p50_ms: float | None
    tpot_p50_ms: float | None
    #: the load was one request at a time (the baseline, or concurrency 1); None: a file
    #: written before this key, whose only record of it is the load's name
    one_at_a_time: bool | None = field(default=None, metadata=OMIT_NONE)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Lightest:
        one = d.get("one_at_a_time")
        return cls(d.get("load"), d.get("ttft_p50_ms"), d.get("tpot_p50_ms"), one if isinstance(one, bool) else None)


@dataclass(frozen=True, slots=True)
class Configuration(ToJson):
    """One configuration (cell) of one workload: its capacity, diagnosis, lightest load and
    every load's pooled verdict."""

    cell_id: str
    gpus: int
    axes: int
    tuning: str | None
    capacity: CellCapacity = field(metadata={"flatten": True})
    capacity_rps_per_gpu: float | None
    limiting_factor: str
    diagnosis: str
    #: the knee's figures beside the lightest load's, with the ``miss_share_*``/``server_*``
    #: columns the points have (analysis.recommend.Diagnosis.evidence, NaN as None)
    evidence: dict[str, Any]
    lightest: Lightest
    loads: list[LoadVerdict]
    #: a simulated engine's relative error on this capacity and where it comes from (the points'
    #: ``model_error_capacity`` and ``model_error_source``, results/schema.py); None: measured
    model_error: float | None = field(default=None, metadata=OMIT_NONE)
    model_error_source: str | None = field(default=None, metadata=OMIT_NONE)

    @property
    def model_interval_rps(self) -> tuple[float, float] | None:
        """The capacity as a measured engine may find it (``model_interval``; None: measured)."""
        return model_interval(self.capacity.capacity_rps, self.model_error)

    # the capacity's fields, as the file has them flat
    @property
    def capacity_rps(self) -> float | None:
        return self.capacity.capacity_rps

    @property
    def upper_rps(self) -> float | None:
        return self.capacity.upper_rps

    @property
    def unknown_below_rps(self) -> float | None:
        return self.capacity.unknown_below_rps

    @property
    def max_concurrency(self) -> int | None:
        return self.capacity.max_concurrency

    @property
    def gpus_text(self) -> str:
        return f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Configuration:
        return cls(
            cell_id=str(d.get("cell_id")),
            gpus=d.get("gpus") or 0,
            axes=d.get("axes") or 0,
            tuning=d.get("tuning"),
            capacity=CellCapacity.from_json(d),
            capacity_rps_per_gpu=d.get("capacity_rps_per_gpu"),
            limiting_factor=str(d.get("limiting_factor") or "unknown"),
            diagnosis=str(d.get("diagnosis") or ""),
            evidence=dict(d.get("evidence") or {}),
            lightest=_opt(d, "lightest", Lightest.from_json) or Lightest(None, None, None),
            loads=[LoadVerdict.from_json(x) for x in _dicts(d.get("loads"))],
            model_error=d.get("model_error"),
            model_error_source=d.get("model_error_source"),
        )


@dataclass(frozen=True, slots=True)
class Pick(ToJson):
    """The recommended configuration and the load that shows it meets the SLOs."""

    cell_id: str
    gpus: int
    capacity_rps: float | None
    capacity_rps_per_gpu: float | None
    #: the passing load closest above the target (else the highest passing one)
    evidence: LoadVerdict | None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Pick:
        return cls(str(d.get("cell_id")), d.get("gpus") or 0, d.get("capacity_rps"), d.get("capacity_rps_per_gpu"),
                   _opt(d, "evidence", LoadVerdict.from_json))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Separation(ToJson):
    """Is the pick separated from its runner-up, or too close to call (analysis.confidence)?"""

    runner_up: str
    separated: bool
    text: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Separation:
        return cls(str(d.get("runner_up")), bool(d.get("separated")), str(d.get("text") or ""))


def _separation_omit(obj: Any, v: Any) -> bool:
    return v is None and not obj.separation_judged


@dataclass(frozen=True, slots=True)
class WorkloadRecommendation(ToJson):
    """The answer for one workload: every configuration, the pick and why, and what the
    sample could not decide."""

    configurations: list[Configuration]
    untrustworthy: list[str]
    under_sampled: list[str]
    undecided: list[str]
    unknown: list[str]
    recommendation: Pick | None
    message: str
    #: None with ``separation_judged``: judged, no runner-up (the file has ``null``);
    #: None without: not judged (the file has no key)
    separation: Separation | None = field(default=None, metadata=omit_if(_separation_omit))
    separation_judged: bool = field(default=False, metadata=NOT_WRITTEN)
    #: a configuration that could change the answer was not probed where it could
    provisional: bool = field(default=False, metadata=omit_if(lambda obj, v: not v))
    resume_command: str | None = field(default=None, metadata=OMIT_NONE)
    #: with a target rate: the configurations short of it and why (None: no target)
    short_of_target: list[str] | None = field(default=None, metadata=OMIT_NONE)
    #: None when there was no SLO to judge against
    same_gpus_tradeoffs: list[str] | None = field(default=None, metadata=OMIT_NONE)
    #: configurations whose prompts were not the lengths asked for, and by how much (None: all were)
    approximate_prompts: list[str] | None = field(default=None, metadata=OMIT_NONE)

    def configuration(self, cell_id: str) -> Configuration | None:
        return next((c for c in self.configurations if c.cell_id == cell_id), None)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WorkloadRecommendation:
        def strs(key: str) -> list[str]:
            return [str(x) for x in d.get(key) or []]

        return cls(
            configurations=[Configuration.from_json(c) for c in _dicts(d.get("configurations"))],
            untrustworthy=strs("untrustworthy"),
            under_sampled=strs("under_sampled"),
            undecided=strs("undecided"),
            unknown=strs("unknown"),
            recommendation=_opt(d, "recommendation", Pick.from_json),
            message=str(d.get("message") or ""),
            separation=_opt(d, "separation", Separation.from_json),
            separation_judged="separation" in d,
            provisional=bool(d.get("provisional")),
            resume_command=d.get("resume_command"),
            short_of_target=strs("short_of_target") if "short_of_target" in d else None,
            same_gpus_tradeoffs=strs("same_gpus_tradeoffs") if "same_gpus_tradeoffs" in d else None,
            approximate_prompts=strs("approximate_prompts") if "approximate_prompts" in d else None,
        )


@dataclass(frozen=True, slots=True)
class CellStatus(ToJson):
    """A cell of the sweep as cells.parquet has it: ran, failed or skipped, and its layout."""

    cell_id: str
    status: str
    reason: str | None
    gpus: int | None
    axes: int | None
    tp: int | None
    pp: int | None
    dp: int | None
    ep: int | None
    dcp: int | None
    pcp: int | None
    disagg: Any
    tuning: str | None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CellStatus:
        layout = [d.get(f.name) for f in dataclasses.fields(cls)][3:]
        return cls(str(d.get("cell_id")), str(d.get("status") or ""), d.get("reason"), *layout)


@dataclass(frozen=True, slots=True)
class Definitions(ToJson):
    """What the recommendation's figures mean, with the settings it was judged at."""

    capacity_rps: str
    goodput_rps: str
    attainment: str
    verdict: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Definitions:
        return cls(*(str(d.get(f.name) or "") for f in dataclasses.fields(cls)))


@dataclass(frozen=True, slots=True)
class Recommendation(ToJson):
    """A sweep's recommendation: the settings it was judged at, every cell, and per workload
    the configurations and the pick; ``recommendation`` and ``message`` are the first
    workload's (the headline's)."""

    sweep: str
    slo: dict[str, float]
    attainment_pct: float | None  # None only in a file without it
    confidence: float
    target_rate: float | None
    target_concurrency: int | None
    definitions: Definitions
    cells: list[CellStatus]
    workloads: dict[str, WorkloadRecommendation]
    recommendation: Pick | None
    message: str
    #: every workload's untrustworthy loads (None: no load was measured)
    untrustworthy: list[str] | None = field(default=None, metadata=OMIT_NONE)

    def first_workload(self) -> WorkloadRecommendation | None:
        """The workload whose recommendation is the headline (the first)."""
        return next(iter(self.workloads.values()), None)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Recommendation:
        """Read back what ``to_json`` wrote; a key a file lacks reads as empty."""
        workloads = d.get("workloads") if isinstance(d.get("workloads"), dict) else {}
        return cls(
            sweep=str(d.get("sweep") or ""),
            slo=dict(d.get("slo") or {}),
            attainment_pct=d.get("attainment_pct"),
            confidence=d.get("confidence", CONFIDENCE),
            target_rate=d.get("target_rate"),
            target_concurrency=d.get("target_concurrency"),
            definitions=Definitions.from_json(d.get("definitions") or {}),
            cells=[CellStatus.from_json(c) for c in _dicts(d.get("cells"))],
            workloads={str(k): WorkloadRecommendation.from_json(v) for k, v in (workloads or {}).items() if isinstance(v, dict)},
            recommendation=_opt(d, "recommendation", Pick.from_json),
            message=str(d.get("message") or ""),
            untrustworthy=[str(u) for u in d["untrustworthy"]] if isinstance(d.get("untrustworthy"), list) else None,
        )


def recommendation_json(rec: Recommendation) -> str:
    """The text of ``recommendation.json`` (and of ``bench recommend --json``)."""
    return json.dumps(rec.to_json(), indent=2, sort_keys=True, default=_json_default)


def _json_default(o: Any) -> Any:
    item = getattr(o, "item", None)  # a numpy scalar
    return item() if callable(item) else str(o)


def read_recommendation(path: Path) -> Recommendation:
    """``recommendation.json`` (a file, or the sweep folder holding it) as a ``Recommendation``.
    Raises OSError or ValueError when it cannot be read."""
    from bench_llm.results.sweep_layout import RECOMMENDATION_FILE

    path = Path(path)
    if path.is_dir():
        path = path / RECOMMENDATION_FILE
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a recommendation (a JSON object)")
    return Recommendation.from_json(data)
