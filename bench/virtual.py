"""The simulated engine's modelled timing in virtual time: a run folder, no server, no client.

``execute_virtual`` runs a schedule through the scheduler and cost model the simulated
server uses (``sim.virtual``) and writes the same run folder ``execute_run`` writes
(``run.parquet``, ``schedule.parquet``, ``requests/``, ``server_metrics/``), with
``run.clock`` = ``virtual: ...``. Every analysis, report and gate reads it unchanged.

The answer depends on the question alone: times come from the model, never from the host,
so the same schedule and configuration give the same rows on any machine under any load.
The run id is a digest of what was run; only ``run.parquet``'s wall-clock fields
(``start_utc``, ``end_utc``, ``t0_unix_ns``, ``host_json``, ``notes_json.wall_s``) say
when and where it was computed.
"""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

from bench_llm.analysis.capacity_points import max_in_flight
from bench_llm.analysis.load import Run
from bench_llm.bench.execute import RunConfig, RunResult, prepare_run_dir, stats_notes
from bench_llm.bench.run_meta import describe_run, run_meta, workload_meta
from bench_llm.bench.virtual_graph import graph_links
from bench_llm.core import __version__
from bench_llm.core.errors import BenchError
from bench_llm.core.memo import SizedMemo
from bench_llm.core.tokenizer import output_token
from bench_llm.launch.config import ParallelConfig
from bench_llm.launch.process import EngineStartError
from bench_llm.loadgen.runner import RunStats
from bench_llm.results.reader import run_meta_of
from bench_llm.results.schema import REQUESTS_DIR, REQUESTS_SCHEMA, RUN_FILE, SERVER_METRICS_DIR, SERVER_METRICS_SCHEMA
from bench_llm.results.writer import run_meta_table, write_run_meta, write_schedule, write_table_atomic
from bench_llm.sim.backend import ModelBackend
from bench_llm.sim.options import ModelTiming, describe
from bench_llm.sim.virtual import CANCELLED, OK, REJECTED, UNSENT, Outcome, Plan, Send, run
from bench_llm.workloads.spec import RequestSpec, Schedule

#: ``run.parquet`` ``clock`` of a virtual-time run.
CLOCK_LABEL = "virtual: the simulated engine's scheduler and cost model in virtual time (no server, no client)"
#: ``token_source`` of its rows: the engine's own count, one token per chunk.
TOKEN_SOURCE = "model_exact"
#: Requests per ``requests/`` part file.
PART_ROWS = 16384


@dataclass(frozen=True)
class VirtualEngine:
    """The simulated engine at one configuration, as ``bench sim serve`` would model it."""

    timing: ModelTiming
    flavor: str
    #: the ``bench sim serve`` arguments it stands for (recorded as the engine's argv)
    argv: tuple[str, ...]

    @property
    def version(self) -> str:
        return f"bench-sim {__version__} (virtual time)"

    def backend(self) -> ModelBackend:
        return ModelBackend(self.timing)


def virtual_engine(
    model: str, gpu: str | None, parallel: ParallelConfig, extra_args: Sequence[str] = (), flavor: str = "vllm"
) -> VirtualEngine:
    """The configuration the launcher would start (its own argv, parsed as ``bench sim serve``
    parses it: sim/serve_args.py),
    checked to fit in memory. Raises EngineStartError with the engine's own message."""
    from bench_llm.launch.launcher import LaunchSpec
    from bench_llm.launch.profiles import plan_engine
    from bench_llm.sim.costmodel import OutOfMemory
    from bench_llm.sim.faults import FaultSpec
    from bench_llm.sim.serve_args import build_config, parse_serve_args

    spec = LaunchSpec(engine="sim", model=model, parallel=parallel, gpu=gpu, extra_args=tuple(extra_args), flavor=flavor)
    argv = plan_engine(spec, 0, lambda host: 0).processes[0].argv
    args = _without_address(argv[argv.index("serve") + 1 :])
    try:
        cfg = build_config(parse_serve_args(args))
    except (BenchError, ValueError) as exc:
        raise EngineStartError(f"bench sim: {exc}") from None
    if cfg.model_timing is None:
        raise EngineStartError("virtual time models --timing model only")
    unsupported = [
        name
        for name, given in (
            ("--faults", cfg.faults != FaultSpec()),
            ("--natural-stop", cfg.natural_stop_mean > 0),
            ("--emission-log", cfg.emission_log is not None),
            ("--max-num-queued-reqs", cfg.max_num_queued_reqs > 0),  # admission rejections: real time only
        )
        if given
    ]
    if unsupported:
        raise EngineStartError(f"{', '.join(unsupported)}: not modelled in virtual time; measure in real time (--clock auto)")
    engine = VirtualEngine(cfg.model_timing, cfg.flavor, tuple(args))
    try:
        engine.backend()
    except OutOfMemory as exc:
        raise EngineStartError(str(exc)) from None
    return engine


