"""Named workloads: built-ins, TOML workload files and trace files, by one reference.

``build_named_schedule`` is what ``bench run --workload`` and the sweep call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench_llm.workloads.builder import Plan, materialize, plan_workload
from bench_llm.workloads.definition import PromptConfig, TraceConfig, WorkloadDef, builtins, load_workload_file
from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.graph import is_graph_jsonl
from bench_llm.workloads.graph_files import read_graph_file
from bench_llm.workloads.prompts import PromptSynth
from bench_llm.workloads.readers import detect_format
from bench_llm.workloads.spec import Schedule
from bench_llm.workloads.weka import is_weka

TRACE_SUFFIXES = (".csv", ".jsonl", ".ndjson", ".json", ".parquet")


def builtin_names() -> list[str]:
    return list(builtins())


def resolve(ref: str, **kwargs: Any) -> WorkloadDef:
    """A built-in name, a ``.toml`` workload file or a trace file (CSV / JSONL)."""
    if ref in builtins():
        wd = builtins()[ref]
    else:
        path = Path(ref)
        if path.suffix.lower() == ".toml":
            if not path.is_file():
                raise WorkloadError(f"{ref}: no such workload file")
            wd = load_workload_file(path)
        elif path.suffix.lower() in (".jsonl", ".ndjson", ".json") and (is_graph_jsonl(path) or is_weka(path)):
            wd = WorkloadDef(name=path.stem, description=f"session graphs of {path.name}",
                             graph=read_graph_file(path), source={"file": str(path)})
        elif path.suffix.lower() in TRACE_SUFFIXES:
            if not path.is_file():
                raise WorkloadError(f"{ref}: no such trace file")
            fmt = kwargs.get("trace_format") or detect_format(path)
            wd = WorkloadDef(
                name=path.stem,
                description=f"replay of {path.name}",
                trace=TraceConfig(
                    path=str(path),
                    format=fmt,  # type: ignore[arg-type]  # one of FORMATS; read_trace checks it again
                    time_scale=float(kwargs.get("time_scale", 1.0)),
                    start=int(kwargs.get("trace_start", 0)),
                    output_tokens=kwargs.get("output_tokens") if fmt == "dataset" else None,
                ),
                source={"file": str(path)},
            )
        else:
            raise WorkloadError(
                f"$workload {ref!r}: not a built-in ({', '.join(builtins())}) nor a .toml/.csv/.jsonl file"
            )
    prompt = wd.prompt
    tok, url, model = kwargs.get("tokenizer"), kwargs.get("tokenize_url"), kwargs.get("model")
    if tok or url:
        prompt = PromptConfig(tokenizer=tok, tokenize_url=url, model=model or prompt.model)
    if prompt is not wd.prompt:
        wd = WorkloadDef(**{**wd.__dict__, "prompt": prompt})
    return wd


_KNOWN_KWARGS = {"tokenizer", "tokenize_url", "model", "trace_format", "time_scale", "trace_start", "output_tokens"}


def build_named_plan(
    ref: str,
    *,
    requests: int,
    rate: float | None,
    arrival: str | None,
    concurrency: int | None,
    warmup: int,
    seed: int,
    **kwargs: Any,
) -> tuple[WorkloadDef, Plan]:
    unknown = sorted(set(kwargs) - _KNOWN_KWARGS)
    if unknown:
        raise WorkloadError(f"unknown workload option {unknown[0]!r}")
    wd = resolve(ref, **kwargs)
    plan = plan_workload(
        wd, requests=requests, rate=rate, arrival=arrival, concurrency=concurrency, warmup=warmup, seed=seed
    )
    return wd, plan


def build_named_schedule(
    ref: str,
    *,
    requests: int,
    rate: float | None,
    arrival: str,
    concurrency: int | None,
    warmup: int,
    seed: int,
    salt: int | None = None,
    synth: PromptSynth | None = None,
    **kwargs: Any,
) -> Schedule:
    """The schedule of workload ``ref``; ``WorkloadError`` (one line) for nonsense.

    ``salt``: mixed into the prompt text only (``materialize``); ``synth``: makes the prompts
    (default: from the workload's own tokenizer settings).

    ``arrival`` "poisson" (the CLI default) yields to a workload file's own ``arrival``;
    a trace file replays its own timestamps when neither --rate nor --concurrency is given.
    Extra keyword options: tokenizer (HF folder), tokenize_url (engine base URL), model,
    trace_format, time_scale, trace_start.
    """
    wd, plan = build_named_plan(
        ref,
        requests=requests,
        rate=rate,
        arrival=None if arrival in (None, "", "poisson") else arrival,
        concurrency=concurrency,
        warmup=warmup,
        seed=seed,
        **kwargs,
    )
    return materialize(plan, wd, synth, salt)
