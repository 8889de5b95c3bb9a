"""Schedules and settings as plain dicts/lists, for locust's msgpack messages and job files."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from bench_llm.workloads.spec import Constraint, Message, RequestSpec, Sampling, Schedule

_SPEC_FIELDS = tuple(f.name for f in fields(RequestSpec))


def spec_to_wire(spec: RequestSpec) -> dict[str, Any]:
    out = {name: getattr(spec, name) for name in _SPEC_FIELDS}
    if spec.messages is not None:
        out["messages"] = [[m.role, m.content] for m in spec.messages]
    if spec.sampling is not None:
        out["sampling"] = {k: getattr(spec.sampling, k) for k in Sampling.__slots__}
    if spec.constraint is not None:
        out["constraint"] = {k: getattr(spec.constraint, k) for k in Constraint.__slots__}
    return out


def spec_from_wire(data: dict[str, Any]) -> RequestSpec:
    values = {k: v for k, v in data.items() if k in _SPEC_FIELDS}
    if values.get("messages") is not None:
        values["messages"] = tuple(Message(role, content) for role, content in values["messages"])
    if values.get("sampling") is not None:
        values["sampling"] = Sampling(**{**values["sampling"], "stop": tuple(values["sampling"]["stop"])})
    if values.get("constraint") is not None:
        values["constraint"] = Constraint(**{**values["constraint"], "choice": tuple(values["constraint"]["choice"])})
    if "images" in values:
        values["images"] = tuple((int(w), int(h)) for w, h in values["images"] or ())
    for name in ("after", "after_delay_ns"):  # a session graph's predecessors: JSON lists back to tuples
        if name in values:
            values[name] = tuple(values[name] or ())
    return RequestSpec(**values)


def schedule_to_wire(schedule: Schedule) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "seed": schedule.seed,
        "mode": schedule.mode,
        "requests": [spec_to_wire(s) for s in schedule.requests],
        "concurrency": schedule.concurrency,
        "rate": schedule.rate,
        "arrival": schedule.arrival,
        "duration_s": schedule.duration_s,
        "description": dict(schedule.description),
    }


def schedule_from_wire(data: dict[str, Any]) -> Schedule:
    return Schedule(
        name=data["name"],
        seed=data["seed"],
        mode=data["mode"],
        requests=tuple(spec_from_wire(s) for s in data["requests"]),
        concurrency=data.get("concurrency"),
        rate=data.get("rate"),
        arrival=data.get("arrival", ""),
        duration_s=data.get("duration_s"),
        description=dict(data.get("description") or {}),
    )


@dataclass(frozen=True)
class ClientSettings:
    """How a worker talks to the engine. The API key never travels: each worker reads
    it from its own environment variable or file."""

    url: str
    adapter: str = "vllm"
    api: str = "completions"
    model: str = "sim-model"
    api_key_env: str = "OPENAI_API_KEY"
    api_key_file: str | None = None
    connect_timeout_s: float = 10.0
    stall_timeout_s: float = 120.0
    duration_s: float | None = None
    drain_timeout_s: float = 300.0
    warmup_concurrency: int = 4
    save_text: bool = False
    #: the time-based warm-up and cool-down (RunOptions.phase_at, from the shared t0)
    warmup_s: float = 0.0
    cooldown_s: float = 0.0

    def to_wire(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ClientSettings:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