def _without_address(args: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in ("--host", "--port"):
            skip = True
        else:
            out.append(a)
    return tuple(out)


# -- the schedule as the engine sees it -------------------------------------------------------


def _prompt_text(spec: RequestSpec, history: Sequence[str]) -> str:
    """The prompt text the adapters send (``adapters.openai``): a prompt, or messages (with a
    session's history) joined by newlines."""
    if spec.prompt is not None and not history:
        return spec.prompt
    return "\n".join([*history, *_contents(spec)])


def _contents(spec: RequestSpec) -> list[str]:
    return [m.content for m in spec.messages] if spec.messages is not None else [spec.prompt or ""]


def _answer(request_id: str, n: int) -> str:
    seed = zlib.crc32(request_id.encode())
    return "".join(output_token(seed, i) for i in range(n))


def _block_hashes(words: list[str], block_size: int) -> tuple[int, ...]:
    """Chained hashes of the prompt's full blocks: prompts sharing their first k blocks of
    text share their first k hashes, as the engine's token-id hashes do (``sim.request``).
    Only equality matters to the prefix cache (its order is insertion order), so Python's
    per-process string hash gives the same outcome in every process."""
    out = []
    h = 0
    for start in range(0, len(words) - block_size + 1, block_size):
        h = hash((h, *words[start : start + block_size]))
        out.append(h)
    return tuple(out)


class _KnownPrompts:
    """Prompts' (length, block hashes) by text, for one (block size, prefix caching): a sweep's
    cells send the same prompts at their n-th loads (``workloads.prompts.PromptSynth.texts``).
    Hashes are of this process (``_block_hashes``), so they are kept in it only; forgotten
    when another block size comes, the oldest first when the texts kept would pass ``MAX_CHARS``."""

    __slots__ = ("by_text", "key")
    MAX_CHARS = 1 << 24

    def __init__(self) -> None:
        self.key: tuple[int, bool] | None = None
        self.by_text: SizedMemo[str, tuple[int, tuple[int, ...]]] = SizedMemo(self.MAX_CHARS)

    def table(self, key: tuple[int, bool]) -> SizedMemo[str, tuple[int, tuple[int, ...]]]:
        if key != self.key:
            self.key, self.by_text = key, SizedMemo(self.MAX_CHARS)
        return self.by_text


_KNOWN = _KnownPrompts()


def schedule_sends(schedule: Schedule, backend: ModelBackend) -> list[Send]:
    """One ``Send`` per request of ``schedule`` (same order): lengths as the engine's tokenizer
    counts the prompt, block hashes for its prefix cache, session turns after their
    predecessor. A prompt too long for the context is kept and answered 400, as the server does."""
    measured_sessions: dict[str, list[int]] = {}
    for i, s in enumerate(schedule.requests):
        if s.session_id is not None and s.phase == "measure":
            measured_sessions.setdefault(s.session_id, []).append(i)
    prev: dict[int, int] = {}
    history: dict[int, list[str]] = {}
    for turns in measured_sessions.values():
        turns.sort(key=lambda i: schedule.requests[i].turn)
        for a, b in zip(turns, turns[1:]):
            prev[b] = a
    graph = graph_links(schedule)
    sends: list[Send] = []
    append = sends.append
    bs = backend.block_size
    prefix_caching = backend.prefix_caching
    open_loop = schedule.mode == "open"
    max_len = backend.max_model_len
    no_history: list[str] = []
    known = _KNOWN.table((bs, prefix_caching))
    for i, spec in enumerate(schedule.requests):  # (once per request of every load: locals only)
        link = graph.get(i) if graph else None
        if link is not None:
            before = link.history(history, schedule.requests, _answer)
        else:
            before = history.get(prev[i], no_history) if prev and i in prev else no_history
        text = spec.prompt if spec.prompt is not None and not before else _prompt_text(spec, before)
        if spec.session_id is not None:
            history[i] = [*before, *_contents(spec), _answer(spec.request_id, spec.max_output_tokens)]
        seen = known.get(text)
        if seen is None:
            words = text.split()  # the engine's tokens, without the whitespace its token ids ignore
            seen = (len(words) or 1, _block_hashes(words, bs) if prefix_caching else ())
            known.put(text, seen, len(text))
        n, hashes = seen
        out_tokens = spec.max_output_tokens
        append(
            Send(
                n,  # prompt_len
                out_tokens,  # max_tokens
                hashes,  # block_hashes
                spec.phase == "warmup",  # warmup
                spec.send_offset_ns if open_loop else None,  # at_ns
                prev.get(i) if link is None else link.after,  # after
                spec.think_time_ns if link is None else link.delay_ns,  # think_ns
                n + out_tokens > max_len,  # reject
                () if link is None else link.joins,
            )
        )
    return sends


# -- the run folder ------------------------------------------------------------------------------


def run_id_for(cfg: RunConfig, engine: VirtualEngine) -> str:
    """A digest of what the run is: the same question gets the same id."""
    key = {
        "config": cfg.config,
        "extra": cfg.extra,
        "engine": describe(engine.timing),
        "argv": engine.argv,
        "schedule": workload_meta(cfg.schedule),
        "options": [cfg.options.duration_s, cfg.options.drain_timeout_s, cfg.options.warmup_concurrency],
    }
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def execute_virtual(cfg: RunConfig, engine: VirtualEngine) -> RunResult:
    """Run ``cfg.schedule`` on ``engine`` in virtual time into ``cfg.out``."""
    done = simulate_run(cfg, engine)
    write_run_meta(done.result.run_dir, done.meta)
    return done.result


@dataclass(frozen=True)
class SimulatedRun:
    """A run simulated into its folder but for its run table (``run.parquet``, which makes the
    folder a run): a caller that adds to the metadata first writes it once (``write_run_meta``).
    The tables written are also kept here, so they need not be read back."""

    result: RunResult
    meta: dict[str, Any]  # as ``write_run_meta`` takes it
    requests: pa.Table
    server_metrics: pa.Table | None

    def run(self) -> Run:
        """The run as ``analysis.load.load_run`` would read it once its run table is written."""
        path = self.result.run_dir
        return Run(path, run_meta_of(run_meta_table(self.meta), path / RUN_FILE), self.requests, None)


def simulate_run(cfg: RunConfig, engine: VirtualEngine) -> SimulatedRun:
    """``execute_virtual`` without writing the run table."""
    unmodelled = _unmodelled_kinds(cfg.schedule.requests)
    if unmodelled:
        raise BenchError(f"virtual time models plain text generation; {unmodelled}: measure in real time (--clock auto)")
    wall0 = time.perf_counter()
    run_dir = prepare_run_dir(cfg.out, cfg.overwrite)
    run_id = run_id_for(cfg, engine)
    backend = engine.backend()
    sends = schedule_sends(cfg.schedule, backend)
    opts = cfg.options
    plan = Plan(
        concurrency=cfg.schedule.concurrency if cfg.schedule.mode == "closed" else None,
        warmup_concurrency=opts.warmup_concurrency,
        duration_ns=None if opts.duration_s is None else int(opts.duration_s * 1e9),
        drain_ns=int(opts.drain_timeout_s * 1e9),
        tick_ns=int(cfg.scrape_interval_s * 1e9) if cfg.scrape_interval_s else None,
    )
    samples = _Samples(backend)
    result = run(backend, sends, plan, samples.take if plan.tick_ns else None)
    if plan.tick_ns:
        samples.take(result.end_ns)
    table = _requests_table(run_id, cfg.schedule.requests, sends, result.outcomes, backend.max_model_len)
    for k, start in enumerate(range(0, max(1, table.num_rows), PART_ROWS)):
        write_table_atomic(table.slice(start, PART_ROWS), run_dir / REQUESTS_DIR / f"part-000-{k:06d}.parquet")
    server_metrics = samples.table(result.outcomes) if plan.tick_ns else None
    if server_metrics is not None:
        write_table_atomic(server_metrics, run_dir / SERVER_METRICS_DIR / "part-000-000000.parquet")
    write_schedule(run_dir, cfg.schedule.requests)
    stats = _stats(result.outcomes, sends, result.t0_ns, result.end_ns)
    meta = _meta(cfg, engine, run_id, stats, time.perf_counter() - wall0)
    return SimulatedRun(RunResult(run_dir, run_id, stats), meta, table, server_metrics)


def _unmodelled_kinds(specs: Sequence[RequestSpec]) -> str:
    """The request kinds of ``specs`` the virtual-time engine does not model, in words ("" if none)."""
    kinds = []
    if any(s.constraint is not None for s in specs):
        kinds.append("structured output")
    if any(s.kind == "embeddings" for s in specs):
        kinds.append("embeddings")
    if any(s.tools for s in specs):
        kinds.append("tool calls")
    if any(s.images for s in specs):
        kinds.append("images")
    if any(s.model is not None for s in specs):
        kinds.append("a model mix (adapter swaps)")
    if any(s.sampling is not None and (s.sampling.n or 1) > 1 for s in specs):
        kinds.append("n > 1 (several sequences per request)")
    return ", ".join(kinds)


class _Samples:
    """The engine's state at every tick, as a scrape of its /metrics would show it
    (bench's common names; ``metric`` names say they were sampled in virtual time)."""

    GAUGES = (("waiting", "gauge"), ("running", "gauge"), ("kv_cache_usage", "gauge"),
              ("preemptions", "counter"), ("prefix_cache_queries", "counter"), ("prefix_cache_hits", "counter"))
    #: with speculative decoding: vLLM's counters (then one per draft position, labelled as vLLM's)
    SPEC = (("spec_decode_drafts", "counter"), ("spec_decode_draft_tokens", "counter"),
            ("spec_decode_accepted_tokens", "counter"))

    def __init__(self, backend: ModelBackend) -> None:
        self.backend = backend
        self.spec_k = backend.timing.spec_tokens
        self.rows: list[tuple[int, tuple[float, ...]]] = []

    def take(self, t: int) -> None:
        b = self.backend
        if self.rows and self.rows[-1][0] >= t:
            return
        row: tuple[float, ...] = (b.waiting, b.running, b.kv_usage, b.preemptions, b.prefix_queries, b.prefix_hits)
        spec = b.spec_decode
        if spec is not None:
            row += (spec.drafts, spec.draft_tokens, spec.accepted, *spec.accepted_per_pos)
        self.rows.append((t, row))

    def table(self, outcomes: Sequence[Outcome]) -> pa.Table:
        """The samples, plus the queue-time histogram's sum and count (the engine's
        ``queue_seconds``: admission minus arrival, of the requests finished by each tick)."""
        done = sorted((o.end_ns, o.queue_ns) for o in outcomes if o.state == OK and o.queue_ns is not None)
        ends = np.array([e for e, _ in done], dtype=np.int64)
        queue_sum = np.concatenate([[0.0], np.cumsum([q / 1e9 for _, q in done])])
        series = [(c, kind, "") for c, kind in self.GAUGES]
        if self.spec_k:
            series += [(c, kind, "") for c, kind in self.SPEC]
            series += [("spec_decode_accepted_tokens_per_pos", "counter", f'{{"position":"{i}"}}')
                       for i in range(self.spec_k)]
        series += [("queue_seconds", "histogram_sum", ""), ("queue_seconds", "histogram_count", "")]
        cols: dict[str, list[Any]] = {name: [] for name in SERVER_METRICS_SCHEMA.names}
        last: list[float | None] = [None] * len(series)
        for t, sampled in self.rows:
            finished = int(np.searchsorted(ends, t, side="right"))
            values = [*sampled, float(queue_sum[finished]), float(finished)]
            for k, ((common, kind, labels), value) in enumerate(zip(series, values)):
                suffix = {"histogram_sum": "_sum", "histogram_count": "_count"}.get(kind, "")
                cols["ts_ns"].append(t)
                cols["metric"].append(f"virtual:{common}{suffix}")
                cols["common"].append(common)
                cols["type"].append(kind)
                cols["labels"].append(labels)
                cols["le"].append(None)
                cols["value"].append(float(value))
                prev = last[k]
                cols["delta"].append(None if kind == "gauge" else float(value) - prev if prev is not None else float(value))
                last[k] = float(value)
        return pa.Table.from_pydict(cols, schema=SERVER_METRICS_SCHEMA)


def _requests_table(
    run_id: str, specs: Sequence[RequestSpec], sends: Sequence[Send], outcomes: Sequence[Outcome], max_len: int
) -> pa.Table:
    """The requests table of the sent requests, in send order (as a recorded run's rows)."""
    rows = sorted((o.intended_ns, i) for i, o in enumerate(outcomes) if o.state in (OK, CANCELLED, REJECTED))
    n = len(rows)
    # column by column (one comprehension each: this runs over every request of the run)
    sp = [specs[i] for _, i in rows]
    se = [sends[i] for _, i in rows]
    oc = [outcomes[i] for _, i in rows]
    ok = [o.state == OK for o in oc]
    intended = [o.intended_ns for o in oc]
    first = [o.token_ns[0] if o.token_ns else None for o in oc]
    n_tokens = [len(o.token_ns) for o in oc]
    lengths = np.array(n_tokens, dtype=np.int64) if n else np.zeros(0, dtype=np.int64)
    cols: dict[str, list[Any]] = {
        "run_id": [run_id] * n,
        "request_id": [s.request_id for s in sp],
        "phase": [s.phase for s in sp],
        "worker_id": [0] * n,
        "session_id": [s.session_id for s in sp],
        "turn": [s.turn for s in sp],
        "prefix_group": [s.prefix_group for s in sp],
        "intended_send_ns": intended,
        "send_ns": intended,
        "first_byte_ns": intended,
        "first_token_ns": first,
        "first_content_ns": first,
        "end_ns": [o.end_ns for o in oc],
        "output_tokens": n_tokens,
        "token_source": [TOKEN_SOURCE] * n,
        "input_tokens_target": [s.input_tokens for s in sp],
        "input_tokens_source": [s.input_tokens_source for s in sp],
        "max_output_tokens": [s.max_output_tokens for s in sp],
        "prompt_tokens": [d.prompt_len if k else None for d, k in zip(se, ok)],
        "completion_tokens": [t if k else None for t, k in zip(n_tokens, ok)],
        "cached_tokens": [o.cached_tokens if k else None for o, k in zip(oc, ok)],
        "http_status": [400 if o.state == REJECTED else 200 for o in oc],
        "finish_reason": ["length" if k else None for k in ok],
        "ok": ok,
        "error_type": [None if k else "http_error" if o.state == REJECTED else "cancelled" for o, k in zip(oc, ok)],
        "error_message": [None if k else _error_message(o.state, d, max_len) for o, d, k in zip(oc, se, ok)],
        "server_request_id": [f"v{i}" for _, i in rows],
        "output_text": [None] * n,
        "server_timing_json": [None] * n,  # TTFT is the model's own here; no engine report to split
        "length_class": [s.length_class for s in sp],
        "reasoning_tokens": [0 if k else None for k in ok],  # the modelled engine does not reason
        "kind": [None] * n,  # text generation only (execute_virtual refuses the other kinds)
        "model": [s.model for s in sp],
        "structured_ok": [None] * n,
        "inputs": [None] * n,
        "tool_calls": [None] * n,
        "first_tool_call_ns": [None] * n,
        "images": [None] * n,
        "n": [None] * n,  # one sequence per request (execute_virtual refuses n > 1)
        "protocol_anomaly": [None] * n,  # no stream is read in virtual time
    }
    missing = sorted(set(REQUESTS_SCHEMA.names) - {"chunk_ns", "chunk_tokens"} - set(cols))
    assert not missing, f"requests columns left unfilled: {missing}"  # a schema column added without a value here
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.fromiter(chain.from_iterable(outcomes[i].token_ns for _, i in rows), dtype=np.int64, count=int(offsets[-1]))
    arrays: dict[str, pa.Array] = {}
    for f in REQUESTS_SCHEMA:
        if f.name == "chunk_ns":
            arrays[f.name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        elif f.name == "chunk_tokens":
            arrays[f.name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.ones(len(values), dtype=np.int32)))
        else:
            arrays[f.name] = pa.array(cols[f.name], type=f.type)
    return pa.Table.from_arrays([arrays[f.name] for f in REQUESTS_SCHEMA], schema=REQUESTS_SCHEMA)


def _error_message(state: str, send: Send, max_len: int) -> str:
    if state == REJECTED:
        return (
            f"HTTP 400: This model's maximum context length is {max_len} tokens. However, you requested "
            f"{send.prompt_len + send.max_tokens} tokens ({send.prompt_len} in the messages, {send.max_tokens} "
            "in the completion)."
        )
    return "cancelled before completion (still running at the drain deadline)"


def _stats(outcomes: Sequence[Outcome], sends: Sequence[Send], t0: int, end: int) -> RunStats:
    stats = RunStats(t0_ns=t0, end_ns=end)
    measured = [o for o, s in zip(outcomes, sends) if o.state != UNSENT]
    stats.sent = len(measured)
    stats.completed = sum(1 for o in measured if o.state == OK)
    stats.cancelled = sum(1 for o in measured if o.state == CANCELLED)
    stats.failed = stats.sent - stats.completed - stats.cancelled
    if stats.failed:
        stats.error_types["http_error"] = stats.failed
    stats.max_in_flight = _max_in_flight(measured)
    return stats


def _max_in_flight(outcomes: Sequence[Outcome]) -> int:
    """Most requests in flight at once (a request without an end counts from its send only)."""
    starts = np.fromiter((o.intended_ns for o in outcomes), dtype=np.int64, count=len(outcomes))
    ends = np.fromiter((o.end_ns or o.intended_ns for o in outcomes), dtype=np.int64, count=len(outcomes))
    return max_in_flight(starts, ends)


def _meta(cfg: RunConfig, engine: VirtualEngine, run_id: str, stats: RunStats, wall_s: float) -> dict[str, Any]:
    description = describe_run(
        command=cfg.command,
        config={
            **cfg.config,
            "engine_launch": {"version": engine.version, "argv": list(engine.argv), "clock": "virtual"},
            "sim_model": describe(engine.timing),
        },
        engine=cfg.engine,
        model=cfg.model,
        adapter={"transport": "virtual", "flavor": engine.flavor},
        schedule=cfg.schedule,
        extra=cfg.extra,
    )
    meta = run_meta(run_id, description, clock=CLOCK_LABEL, status="complete")
    meta.update(
        end_utc=meta["start_utc"],
        t0_monotonic_ns=stats.t0_ns,
        notes_json={**stats_notes(stats, []), "wall_s": round(wall_s, 3)},
    )
    return meta
