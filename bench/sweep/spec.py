"""The sweep definition: one frozen dataclass, from flags or from a TOML file.

A TOML sweep file says everything the flags say; flags given on the command line override
the file. Example (docs/sweeps.md has the full reference)::

    engine = "sim"
    model = "llama-3.1-70b"
    gpu = "h100"
    gpus = 4
    slo = { ttft_ms = 2000, tpot_ms = 60 }

    [matrix]
    tp = [2, 4]
    dp = [1, 2]

    [loads]
    capacity = true
    requests = 60

    [[workloads]]
    input_tokens = 1024
    output_tokens = 64
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from bench_llm.core.errors import BenchError
from bench_llm.core.redact import secret_name
from bench_llm.launch.config import AXES, DEPLOYMENT_NAME, Disagg, ParallelConfig
from bench_llm.launch.placement import ClusterSpec
from bench_llm.launch.profiles import PROFILES, launchable_engines
from bench_llm.loadgen.transport import CLOCKS

#: An engine flag usable as a tuning axis (``max-num-seqs``, ``mem-fraction-static``).
FLAG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_][A-Za-z0-9]+)*")


#: Fields added after sweeps were first stored, with the values sweeps ran with before: a
#: sweep.json without them is read (and resumed) as it was measured.
LEGACY_DEFAULTS: dict[str, Any] = {"workers": 1, "clock": "user", "confidence": 0.0}

#: The simulated engine's own clock: its scheduler and cost model run in virtual time, no
#: server or client (bench.virtual). The other clocks measure a live server in real time.
VIRTUAL = "virtual"
SWEEP_CLOCKS = (*CLOCKS, VIRTUAL)

#: A virtual-time probe costs CPU, not wall time: it affords thousands of requests, and the
#: capacity bracket closes to 2 % (used for the load settings a sweep does not set itself).
VIRTUAL_LOAD_DEFAULTS: dict[str, Any] = {
    "requests": 1000,
    "max_requests": 4000,
    "capacity_precision": 0.02,
    "capacity_max_probes": 12,
    "capacity_repeats": 2,
}


class SweepSpecError(BenchError, ValueError):
    """A sweep definition that cannot run; one line."""


#: The matrix fields that vary the workload, not the engine (their CLI names use "-").
WORKLOAD_AXES = ("input_tokens", "output_tokens", "workload")


@dataclass(frozen=True)
class MatrixSpec:
    """Lists of values per parallel axis; the matrix is their Cartesian product."""

    tp: tuple[int, ...] = (1,)
    pp: tuple[int, ...] = (1,)
    dp: tuple[int, ...] = (1,)
    ep: tuple[int, ...] = (1,)
    dcp: tuple[int, ...] = (1,)
    pcp: tuple[int, ...] = (1,)
    #: "P:D" values, or "none" for colocated prefill/decode. Empty: colocated only.
    disagg: tuple[str, ...] = ()
    #: Tuning axes: engine flag name (without ``--``) -> values; each value runs as
    #: ``--NAME=VALUE`` (``bench sweep --axis NAME=v1,v2``, TOML ``[matrix.flags]``).
    flags: dict[str, tuple[str | int | float, ...]] = field(default_factory=dict)
    #: Workload axes (``--axis input-tokens=128,1024``, ``output-tokens``, ``workload``; TOML
    #: ``input_tokens``, ``output_tokens``, ``workload``): they launch nothing, every cell runs
    #: its loads at each combination of their values (``SweepSpec.cell_workloads``). Empty: the
    #: sweep's workload as given.
    input_tokens: tuple[int, ...] = ()
    output_tokens: tuple[int, ...] = ()
    #: Named workloads or TOML files (``bench workload show``).
    workload: tuple[str, ...] = ()

    @property
    def workload_axes(self) -> bool:
        return any(getattr(self, axis) for axis in WORKLOAD_AXES)

    def validate(self) -> None:
        for axis in ("input_tokens", "output_tokens"):
            for v in getattr(self, axis):
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise SweepSpecError(f"matrix.{axis}: {v!r} is not a positive integer")
        for axis in WORKLOAD_AXES:
            values = getattr(self, axis)
            if len(set(values)) != len(values):
                raise SweepSpecError(f"matrix.{axis}: values repeat")
        if any(not str(n).strip() for n in self.workload):
            raise SweepSpecError("matrix.workload: a workload name is empty")
        for axis in AXES:
            values = getattr(self, axis)
            if not values:
                raise SweepSpecError(f"matrix.{axis}: give at least one value")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise SweepSpecError(f"matrix.{axis}: {v!r} is not a positive integer")
        for d in self.disagg:
            if d.lower() in ("none", "off", "colocated"):
                continue
            try:
                Disagg.parse(d)
            except ValueError as exc:
                raise SweepSpecError(f"matrix.disagg: {exc}") from None
        for name, flag_values in self.flags.items():
            if not FLAG_NAME.fullmatch(name):
                raise SweepSpecError(f"matrix.flags.{name}: a flag name is letters, digits and - (no leading --)")
            if not flag_values:
                raise SweepSpecError(f"matrix.flags.{name}: give at least one value")
            if len({str(v) for v in flag_values}) != len(flag_values):
                raise SweepSpecError(f"matrix.flags.{name}: values repeat")

    def tuning_values(self) -> list[tuple[tuple[str, str], ...]]:
        """Every combination of the tuning axes, as ((flag, value), ...) in the order given."""
        names = list(self.flags)
        combos = itertools.product(*(self.flags[n] for n in names))
        return [tuple((n, str(v)) for n, v in zip(names, combo)) for combo in combos]


@dataclass(frozen=True)
class LoadSpec:
    """Which loads each cell is measured at.

    Exactly one of ``rates`` (open loop, req/s), ``concurrency`` (closed loop) or
    ``capacity`` (a search for the highest rate meeting the SLOs) is used.
    """

    rates: tuple[float, ...] = ()
    concurrency: tuple[int, ...] = ()
    capacity: bool = False
    #: First rate the capacity search probes (req/s); it then doubles or halves to bracket.
    #: Later cells start from what earlier cells found per GPU. None: twice the one-at-a-time
    #: request rate measured first.
    capacity_start: float | None = None
    #: Stop bisecting when (upper - lower) <= precision × lower.
    capacity_precision: float = 0.1
    capacity_max_probes: int = 8
    #: Repeat searches with fresh workload seeds after the capacity is found: the capacity
    #: interval is their prediction interval (analysis/capacity_repeats.py). 0: the one
    #: search's margin-decided interval. Virtual time: 2 (they cost CPU only).
    capacity_repeats: int = 0
    capacity_max_rate: float = 1000.0
    capacity_min_rate: float = 0.01
    #: Measured requests per load (at least; see min_window_s).
    requests: int = 100
    #: Rate loads send for at least this many seconds (more requests at higher rates), so a
    #: burst is not mistaken for a sustained rate. None: for a capacity search, 8 × the
    #: one-at-a-time latency measured first; for listed rates, no minimum.
    min_window_s: float | None = None
    #: Most measured requests per load.
    max_requests: int = 600
    #: Warm-up requests sent once per cell before its first load (recorded, excluded).
    warmup: int = 4
    #: Seconds in-flight requests may take after the last send (None: from the SLOs, else 120).
    drain_timeout_s: float | None = None
    #: Skip higher loads of a cell once a load is saturated.
    stop_at_saturation: bool = True

    def validate(self) -> None:
        given = sum([bool(self.rates), bool(self.concurrency), self.capacity])
        if given == 0:
            raise SweepSpecError("loads: give --rate values, --concurrency values or --capacity")
        if given > 1:
            raise SweepSpecError("loads: --rate, --concurrency and --capacity are mutually exclusive; give one")
        for r in self.rates:
            if not (isinstance(r, (int, float)) and r > 0 and math.isfinite(r)):
                raise SweepSpecError(f"loads.rates: {r!r} is not a positive number of requests/s")
        for c in self.concurrency:
            if isinstance(c, bool) or not isinstance(c, int) or c < 1:
                raise SweepSpecError(f"loads.concurrency: {c!r} is not a positive integer")
        if self.capacity_start is not None and not self.capacity_start > 0:
            raise SweepSpecError("loads.capacity_start must be positive")
        if not 0 < self.capacity_precision < 1:
            raise SweepSpecError("loads.capacity_precision must be between 0 and 1 (a fraction, e.g. 0.1)")
        if self.capacity_max_probes < 2:
            raise SweepSpecError("loads.capacity_max_probes must be at least 2")
        if isinstance(self.capacity_repeats, bool) or not isinstance(self.capacity_repeats, int) or self.capacity_repeats < 0:
            raise SweepSpecError("loads.capacity_repeats must be a whole number >= 0")
        if not 0 < self.capacity_min_rate < self.capacity_max_rate:
            raise SweepSpecError("loads: need 0 < capacity_min_rate < capacity_max_rate")
        if self.requests < 1:
            raise SweepSpecError("loads.requests must be at least 1")
        if self.max_requests < self.requests:
            raise SweepSpecError("loads.max_requests must be at least loads.requests")
        if self.min_window_s is not None and not self.min_window_s >= 0:
            raise SweepSpecError("loads.min_window_s must be >= 0")
        if self.warmup < 0:
            raise SweepSpecError("loads.warmup must be >= 0")
        if self.drain_timeout_s is not None and not self.drain_timeout_s > 0:
            raise SweepSpecError("loads.drain_timeout_s must be positive")

    @property
    def kind(self) -> str:
        return "capacity" if self.capacity else ("rate" if self.rates else "concurrency")


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload: a named one from the catalogue, or synthetic fixed lengths."""

    #: Named workload or TOML file (``bench workload show``); None: synthetic lengths below.
    name: str | None = None
    #: Short label used in load folder names when a sweep has several workloads.
    label: str | None = None
    input_tokens: int = 512
    output_tokens: int = 128
    arrival: str = "poisson"
    seed: int = 0
    #: Exact prompt lengths: a local Hugging Face tokenizer folder, or an engine's /tokenize
    #: ("auto": the engine of each cell).
    tokenizer: str | None = None
    tokenize_url: str | None = None

    @property
    def tag(self) -> str:
        if self.label:
            return self.label
        if self.name:
            return Path(self.name).stem.replace("_", "-")
        return f"in{self.input_tokens}-out{self.output_tokens}"

    def validate(self) -> None:
        if self.input_tokens < 1 or self.output_tokens < 1:
            raise SweepSpecError("workload: input_tokens and output_tokens must be at least 1")
        if self.arrival not in ("poisson", "constant"):
            raise SweepSpecError(f"workload: arrival {self.arrival!r}: use poisson or constant")
        if self.label is not None and not all(ch.isalnum() or ch in "-_." for ch in self.label):
            raise SweepSpecError(f"workload label {self.label!r}: use letters, digits, - _ .")


