"""The run summary as typed values (``analysis.summary.summarize`` returns a ``RunSummary``).

``to_json()`` gives the JSON payload ``bench summary --json`` prints: the fields in their
declared order, a field marked ``OMIT_NONE`` left out while it is None (the payload has no
key for it then), nested summaries as objects. ``json_of`` also writes the recommendation
(analysis/recommend_types.py). The per-metric percentile maps
(``{"n": .., "mean": .., "p50": ..}``, analysis.distributions.percentiles) and the count maps
(error type, token source, finish reason → count) stay dicts: their keys are data.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Field metadata ``{"omit": predicate}``: leave the key out of ``to_json()`` when
#: ``predicate(the object, the value)`` holds. ``{"flatten": True}``: write a nested
#: dataclass's keys into its parent's object.
Omit = Callable[[Any, Any], bool]


def omit_if(predicate: Omit) -> dict[str, Omit]:
    return {"omit": predicate}


#: Field metadata: leave the key out of ``to_json()`` while the value is None.
OMIT_NONE = omit_if(lambda obj, v: v is None)


def json_of(value: Any, finite: bool = False) -> Any:
    """``value`` as JSON-ready data: dataclasses as dicts in field order (``omit`` fields
    left out when their predicate holds, ``flatten`` fields merged into the parent), tuples
    as lists, dicts and lists element by element; with ``finite``, NaN and infinities as
    None (strict JSON)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            omit = f.metadata.get("omit")
            if omit is not None and omit(value, v):
                continue
            if f.metadata.get("flatten"):
                out.update(json_of(v, finite))
            else:
                out[f.name] = json_of(v, finite)
        return out
    if isinstance(value, dict):
        return {k: json_of(v, finite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_of(v, finite) for v in value]
    if finite and isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class ToJson:
    """``to_json()`` for the summary's and the recommendation's dataclasses."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        return json_of(self)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class RequestCounts(ToJson):
    rows: int
    warmup_excluded: int
    measured: int
    ok: int
    failed: int
    cancelled_at_end: int
    anomalies: int
    anomaly_kinds: dict[str, int]
    error_rate: float
    errors: dict[str, int]
    top_errors: list[dict[str, Any]]  # analysis.failures.top_errors rows
    #: answered in one response: E2E only (no TTFT, TPOT, ITL)
    non_streaming: int
    #: recorded in the time-based cool-down (phase "cooldown"), excluded; ``warmup_excluded``
    #: counts the warm-up's alone (its request count and its time window)
    cooldown_excluded: int = 0


@dataclass(frozen=True, slots=True)
class Throughput(ToJson):
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float


@dataclass(frozen=True, slots=True)
class TimingCheck(ToJson):
    """Whether the per-token timings stand for the engine's (analysis.invariants.timing_measurable)."""

    one_read_responses: int
    multi_token_responses: int
    itl_measurable: bool
    #: successful requests of several sequences (n > 1): TPOT per sequence, no ITL (docs/metrics.md);
    #: None (left out of the JSON) where there was none
    several_sequences: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True)
class DistributionMethod(ToJson):
    """How the pooled token-level percentiles (ITL, chunk gap) were computed."""

    method: str  # "exact" | "histogram"
    values: int
    exact_limit: int
    max_relative_error: float


@dataclass(frozen=True, slots=True)
class PromptLengths(ToJson):
    """Requested against server-reported prompt lengths (``prompt_length_accounting``)."""

    compared: int
    exact_share: float = float("nan")
    ratio_p50: float = float("nan")
    off_share: float = float("nan")
    warning: str | None = None
    #: tokens the engine adds to every prompt (start token), counted as exact (``engine_added_tokens``)
    engine_added: int = 0


@dataclass(frozen=True, slots=True)
class Reasoning(ToJson):
    requests: int
    reasoning_tokens: int
    answer_tokens: int
    reasoning_tokens_mean: float
    answer_tokens_mean: float


@dataclass(frozen=True, slots=True)
class TokenAccounting(ToJson):
    sources: dict[str, int]
    chunk_vs_server_mismatches: int
    shorter_than_requested: int
    longer_than_requested: int
    prompt: PromptLengths
    finish_reasons: dict[str, int]
    natural_stops: int
    reasoning: Reasoning | None = field(default=None, metadata=OMIT_NONE)  # None: no request reasoned


@dataclass(frozen=True, slots=True)
class SloAttainment(ToJson):
    objectives: dict[str, float]
    met: int
    judged: int
    attainment: float
    attainment_interval: tuple[float, float]
    goodput_rps: float


@dataclass(frozen=True, slots=True)
class ClientWindow(ToJson):
    """One time window's client signals (``analysis.client_health.client_health``)."""

    start_s: float
    end_s: float
    offered: int
    sent: int
    send_lag_p99_ms: float
    loop_lag_max_ms: float
    cpu_busy: float
    saturated: bool
    why: list[str]


@dataclass(frozen=True, slots=True)
class ClientHealth(ToJson):
    """Was the client itself the bottleneck? (``analysis.client_health.client_health``)"""

    schedule_lag_p99_ms: float
    #: event-loop lag, where the monitor sampled it (None: not sampled)
    loop_lag_p99_ms: float | None = field(default=None, metadata=OMIT_NONE)
    loop_lag_max_ms: float | None = field(default=None, metadata=OMIT_NONE)
    windows: list[ClientWindow] = field(default_factory=list)
    cpu_busy_max: float = float("nan")
    saturated_windows: int = 0
    #: client processes that wrote no monitor sample for a while (their event loop starved)
    silent_workers: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    saturated: bool = False


@dataclass(frozen=True, slots=True)
class Smoothness(ToJson):
    deadlines_ms: dict[str, float]  # "ttft", "token_interval"
    fluidity: dict[str, float]  # percentile map
    longest_gap_ms: dict[str, float]  # percentile map


@dataclass(frozen=True, slots=True)
class RunSummary(ToJson):
    """A run's summary: counts, latency percentiles, throughput, goodput, client health."""

    requests: RequestCounts
    window_s: float
    throughput: Throughput
    #: metric name (``ttft_ms``, ``itl_ms`` …) → percentile map (analysis.distributions.percentiles)
    latency: dict[str, dict[str, float]]
    timing: TimingCheck
    token_distributions: DistributionMethod
    tokens: TokenAccounting
    percentiles: tuple[float, ...]
    slo: SloAttainment | None = field(default=None, metadata=OMIT_NONE)  # None: no SLO given
    #: per request kind (structured output, embeddings, tools, images, a model mix; analysis/kinds.py),
    #: only where a request was of that kind
    kinds: dict[str, Any] | None = field(default=None, metadata=OMIT_NONE)
    client: ClientHealth = field(default_factory=lambda: ClientHealth(float("nan")))
    smoothness: Smoothness = field(default_factory=lambda: Smoothness({}, {}, {}))
