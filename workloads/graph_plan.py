"""A graph workload's plan: its jobs flattened into the per-request arrays of ``Plan``.

Requests are numbered job after job, each job's nodes in their order (every predecessor
first), so a request's predecessors always have smaller numbers. Jobs arrive by the
workload's arrival process at ``rate`` jobs per second (open loop), or run ``concurrency``
at a time (closed loop: a slot takes its next job when its whole job ended); a file's own
``offset_s`` are replayed with ``--arrival trace``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench_llm.workloads.arrivals import ArrivalSpec, offsets_s
from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.graph import FileGraphs, GraphSource, JobGraph


@dataclass(frozen=True)
class GraphArrays:
    """Per request: job, node index, new and output tokens, predecessors (request numbers),
    the delay after each (s), the context predecessor (-1: fresh), a given prompt, a label,
    the fresh node's system prompt group (-1: none given)."""

    jobs: int
    session: np.ndarray
    turn: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    after: tuple[tuple[int, ...], ...]
    delays_s: tuple[tuple[float, ...], ...]
    context: np.ndarray
    prompts: tuple[str | None, ...]
    labels: tuple[str, ...]
    system: np.ndarray
    job_offsets_s: np.ndarray | None  # a file's own arrivals, per job


def flatten(graphs: list[JobGraph], where: str) -> GraphArrays:
    session, turn, n_in, n_out, ctx, system = [], [], [], [], [], []
    after: list[tuple[int, ...]] = []
    delays: list[tuple[float, ...]] = []
    prompts: list[str | None] = []
    labels: list[str] = []
    base = 0
    for j, g in enumerate(graphs):
        g.check(f"{where}: job {j}")
        for i, n in enumerate(g.nodes):
            session.append(j)
            turn.append(i)
            n_in.append(n.input_tokens)
            n_out.append(n.output_tokens)
            after.append(tuple(base + p for p in n.after))
            delays.append(tuple(n.delays_s))
            ctx.append(-1 if n.context is None else base + n.context)
            prompts.append(n.prompt)
            labels.append(n.label)
            system.append(n.system)
        base += len(g.nodes)
    offs = [g.offset_s for g in graphs]
    job_offsets = np.asarray(offs, dtype=float) if offs and all(o is not None for o in offs) else None
    i64 = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    return GraphArrays(len(graphs), i64(session), i64(turn), i64(n_in), i64(n_out), tuple(after), tuple(delays),
                       i64(ctx), tuple(prompts), tuple(labels), i64(system), job_offsets)


def graph_offsets(ga: GraphArrays, arr: ArrivalSpec, rate: float | None, rng: np.random.Generator,
                  source: GraphSource) -> np.ndarray:
    """Open loop: each job's root gets its job's arrival (s), every other node NaN."""
    if arr.process == "trace":
        if ga.job_offsets_s is None:
            raise WorkloadError("this graph file has no offset_s to replay: give $rate (jobs/s) or $concurrency")
        scale = float(arr.params.get("time_scale", 1.0))  # type: ignore[arg-type]
        job = (ga.job_offsets_s - ga.job_offsets_s.min()) * scale
    else:
        job = offsets_s(arr, ga.jobs, rate, rng)
    out = np.full(len(ga.session), np.nan)
    roots = ga.turn == 0
    out[roots] = job
    return out


def is_file(source: GraphSource) -> bool:
    return isinstance(source, FileGraphs)


def graph_summary(ga: GraphArrays, inputs: np.ndarray) -> dict[str, object]:
    """What ``bench workload show`` prints of a graph workload: requests per job, joins, fresh
    conversations, edge delays, and each request's whole prompt as the engine will see it
    (its context's prompt and answer, its other predecessors' answers, its own new tokens;
    answers at their full requested length)."""
    n = len(inputs)
    prompt = np.zeros(n, dtype=np.int64)
    out = ga.output_tokens
    for i in range(n):
        c = int(ga.context[i])
        base = int(prompt[c] + out[c]) if c >= 0 else 0
        prompt[i] = base + sum(int(out[p]) for p in ga.after[i] if p != c) + int(inputs[i])
    delays = np.array([d for ds in ga.delays_s for d in ds], dtype=float)
    per_job = np.bincount(ga.session)
    q = (lambda v, p: float(np.percentile(v, p)) if len(v) else float("nan"))  # noqa: E731
    return {
        "jobs": int(ga.jobs),
        "requests_per_job": float(per_job.mean()) if len(per_job) else 0.0,
        "joins": float(np.mean([len(a) > 1 for a in ga.after])) if n else 0.0,
        "fresh": float(np.mean(ga.context < 0)) if n else 0.0,
        "delay_s": {"mean": float(delays.mean()) if len(delays) else 0.0, "p50": q(delays, 50), "p95": q(delays, 95)},
        "prompt_tokens": {"mean": float(prompt.mean()) if n else 0.0, "p50": q(prompt, 50), "p95": q(prompt, 95),
                          "max": int(prompt.max()) if n else 0},
    }