@dataclass(frozen=True)
class EndpointSpec:
    """An engine already running, measured where it is (``bench sweep --url NAME=URL@GPUS``,
    TOML ``[[endpoints]]``): one configuration of the sweep, named ``name``, occupying ``gpus``."""

    name: str
    url: str
    gpus: int = 1
    #: The API and routes this deployment speaks (``--url NAME=ENGINE:URL``); None: the sweep's
    #: ``engine``. Lets a vLLM and a TGI deployment be compared in one sweep.
    engine: str | None = None

    def validate(self) -> None:
        if not DEPLOYMENT_NAME.fullmatch(self.name):
            raise SweepSpecError(f"endpoint {self.name!r}: a name is letters, digits, '.', '_' and '-'")
        if self.engine is not None and self.engine not in PROFILES:
            raise SweepSpecError(f"endpoint {self.name}: engine {self.engine!r}: use one of {', '.join(PROFILES)}")
        if not self.url.startswith(("http://", "https://")):
            raise SweepSpecError(f"endpoint {self.name}: {self.url!r} is not an http(s) URL")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise SweepSpecError(f"endpoint {self.name}: gpus {self.gpus!r} is not a positive integer")


@dataclass(frozen=True)
class SweepSpec:
    model: str
    engine: str = "sim"
    gpu: str | None = None
    #: GPUs available; cells needing more are skipped with a reason. None: no limit.
    gpus: int | None = None
    matrix: MatrixSpec = MatrixSpec()
    loads: LoadSpec = LoadSpec()
    workloads: tuple[WorkloadSpec, ...] = (WorkloadSpec(),)
    repeats: int = 1
    #: SLO bounds in milliseconds (ttft_ms, tpot_ms, e2e_ms, ttfo_ms, itl_max_ms).
    slo: dict[str, float] = field(default_factory=dict)
    #: Percentage of requests that must meet every SLO (DistServe attainment target).
    attainment_pct: float = 90.0
    #: Confidence level of every load's verdict (docs/sweeps.md, Confidence): a load passes
    #: or fails only when its attainment interval at this level clears the target. 0: the
    #: point estimate decides (how sweeps were judged before intervals).
    confidence: float = 0.95
    #: The load the recommendation must serve (req/s). None: best capacity per GPU.
    target_rate: float | None = None
    #: For concurrency sweeps: the concurrency the recommendation must serve.
    target_concurrency: int | None = None
    api: str = "completions"
    #: Extra arguments appended to every engine's argv.
    engine_args: tuple[str, ...] = ()
    #: Extra environment for the engine: "NAME=value", or "NAME" for bench's own value of NAME
    #: when the engine starts (the only form a secret may take: ``engine_env_pairs``).
    engine_env: tuple[str, ...] = ()
    #: The engine's version when known: version-gated launch flags, /metrics names and SGLang's
    #: stream shape (docs/engines.md). None: each launched engine's own answer.
    engine_version: str | None = None
    ready_timeout_s: float = 600.0
    #: Seconds without data before a request fails as stalled.
    stall_timeout_s: float = 120.0
    #: Load-generating processes per load (``bench run --workers``): the schedule split by
    #: send time, one run folder. More than one when a single process cannot keep up.
    workers: int = 1
    #: Chunk timestamps (``bench run --clock``): auto (kernel where available), user, kernel;
    #: or ``virtual`` (the simulated engine only: its model in virtual time, no server or
    #: client). None: virtual for the simulated engine, auto for the others (``with_clock``).
    clock: str | None = None
    #: Engines already running, each one configuration (instead of the matrix, which bench
    #: launches); ``engine`` names the API and routes they speak.
    endpoints: tuple[EndpointSpec, ...] = ()
    #: The cluster each cell's engine is placed on (``bench sweep --cluster``, TOML ``[cluster]``;
    #: docs/sweeps.md, "On a cluster"). None: launched on this host.
    cluster: ClusterSpec | None = None

    def validate(self) -> None:
        if self.cluster is not None:
            self._validate_cluster()
        if self.endpoints:
            self._validate_endpoints()
        elif self.engine not in launchable_engines():
            raise SweepSpecError(f"engine {self.engine!r}: use one of {', '.join(launchable_engines())}")
        if not self.model:
            raise SweepSpecError("model: required")
        if self.gpus is not None and self.gpus < 1:
            raise SweepSpecError("gpus must be at least 1")
        self.matrix.validate()
        self.loads.validate()
        if not self.workloads:
            raise SweepSpecError("workloads: give at least one")
        self._validate_workload_axes()
        for w in self.cell_workloads:
            w.validate()
        tags = [w.tag for w in self.cell_workloads]
        if len(set(tags)) != len(tags):
            raise SweepSpecError(f"workloads: labels must differ ({', '.join(tags)}); set label = ...")
        if self.repeats < 1:
            raise SweepSpecError("repeats must be at least 1")
        if not 0 < self.attainment_pct <= 100:
            raise SweepSpecError("attainment must be a percentage in (0, 100]")
        if not 0 <= self.confidence < 1:
            raise SweepSpecError("confidence must be in [0, 1), e.g. 0.95")
        if self.loads.capacity and not self.slo:
            raise SweepSpecError("--capacity needs --slo (capacity is the highest rate meeting the SLOs)")
        if self.target_rate is not None and not self.target_rate > 0:
            raise SweepSpecError("target_rate must be positive")
        if not 1 <= self.workers <= 64:
            raise SweepSpecError(f"workers: {self.workers} is not between 1 and 64")
        if self.clock is not None and self.clock not in SWEEP_CLOCKS:
            raise SweepSpecError(f"clock {self.clock!r}: use one of {', '.join(SWEEP_CLOCKS)}")
        if self.clock == VIRTUAL and self.engine != "sim":
            raise SweepSpecError(f"clock virtual: only the simulated engine runs in virtual time, not {self.engine}")
        if self.clock == VIRTUAL and self.workers != 1:
            raise SweepSpecError("workers: virtual time has no load generator; measure in real time (--clock auto)")
        if self.ready_timeout_s <= 0 or self.stall_timeout_s <= 0:
            raise SweepSpecError("ready_timeout_s and stall_timeout_s must be positive")
        from bench_llm.launch.tuning import flag_name

        fixed = {flag_name(a) for a in self.engine_args}
        for name in self.matrix.flags:
            if name.replace("_", "-") in fixed:
                raise SweepSpecError(f"--{name} is both a matrix axis and an --engine-arg; give it in one place")
        for item in self.engine_env:
            _check_env_item(item)
        from bench_llm.analysis.slo import SLO, SLOError

        try:
            SLO.from_dict(self.slo)
        except SLOError as exc:
            raise SweepSpecError(str(exc)) from None

    def _validate_endpoints(self) -> None:
        if self.engine not in PROFILES:
            raise SweepSpecError(f"engine {self.engine!r}: use one of {', '.join(PROFILES)}")
        for e in self.endpoints:
            e.validate()
        names = [e.name for e in self.endpoints]
        if len(set(names)) != len(names):
            raise SweepSpecError(f"endpoints: names must differ ({', '.join(names)})")
        if self.matrix != MatrixSpec():
            raise SweepSpecError("endpoints: a running deployment's configuration is its own; give a matrix "
                                 "(which bench launches) or endpoints, not both")  # fmt: skip
        if self.engine_args or self.engine_env:
            raise SweepSpecError("endpoints: engine_args and engine_env set how bench launches an engine; "
                                 "a running deployment was started by you")  # fmt: skip
        if self.clock == VIRTUAL:
            raise SweepSpecError("clock virtual: running deployments are measured live (--clock auto)")

    def _validate_cluster(self) -> None:
        if self.endpoints:
            raise SweepSpecError("cluster: running deployments are measured where they are; give a matrix or endpoints")
        if self.clock == VIRTUAL:
            raise SweepSpecError("cluster: a sweep in virtual time runs no engine; measure in real time (--clock auto)")

    @property
    def cell_workloads(self) -> tuple[WorkloadSpec, ...]:
        """The workloads every cell is measured at: ``workloads``, or with workload axes
        (``matrix.input_tokens``, ``output_tokens``, ``workload``) each combination of their
        values on the one workload given, labelled by the values (``in128-out64``, ``chat``)."""
        m = self.matrix
        if not m.workload_axes or len(self.workloads) != 1:
            return self.workloads
        base = self.workloads[0]
        out = []
        for name, i, o in itertools.product(
            m.workload or (base.name,), m.input_tokens or (base.input_tokens,), m.output_tokens or (base.output_tokens,)
        ):
            parts = [re.sub(r"[^A-Za-z0-9.-]", "-", Path(name).stem)] if m.workload and name else []
            parts += [f"in{i}"] if m.input_tokens else []
            parts += [f"out{o}"] if m.output_tokens else []
            out.append(replace(base, name=name, input_tokens=i, output_tokens=o, label="-".join(parts)))
        return tuple(out)

    def _validate_workload_axes(self) -> None:
        m = self.matrix
        if not m.workload_axes:
            return
        if len(self.workloads) != 1:
            raise SweepSpecError("matrix: workload axes vary the sweep's one workload; with several "
                                 "[[workloads]], list every combination there instead")  # fmt: skip
        named = m.workload or (self.workloads[0].name,)
        if (m.input_tokens or m.output_tokens) and any(named):
            raise SweepSpecError("matrix: input_tokens and output_tokens axes vary a synthetic workload; "
                                 "a named workload sets its own lengths")  # fmt: skip

    def for_cell(self, cfg: ParallelConfig) -> "SweepSpec":
        """The spec one cell runs under: a running deployment that names its engine speaks
        that engine's API and routes (``EndpointSpec.engine``), every other cell the sweep's."""
        if cfg.deployment is None:
            return self
        engine = next((e.engine for e in self.endpoints if e.name == cfg.deployment and e.engine), None)
        return replace(self, engine=engine) if engine and engine != self.engine else self

    def engine_env_pairs(self, environ: Mapping[str, str] | None = None, *, dry_run: bool = False
                         ) -> tuple[tuple[str, str], ...]:  # fmt: skip
        """The engine's extra environment as (name, value): a bare ``NAME`` takes bench's own
        value (``environ``, default ``os.environ``); SweepSpecError names what is unset.
        ``dry_run``: it starts nothing, so it reads no value (``***``) and needs none set."""
        env = os.environ if environ is None else environ
        pairs = []
        for item in self.engine_env:
            name, eq, value = item.partition("=")
            if not eq and dry_run:
                value = "***"
            elif not eq:
                if name not in env:
                    raise SweepSpecError(f"engine_env {name}: not set in bench's environment (export it, or give NAME=value)")
                value = env[name]
            pairs.append((name, value))
        return tuple(pairs)

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)

    @property
    def effective_clock(self) -> str:
        launched_here = not self.endpoints and self.cluster is None
        return self.clock or (VIRTUAL if self.engine == "sim" and launched_here else "auto")

    @property
    def virtual(self) -> bool:
        return self.effective_clock == VIRTUAL

    def with_clock(self, explicit_loads: Collection[str] | None = None) -> "SweepSpec":
        """The spec with its clock decided (virtual for the simulated engine unless told
        otherwise). In virtual time the load settings not in ``explicit_loads`` take
        ``VIRTUAL_LOAD_DEFAULTS`` (None: keep every load setting as it is)."""
        clock = self.effective_clock
        loads = self.loads
        if clock == VIRTUAL and explicit_loads is not None:
            loads = replace(loads, **{k: v for k, v in VIRTUAL_LOAD_DEFAULTS.items() if k not in explicit_loads})
        return replace(self, clock=clock, loads=loads)

    def with_overrides(self, **changes: Any) -> "SweepSpec":
        """Apply flag values that were given (None means 'not given')."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def toml_load_keys(path: Path) -> set[str]:
    """The ``[loads]`` settings a TOML sweep file sets itself."""
    from bench_llm.core.config import load_toml

    names = {f.name for f in fields(LoadSpec)}
    return {k for k in (load_toml(Path(path)).get("loads") or {}) if k in names}


def load_spec(path: Path) -> SweepSpec:
    """Read a TOML sweep file (unknown keys rejected with their dotted path)."""
    from bench_llm.core.config import ConfigError, from_mapping, load_toml

    data = load_toml(Path(path))
    if "model" not in data:
        data = {"model": "", **data}
    try:
        return from_mapping(SweepSpec, data, "", str(path))
    except ConfigError as exc:
        raise SweepSpecError(str(exc)) from None


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_env_item(item: str) -> None:
    """One ``engine_env`` item: ``NAME=value`` or ``NAME``; a secret's value never appears in a
    spec (it is written to sweep.json and the command line is stored), so it must be ``NAME``."""
    name, eq, _ = item.partition("=")
    if not _ENV_NAME.fullmatch(name):
        raise SweepSpecError(f"engine_env {name[:64]!r}: expected NAME=value or NAME (a variable name)")
    if eq and secret_name(name):
        raise SweepSpecError(
            f"engine_env {name}: a secret's value is not given on the command line or in a file bench writes; "
            f"export {name} and pass --engine-env {name} (bench hands its own value to the engine)"
        )


def spec_from_dict(data: dict[str, Any]) -> SweepSpec:
    """Rebuild a spec from ``as_dict`` output (sweep.json)."""
    from bench_llm.core.config import from_mapping

    return from_mapping(SweepSpec, {**LEGACY_DEFAULTS, **data})
