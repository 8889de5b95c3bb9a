"""From a workload definition to a schedule: first a plan (numbers only), then prompts.

The plan holds lengths, send offsets and structure (sessions, prefix groups, trace
blocks) as arrays; ``bench workload show`` summarises it without building any text.
``materialize`` turns it into ``RequestSpec``s. Each part draws from its own seeded
stream (``SeedSequence(seed).spawn``), so, e.g., changing the arrival process does not
change the lengths, and the same seed always gives the same schedule byte for byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bench_llm.workloads.arrivals import ArrivalSpec, offsets_s, parse_arrival, trace_offsets
from bench_llm.workloads.definition import WorkloadDef
from bench_llm.workloads.distributions import Mixture
from bench_llm.workloads.errors import TraceWithoutTimestamps, WorkloadError
from bench_llm.workloads.prompts import BlockTexts, PromptSynth, make_synth
from bench_llm.workloads.readers import TraceTable, read_trace
from bench_llm.workloads.spec import MAX_REQUEST_TOKENS, RequestOptions, RequestSpec, Schedule

if TYPE_CHECKING:
    from bench_llm.workloads.graph_plan import GraphArrays

#: stream indices of SeedSequence(seed).spawn(N)
_LENGTHS, _ARRIVALS, _STRUCTURE, _PROMPTS, _WARMUP = range(5)
MAX_REQUESTS = 10_000_000


@dataclass(frozen=True)
class Plan:
    """A schedule's numbers, before any prompt text exists (measured requests only)."""

    name: str
    seed: int
    mode: str  # open | closed
    arrival: ArrivalSpec | None
    rate: float | None
    concurrency: int | None
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    offsets_s: np.ndarray | None  # per request; NaN for later session turns
    session: np.ndarray  # session index per request, -1 = none
    turn: np.ndarray
    think_s: np.ndarray
    prefix_group: np.ndarray  # -1 = none
    prefix_tokens: int
    warmup_input: np.ndarray
    warmup_output: np.ndarray
    trace: TraceTable | None = None
    trace_rows: np.ndarray | None = None  # row of the trace per request
    description: dict[str, object] | None = None
    length_class: np.ndarray | None = None  # a mixture's component label per request ('short', 'long' …)
    graph: GraphArrays | None = None  # session graphs: predecessors, delays, contexts (workloads/graph_plan.py)

    def __len__(self) -> int:
        return int(len(self.input_tokens))


def _streams(seed: int) -> list[np.random.Generator]:
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(5)]


