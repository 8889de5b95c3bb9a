"""The ``run.parquet`` row, built in one place for every kind of run.

``bench run`` (``bench/execute.py``), a virtual-time run (``bench/virtual.py``) and the locust
master (``bench/distributed/assemble.py``) describe a run with the same two functions:
``describe_run`` (what was run) and ``run_meta`` (the row as the run starts).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bench_llm.bench.host import host_fingerprint
from bench_llm.core import __version__
from bench_llm.results.schema import SCHEMA_VERSION
from bench_llm.workloads.spec import Schedule

if TYPE_CHECKING:
    from bench_llm.analysis.slo import SLO


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def workload_meta(schedule: Schedule) -> dict[str, Any]:
    """``run.parquet`` ``workload_json``: what the schedule is."""
    return {
        "name": schedule.name,
        "seed": schedule.seed,
        "mode": schedule.mode,
        "rate": schedule.rate,
        "concurrency": schedule.concurrency,
        "arrival": schedule.arrival,
        "requests": len(schedule.measured),
        "warmup": len(schedule.warmup),
        **schedule.description,
    }


def run_config(engine: str, api: str, slo: SLO, percentiles: Sequence[float], **more: Any) -> dict[str, Any]:
    """``run.parquet`` ``config_json``: the engine flavour, the API, the SLOs and percentiles
    asked for, and what else the command adds (``more``: e.g. the embedded engine's timing)."""
    return {"engine": engine, "api": api, "slo": slo.as_dict(), "percentiles": list(percentiles), **more}


def describe_run(
    *,
    command: Sequence[str],
    config: Mapping[str, Any],
    engine: str,
    model: str,
    adapter: Mapping[str, Any],
    schedule: Schedule,
    extra: Mapping[str, Any],
    phases: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """What was run: the command line, config, engine, adapter/transport and workload
    (``phases``: the time-based warm-up and cool-down seconds, recorded and excluded)."""
    return {
        "command": " ".join(command),
        "config_json": dict(config),
        "engine": engine,
        "model": model,
        "adapter_json": dict(adapter),
        "workload_json": {**workload_meta(schedule), **(phases or {})},
        "extra_json": dict(extra),
    }


def run_meta(run_id: str, description: Mapping[str, Any], *, clock: str, status: str = "running") -> dict[str, Any]:
    """The ``run.parquet`` row as the run starts: its id, versions, host and start time, then
    ``description`` (``describe_run``); the caller adds its monotonic t0 and, at the end, notes."""
    return {
        "run_id": run_id,
        "schema_version": SCHEMA_VERSION,
        "bench_version": __version__,
        "status": status,
        "host_json": host_fingerprint(),
        "start_utc": utc_now(),
        "t0_unix_ns": time.time_ns(),
        "clock": clock,
        **description,
    }