def dataset_sample(rows: int, requests: int, seed: int) -> np.ndarray:
    """Which dataset rows ``requests`` requests take: seeded permutations of the rows, one
    after another (a row repeats only once every row was taken). Its own seed stream, so a
    dataset sample leaves the other draws of the same seed unchanged."""
    rng = np.random.default_rng([seed, 0x5E7])
    perms = [rng.permutation(rows) for _ in range(-(-requests // rows))]
    return np.concatenate(perms)[:requests]


def _check_counts(requests: int, warmup: int) -> None:
    if requests < 1:
        raise WorkloadError("$requests must be at least 1")
    if requests > MAX_REQUESTS:
        raise WorkloadError(f"$requests {requests}: at most {MAX_REQUESTS:,} per schedule")
    if warmup < 0:
        raise WorkloadError("$warmup must be >= 0")


def _load_mode(
    wd: WorkloadDef, rate: float | None, arrival: str | None, concurrency: int | None, is_trace: bool
) -> tuple[str, ArrivalSpec | None, float | None, int | None]:
    if rate is not None and concurrency is not None:
        raise WorkloadError("give either $rate (open loop) or $concurrency (closed loop), not both")
    arrival_text = arrival or wd.arrival
    if rate is None and concurrency is None:
        rate, concurrency = wd.rate, wd.concurrency
    if concurrency is not None:
        if concurrency < 1:
            raise WorkloadError("$concurrency must be at least 1")
        return "closed", None, None, concurrency
    if rate is None:
        if is_trace and (arrival_text is None or arrival_text.startswith("trace")):
            return "open", parse_arrival(arrival_text or "trace"), None, None
        spec = parse_arrival(arrival_text or "poisson")
        if spec.process not in ("steps", "ramp"):
            unit = "jobs/s" if wd.graph is not None else "requests/s"
            raise WorkloadError(f"workload {wd.name!r}: give $rate ({unit}, open loop) or $concurrency (closed loop)")
        return "open", spec, None, None
    if not (rate > 0 and math.isfinite(rate)):
        raise WorkloadError("$rate must be a positive number of requests per second")
    spec = parse_arrival(arrival_text or "poisson")
    if spec.process == "trace" and not is_trace:
        raise WorkloadError("arrival trace replays a trace file's timestamps; this workload has none")
    return "open", spec, rate, None


def _trace_rows(wd: WorkloadDef, requests: int, seed: int) -> tuple[TraceTable | None, np.ndarray | None]:
    """A trace workload's table and the rows it replays, in order (None, None otherwise)."""
    if wd.trace is None:
        return None, None
    tc = wd.trace
    opts: dict[str, object] = {}
    if tc.model is not None or tc.log_type is not None:
        opts = {"model": tc.model, "log_type": tc.log_type}
    if tc.output_tokens is not None:
        opts["output_tokens"] = tc.output_tokens
    table = read_trace(tc.path, tc.format, **opts)
    if tc.start < 0 or tc.start >= len(table):
        raise WorkloadError(f"trace start {tc.start}: the file has {len(table)} requests")
    if table.format == "dataset":
        order = dataset_sample(len(table) - tc.start, requests, seed) + tc.start
    elif table.timestamps_s is not None:
        order = np.argsort(table.timestamps_s, kind="stable")
    else:
        order = np.arange(len(table))
    return table, (order[tc.start : tc.start + requests] if table.format != "dataset" else order)


def _lengths(
    wd: WorkloadDef, table: TraceTable | None, rows: np.ndarray | None, requests: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(input, output, length class or None) per request: the trace's, else drawn."""
    if table is not None and rows is not None:
        return table.input_tokens[rows].copy(), table.output_tokens[rows].copy(), None
    assert wd.lengths is not None
    if isinstance(wd.lengths, Mixture):
        inputs, outputs, length_class = wd.lengths.sample_labelled(requests, rng)
        return inputs, outputs, length_class
    inputs, outputs = wd.lengths.sample(requests, rng)
    return inputs, outputs, None


def _sessions(
    wd: WorkloadDef,
    table: TraceTable | None,
    rows: np.ndarray | None,
    requests: int,
    inputs: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(session, turn, think time in s, inputs): the trace's sessions, else drawn ones whose
    later turns may take their own input lengths (-1: no session)."""
    session = np.full(requests, -1, dtype=np.int64)
    turn = np.zeros(requests, dtype=np.int64)
    think = np.zeros(requests)
    if table is not None and table.session_ids is not None and rows is not None:
        ids = {sid: i for i, sid in enumerate(dict.fromkeys(s for s in table.session_ids if s is not None))}
        for j, r in enumerate(rows):
            sid = table.session_ids[r]
            if sid is not None:
                session[j] = ids[sid]
                turn[j] = table.turns[r] if table.turns else 0  # type: ignore[index]
                think[j] = table.think_time_s[r] if table.think_time_s else 0.0  # type: ignore[index]
    elif wd.sessions is not None:
        sc = wd.sessions
        i = s = 0
        while i < requests:
            k = min(int(rng.integers(sc.turns_min, sc.turns_max + 1)), requests - i)
            session[i : i + k] = s
            turn[i : i + k] = np.arange(k)
            i += k
            s += 1
        later = turn > 0
        if sc.think_time_s > 0:
            if sc.think == "fixed":
                think[later] = sc.think_time_s
            else:
                think[later] = rng.exponential(sc.think_time_s, size=int(later.sum()))
        if sc.followup_input is not None:
            follow = sc.followup_input.build("sessions.followup_input")
            inputs[later] = follow.sample(int(later.sum()), rng)
    return session, turn, think, inputs


def _prefix_groups(
    wd: WorkloadDef,
    table: TraceTable | None,
    session: np.ndarray,
    turn: np.ndarray,
    inputs: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, int, np.ndarray]:
    """(prefix group per request, -1 for none; prefix tokens; inputs with the prefix)."""
    requests = len(session)
    group = np.full(requests, -1, dtype=np.int64)
    if wd.prefix is None or table is not None:
        return group, 0, inputs
    pc = wd.prefix
    pc.validate()
    shares = np.asarray(pc.shares(), dtype=float)
    probs = np.append(shares, max(0.0, 1.0 - shares.sum()))
    g = rng.choice(len(probs), size=requests, p=probs / probs.sum())
    group = np.where(g < len(shares), g, -1).astype(np.int64)
    if session.max() >= 0:  # a session keeps its first turn's group
        first: dict[np.int64, np.int64] = {}
        for j in range(requests):
            if session[j] >= 0:
                first.setdefault(session[j], group[j])
                group[j] = first[session[j]]
    with_prefix = (group >= 0) & (turn == 0)
    if pc.included:
        inputs = np.where(with_prefix, np.maximum(inputs, pc.tokens + 1), inputs)
    else:
        inputs = np.where(with_prefix, inputs + pc.tokens, inputs)
    return group, pc.tokens, inputs


def _offsets(
    wd: WorkloadDef,
    table: TraceTable | None,
    rows: np.ndarray | None,
    mode: str,
    arr: ArrivalSpec | None,
    rate: float | None,
    session: np.ndarray,
    turn: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray | None:
    """Open loop: the send offset in s of each request that starts a unit (a request or a
    session's first turn; NaN for later turns); None in closed loop."""
    if not (mode == "open" and arr is not None):
        return None
    requests = len(session)
    starts = (session < 0) | (turn == _first_turns(session, turn))
    n_units = int(starts.sum())
    if arr.process == "trace":
        assert table is not None and table.timestamps_s is not None and rows is not None and wd.trace is not None
        scale = float(arr.params.get("time_scale", wd.trace.time_scale))  # type: ignore[arg-type]
        bucket = wd.trace.bucket_s if wd.trace.bucket_s is not None else table.bucket_s
        unit_offsets = trace_offsets(table.timestamps_s[rows][starts], scale, bucket)
    else:
        unit_rate = rate
        if rate is not None and wd.sessions is not None and table is None:
            unit_rate = rate * n_units / requests  # sessions start so requests/s ~ the rate asked
        unit_offsets = offsets_s(arr, n_units, unit_rate, rng)
    offsets = np.full(requests, np.nan)
    offsets[starts] = unit_offsets
    return offsets


def _warmup_lengths(
    wd: WorkloadDef, table: TraceTable | None, warmup: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The warm-up's (input, output) lengths: the same lengths, no structure, own stream."""
    if not warmup:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if wd.lengths is not None:
        w_in, w_out = wd.lengths.sample(warmup, rng)
        return w_in, w_out
    assert table is not None
    pick = rng.integers(0, len(table), size=warmup)
    return table.input_tokens[pick], table.output_tokens[pick]


def plan_workload(
    wd: WorkloadDef,
    *,
    requests: int,
    rate: float | None,
    arrival: str | None,
    concurrency: int | None,
    warmup: int,
    seed: int,
) -> Plan:
    """The plan of ``wd``: one step per concern (trace rows, load mode, lengths, sessions,
    prefix groups, arrivals, warm-up), each drawing from its own seeded stream."""
    _check_counts(requests, warmup)
    rngs = _streams(seed)
    if wd.graph is not None:
        return _plan_graph(wd, requests=requests, rate=rate, arrival=arrival, concurrency=concurrency,
                           warmup=warmup, seed=seed, rngs=rngs)
    table, rows = _trace_rows(wd, requests, seed)
    if rows is not None:
        requests = len(rows)
    mode, arr, rate, concurrency = _load_mode(wd, rate, arrival, concurrency, table is not None)
    if arr is not None and arr.process == "trace" and (table is None or table.timestamps_s is None):
        raise TraceWithoutTimestamps(
            "this trace file has no timestamps to replay: give $rate (open loop) or $concurrency (closed loop)"
        )
    inputs, outputs, length_class = _lengths(wd, table, rows, requests, rngs[_LENGTHS])
    session, turn, think, inputs = _sessions(wd, table, rows, requests, inputs, rngs[_STRUCTURE])
    group, prefix_tokens, inputs = _prefix_groups(wd, table, session, turn, inputs, rngs[_STRUCTURE])
    offsets = _offsets(wd, table, rows, mode, arr, rate, session, turn, rngs[_ARRIVALS])
    w_in, w_out = _warmup_lengths(wd, table, warmup, rngs[_WARMUP])

    return Plan(
        name=wd.name,
        seed=seed,
        mode=mode,
        arrival=arr,
        rate=rate,
        concurrency=concurrency,
        input_tokens=np.asarray(inputs, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        offsets_s=offsets,
        session=session,
        turn=turn,
        think_s=think,
        prefix_group=group,
        prefix_tokens=prefix_tokens,
        warmup_input=np.asarray(w_in, dtype=np.int64),
        warmup_output=np.asarray(w_out, dtype=np.int64),
        trace=table,
        trace_rows=rows,
        description=_describe(wd, table),
        length_class=length_class,
    )


def _plan_graph(
    wd: WorkloadDef,
    *,
    requests: int,
    rate: float | None,
    arrival: str | None,
    concurrency: int | None,
    warmup: int,
    seed: int,
    rngs: list[np.random.Generator],
) -> Plan:
    """The plan of a session-graph workload: jobs until ``requests`` requests (the last job keeps
    its first nodes only, a smaller valid graph; a file gives at most its own), arriving at
    ``rate`` jobs/s or ``concurrency`` at a time."""
    from bench_llm.workloads.graph import JobGraph
    from bench_llm.workloads.graph_plan import flatten, graph_offsets

    assert wd.graph is not None
    replayable = getattr(wd.graph, "has_offsets", False)
    mode, arr, rate, concurrency = _load_mode(wd, rate, arrival, concurrency, replayable)
    jobs = wd.graph.jobs(requests, rngs[_STRUCTURE])
    excess = sum(len(j.nodes) for j in jobs) - requests
    if excess > 0:  # the last job keeps its first nodes (each node's predecessors come before it)
        jobs[-1] = JobGraph(jobs[-1].nodes[: len(jobs[-1].nodes) - excess], jobs[-1].offset_s)
    ga = flatten(jobs, wd.name)
    inputs = ga.input_tokens.copy()
    group = np.full(len(inputs), -1, dtype=np.int64)
    prefix_tokens = 0
    fresh = ga.context < 0
    if wd.prefix is not None:  # every fresh conversation starts with its system prompt
        pc = wd.prefix
        pc.validate()
        shares = np.asarray(pc.shares(), dtype=float)
        probs = np.append(shares, max(0.0, 1.0 - shares.sum()))
        drawn = rngs[_STRUCTURE].choice(len(probs), size=len(inputs), p=probs / probs.sum())
        drawn = np.where(drawn < len(shares), drawn, -1)
        given = (ga.system >= 0) & (ga.system < pc.groups)
        group = np.where(fresh, np.where(given, ga.system, drawn), -1).astype(np.int64)
        with_prefix = group >= 0
        prefix_tokens = pc.tokens
        inputs = np.where(with_prefix, np.maximum(inputs, pc.tokens + 1) if pc.included else inputs + pc.tokens, inputs)
    offsets = graph_offsets(ga, arr, rate, rngs[_ARRIVALS], wd.graph) if mode == "open" and arr is not None else None
    if wd.lengths is not None:
        w_in, w_out = _warmup_lengths(wd, None, warmup, rngs[_WARMUP])
    else:
        w_in, w_out = np.full(warmup, 256, dtype=np.int64), np.full(warmup, 64, dtype=np.int64)
    desc = _describe(wd, None)
    desc["graph"] = {**wd.graph.describe(), "jobs": ga.jobs, "requests": int(len(inputs)), "rate_unit": "jobs/s"}
    return Plan(
        name=wd.name,
        seed=seed,
        mode=mode,
        arrival=arr,
        rate=rate,
        concurrency=concurrency,
        input_tokens=np.asarray(inputs, dtype=np.int64),
        output_tokens=ga.output_tokens,
        offsets_s=offsets,
        session=ga.session,
        turn=ga.turn,
        think_s=np.zeros(len(inputs)),
        prefix_group=group,
        prefix_tokens=prefix_tokens,
        warmup_input=np.asarray(w_in, dtype=np.int64),
        warmup_output=np.asarray(w_out, dtype=np.int64),
        description=desc,
        graph=ga,
    )


def _first_turns(session: np.ndarray, turn: np.ndarray) -> np.ndarray:
    """Per request, the smallest turn number of its session (its own turn when none)."""
    out = turn.copy()
    if session.max(initial=-1) < 0:
        return out
    first: dict[int, int] = {}
    for s, t in zip(session.tolist(), turn.tolist()):
        if s >= 0:
            first[s] = min(first.get(s, t), t)
    for j, s in enumerate(session.tolist()):
        if s >= 0:
            out[j] = first[s]
    return out


def _describe(wd: WorkloadDef, table: TraceTable | None) -> dict[str, object]:
    d: dict[str, object] = {"kind": "workload", "workload": wd.name}
    if wd.description:
        d["workload_description"] = wd.description
    if wd.lengths is not None:
        d["lengths"] = wd.lengths.describe()
    if wd.source:
        d["source"] = dict(wd.source)
    if table is not None:
        d["trace"] = {"path": table.path, "format": table.format, "rows": len(table), "dropped": table.dropped}
    if wd.prefix is not None:
        d["prefix"] = {
            "groups": wd.prefix.groups,
            "tokens": wd.prefix.tokens,
            "fractions": list(wd.prefix.shares()),
            "included": wd.prefix.included,
        }
    if wd.sessions is not None:
        s = wd.sessions
        d["sessions"] = {"turns_min": s.turns_min, "turns_max": s.turns_max, "think_time_s": s.think_time_s, "think": s.think}
    return d


def _check_sizes(plan: Plan) -> None:
    """Refuse, before any prompt is built, a request larger than one can be."""
    for what, arr in (("prompt", plan.input_tokens), ("output", plan.output_tokens),
                      ("prompt", plan.warmup_input), ("output", plan.warmup_output)):
        if len(arr) and int(arr.max()) > MAX_REQUEST_TOKENS:
            raise WorkloadError(
                f"workload {plan.name!r}: a request with a {int(arr.max()):,}-token {what}: more than a request "
                f"can hold (at most {MAX_REQUEST_TOKENS:,})"
            )


def _warmup_specs(plan: Plan, synth: PromptSynth, rng: np.random.Generator) -> list[RequestSpec]:
    """The warm-up requests (their prompts drawn from ``rng`` before the measured ones')."""
    return [
        RequestSpec(
            request_id=f"w{i:06d}",
            input_tokens=int(plan.warmup_input[i]),
            max_output_tokens=int(plan.warmup_output[i]),
            prompt=synth.text(int(plan.warmup_input[i]), rng),
            phase="warmup",
            input_tokens_source=synth.source,
        )
        for i in range(len(plan.warmup_input))
    ]


def _schedule_description(plan: Plan, synth: PromptSynth, salt: int | None) -> dict[str, Any]:
    """The schedule's ``description`` (``run.parquet`` ``workload_json``): the plan's, the prompt
    source, the salt, the arrival parameters and the request counts."""
    desc = dict(plan.description or {})
    desc["prompt"] = synth.describe()
    desc["prompt_salt"] = salt
    if plan.arrival is not None:
        desc["arrival_params"] = plan.arrival.as_dict()
    desc["requests"] = len(plan)
    desc["warmup"] = len(plan.warmup_input)
    return desc


def _graph_fields(ga: GraphArrays, j: int, width: int) -> dict[str, Any]:
    """A graph node's predecessors, delays and context as RequestSpec fields."""
    rid = lambda k: f"r{k:0{width}d}"  # noqa: E731
    ctx = int(ga.context[j])
    return {
        "after": tuple(rid(p) for p in ga.after[j]),
        "after_delay_ns": tuple(int(round(d * 1e9)) for d in ga.delays_s[j]),
        "context_from": None if ctx < 0 else rid(ctx),
    }


def materialize(plan: Plan, wd: WorkloadDef, synth: PromptSynth | None = None, salt: int | None = None) -> Schedule:
    """Build the prompts and the ``Schedule``.

    ``salt`` is mixed into every prompt text (shared prefixes and trace blocks included, so
    sharing inside the run is kept) and into nothing else: runs with different salts share no
    cached prefix. None: the text follows the seed alone.
    """
    _check_sizes(plan)
    if synth is None:
        synth = make_synth(wd.prompt.tokenizer, wd.prompt.tokenize_url, wd.prompt.model)
    rng = _streams(plan.seed)[_PROMPTS] if salt is None else np.random.default_rng([plan.seed, salt, _PROMPTS])
    salted = () if salt is None else (salt,)
    specs = _warmup_specs(plan, synth, rng)  # first: the warm-up's prompts come first from ``rng``
    prefix_text: dict[int, str] = {}
    if plan.prefix_tokens:
        for g in sorted(set(plan.prefix_group.tolist()) - {-1}):
            prefix_text[g] = synth.text(plan.prefix_tokens, np.random.default_rng([plan.seed, 7, g, *salted]))
    blocks: BlockTexts | None = None
    table = plan.trace
    source = synth.source
    if table is not None and table.hash_ids is not None:
        blocks = BlockTexts(plan.seed, table.block_tokens, salt=salt or 0)
        source = "approx"  # trace blocks are word text; exact on the simulated engine
    width = max(6, len(str(len(plan))))
    for j in range(len(plan)):
        n_in = int(plan.input_tokens[j])
        n_out = int(plan.output_tokens[j])
        row = int(plan.trace_rows[j]) if plan.trace_rows is not None else None
        g = int(plan.prefix_group[j])
        src = synth.source
        given = table.prompts[row] if (table is not None and table.prompts is not None and row is not None) else None
        ga = plan.graph
        if ga is not None and ga.prompts[j] is not None:
            given = ga.prompts[j]
        starts = int(plan.turn[j]) == 0 if ga is None else int(ga.context[j]) < 0
        if given is not None:
            prompt, src = given, "given"
        elif blocks is not None and row is not None and table is not None and table.hash_ids[row]:  # type: ignore[index]
            prompt, src = blocks.text(table.hash_ids[row], n_in), source  # type: ignore[index]
        elif g >= 0 and starts:
            prompt = synth.text(n_in - plan.prefix_tokens, rng, prefix_text[g])
        else:
            prompt = synth.text(n_in, rng)
        s = int(plan.session[j])
        off = plan.offsets_s[j] if plan.offsets_s is not None else math.nan
        group_label = None
        if g >= 0:
            group_label = f"p{g}"
        elif table is not None and table.prefix_groups is not None and row is not None:
            group_label = table.prefix_groups[row]
        specs.append(
            RequestSpec(
                request_id=f"r{j:0{width}d}",
                input_tokens=n_in,
                max_output_tokens=n_out,
                prompt=prompt,
                send_offset_ns=None if math.isnan(off) else int(round(off * 1e9)),
                session_id=None if s < 0 else f"{'s' if ga is None else 'j'}{s:0{width}d}",
                turn=int(plan.turn[j]),
                think_time_ns=int(round(float(plan.think_s[j]) * 1e9)),
                prefix_group=group_label,
                input_tokens_source=src,
                length_class=None if plan.length_class is None else str(plan.length_class[j]),
                **(_graph_fields(ga, j, width) if ga is not None else {}),
            )
        )
    schedule = Schedule(
        name=plan.name,
        seed=plan.seed,
        mode=plan.mode,  # type: ignore[arg-type]
        requests=tuple(specs),
        concurrency=plan.concurrency,
        rate=plan.rate,
        arrival=plan.arrival.text if plan.arrival is not None else "closed",
        description=_schedule_description(plan, synth, salt),
    )
    return schedule.with_request(wd.request) if wd.request != RequestOptions() else schedule
