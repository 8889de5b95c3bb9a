"""The run summary: counts, latency percentiles, throughput, goodput, client health."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from bench_llm.analysis.client_health import client_health
from bench_llm.analysis.distributions import (
    EXACT_LIMIT,
    HISTOGRAM_RELATIVE_ERROR,
    Binned,
    PooledDistribution,
    final_summaries,
    keep_freed_memory,
    percentiles,
)
from bench_llm.analysis.failures import top_errors
from bench_llm.analysis.invariants import CHECK_COLUMNS, anomaly_counts, check_records, timing_measurable
from bench_llm.analysis.kinds import kinds_summary
from bench_llm.analysis.metrics import (
    NS_PER_MS,
    ChunkGaps,
    chunk_gaps,
    max_itl_ms,
    measured,
    one_token_chunks,
    one_token_gap_rows_ok,
    one_token_gaps,
    per_token_rows,
    scalar_columns,
    scalar_metrics,
    sequences,
    token_chunks,
    token_range_gaps,
    token_ranges,
)
from bench_llm.analysis.slo import SLO, SLO_METRICS
from bench_llm.analysis.smoothness import (
    Deadlines,
    batch_smoothness,
    one_token_fluidity,
    send_ns_float,
    token_range_fluidity,
)
from bench_llm.analysis.summary_types import (
    DistributionMethod,
    PromptLengths,
    Reasoning,
    RequestCounts,
    RunSummary,
    SloAttainment,
    Smoothness,
    Throughput,
    TimingCheck,
    TokenAccounting,
)
from bench_llm.analysis.totals import RunTotals, judged_mask, run_totals
from bench_llm.core.memory import return_freed_memory
from bench_llm.results.record import SOURCE_NON_STREAMING
from bench_llm.results.schema import REQUESTS_SCHEMA

REQUESTS_COLUMN_NAMES = tuple(REQUESTS_SCHEMA.names)

DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99)
LATENCY_METRICS = ("ttft_ms", "ttfo_ms", "tpot_ms", "itl_ms", "chunk_gap_ms", "e2e_ms", "schedule_lag_ms")

#: Finish reasons that mean the model ended the answer itself (end-of-sequence token or a stop
#: sequence), as vLLM/SGLang ("stop") and TGI ("eos_token", "stop_sequence") name them.
NATURAL_STOPS = ("stop", "eos_token", "stop_sequence")


@dataclass(frozen=True, slots=True)
class SummaryOptions:
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    slo: SLO = SLO()


def slo_mask(df: pd.DataFrame, slo: SLO) -> np.ndarray:
    """True for requests that completed and met every SLO bound.

    A request with fewer than two output tokens has no TPOT and is not judged on it.
    """
    ok = df["ok"].to_numpy(dtype=bool)
    mask = ok.copy()
    for key, limit in slo.request_limits:
        col = df[SLO_METRICS[key]].to_numpy(dtype=float)
        mask &= np.where(np.isnan(col), key in ("tpot_ms", "itl_max_ms"), col <= limit)
    return mask & ok


def summarize(table: pa.Table, options: SummaryOptions = SummaryOptions(), monitor: pa.Table | None = None) -> RunSummary:
    """Summary of the measured (non-warm-up) requests of ``table``."""
    batches: Iterable[pa.Table | pa.RecordBatch] = table.to_batches() if table.num_rows else [table]
    return summarize_batches(batches, options, monitor)


def summarize_run(
    run_dir: Path,
    options: SummaryOptions = SummaryOptions(),
    monitor: pa.Table | None = None,
    requests: pa.Table | None = None,
) -> RunSummary:
    """``summarize`` of a run folder's requests, the chunk lists streamed record batch by
    record batch.

    The per-request columns (REQUEST_SCALAR_COLUMNS) are read at once, or taken from
    ``requests`` when the caller already holds them (every row of the run, in file order, as
    ``analysis.load.load_run`` reads them); the chunk lists of one batch at a time are in
    memory, and the token-level distributions are pooled as they go (PooledDistribution).
    """
    from bench_llm.analysis.load import iter_request_batches
    from bench_llm.results.reader import read_requests

    return_freed_memory()  # what the caller freed (a run's own heap) is not kept beside the summary's
    keep_freed_memory()
    if requests is None or any(c not in requests.column_names for c in REQUEST_SCALAR_COLUMNS):
        requests = read_requests(run_dir, list(REQUEST_SCALAR_COLUMNS))
    batches = iter_request_batches(run_dir, list(REQUEST_STREAMED_COLUMNS), batch_rows=SUMMARY_BATCH_ROWS)
    try:
        return summarize_batches(batches, options, monitor, scalars=requests.select(list(REQUEST_SCALAR_COLUMNS)))
    except _RowsChanged:  # parts added since ``requests`` was read (a run still recording): one pass
        return summarize_batches(iter_request_batches(run_dir, list(REQUEST_COLUMNS)), options, monitor)


#: Rows per streamed batch: a few batches are in flight (``_pool_batches``), each with its
#: chunk lists and their per-token arrays, so this bounds the summary's working memory
#: (about 12 MB per 1024 rows of 256 tokens, ``docs/metrics.md``, Memory). 512: against
#: 1024, about 15 MB less at the peak of ``bench summary`` on 24,576 requests x 256 tokens,
#: the same CPU time (benchmarks/instrument.py scale data, side by side).
SUMMARY_BATCH_ROWS = 512


class _RowsChanged(Exception):
    """The streamed batches do not hold the rows of the per-request table given with them."""


#: The per-request columns ``summarize`` reads, and all the columns it reads.
REQUEST_SCALAR_COLUMNS: tuple[str, ...] = tuple(
    c for c in scalar_columns(list(REQUESTS_COLUMN_NAMES))
    if c not in ("run_id", "request_id", "worker_id", "cached_tokens", "session_id", "prefix_group",
                 "server_timing_json", "length_class")
)
REQUEST_COLUMNS: tuple[str, ...] = (*REQUEST_SCALAR_COLUMNS, "chunk_ns", "chunk_tokens")
#: What ``summarize_run`` streams batch by batch (the per-request columns are read at once).
REQUEST_STREAMED_COLUMNS: tuple[str, ...] = ("chunk_ns", "chunk_tokens")
#: The per-request columns joined onto each streamed batch (the record invariants need the stamps).
_JOINED_COLUMNS: tuple[str, ...] = ("phase", "n", *CHECK_COLUMNS)
#: Per-row arrays of a prepared batch: max ITL, fluidity, missed deadlines, longest gap,
#: anomaly code, one-read flag.
_PerRow = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class _Portion(NamedTuple):
    """Token-level values for a ``PooledDistribution``, as ``add`` takes them, and counted
    into bins already (``binned``) when the distribution was a histogram by then."""

    values: np.ndarray
    repeats: np.ndarray | None = None
    placeholders: np.ndarray | None = None
    binned: Binned | None = None


class _Prepared(NamedTuple):
    """One batch's share of the summary (``_prepare``)."""

    scalars: pa.Table | None  # its per-request columns, when the caller gave none
    per_row: _PerRow | None  # None: no measured row
    itl: _Portion | None
    chunk_gap: _Portion | None  # None: the very same values as ``itl``


def _portion(
    values: np.ndarray, repeats: np.ndarray | None = None, placeholders: np.ndarray | None = None, binned: bool = False
) -> _Portion:
    return _Portion(
        values, repeats, placeholders, PooledDistribution.bin(values, repeats, placeholders) if binned else None
    )


def _pool(dist: PooledDistribution, portion: _Portion, same_as: PooledDistribution | None = None) -> None:
    if portion.binned is not None and dist.add_binned(portion.binned):
        return
    dist.add(portion.values, portion.repeats, same_as=same_as, placeholders=portion.placeholders)


def _prepare(
    batch: pa.Table | pa.RecordBatch, deadlines: Deadlines, keep_scalars: bool, bin_itl: bool, bin_gap: bool
) -> _Prepared:
    """Everything ``summarize_batches`` computes from one batch on its own: the measured
    rows' per-request columns (``keep_scalars``), their per-row smoothness figures, and their
    ITL and chunk-gap values (counted into bins when ``bin_itl`` / ``bin_gap``). Touches no
    shared state, so batches are prepared in worker threads."""
    batch = measured(batch)
    kept = None
    if keep_scalars:
        cols = scalar_columns(batch.schema.names)
        kept = pa.Table.from_batches([batch.select(cols)]) if isinstance(batch, pa.RecordBatch) else batch.select(cols)
    if batch.num_rows == 0:
        return _Prepared(kept, None, None, None)
    checks = check_records(batch)
    # an anomalous record feeds no metric: its tokens are left out like a failed request's;
    # a request of several sequences (n > 1) feeds no ITL, chunk gap or max ITL
    single = per_token_rows(batch)
    ok = batch.column("ok").to_numpy(zero_copy_only=False).astype(bool) & (checks.anomaly == 0) & single
    flags = (checks.anomaly, checks.one_read)
    ranges = token_ranges(batch)
    if ranges is not None:  # fastest path, the same numbers: one token per chunk, lists used in place
        gaps_ns, excluded, longest_ns = token_range_gaps(ranges, ok)
        longest = longest_ns / NS_PER_MS
        fluidity, misses = token_range_fluidity(ranges, send_ns_float(batch), deadlines, longest_ns)
        values = gaps_ns / NS_PER_MS
        row = (_single(longest, single), fluidity, misses, longest, *flags)
        return _Prepared(kept, row, _portion(values, None, excluded, bin_itl), None)
    one = one_token_chunks(batch)
    if one is not None:  # fast path, the same numbers: one token per chunk, no row index
        gap_ns, longest_ns = one_token_gaps(one)
        longest = longest_ns / NS_PER_MS
        fluidity, misses = one_token_fluidity(one, send_ns_float(batch), deadlines)
        if not ok.all():
            gap_ns = gap_ns[one_token_gap_rows_ok(one, ok)]
        values = gap_ns / NS_PER_MS
        return _Prepared(kept, (_single(longest, single), fluidity, misses, longest, *flags), _portion(values, binned=bin_itl),
                         None)
    chunks = token_chunks(batch)
    gaps = chunk_gaps(chunks)
    fluidity, misses, longest = batch_smoothness(chunks, gaps, send_ns_float(batch), deadlines)
    row = (_single(max_itl_ms(gaps, batch.num_rows), single), fluidity, misses, longest, *flags)
    if not ok.all():
        sel = ok[gaps.row]
        gaps = ChunkGaps(gaps.gap_ns[sel], gaps.tokens[sel], gaps.row[sel])
    # the same values, element by element, as itl_ms()/chunk_gap_ms() of the ok rows
    itl = _portion(gaps.gap_ns / gaps.tokens / NS_PER_MS, gaps.tokens, binned=bin_itl)
    return _Prepared(kept, row, itl, _portion(gaps.gap_ns / NS_PER_MS, binned=bin_gap))


def _single(max_itl: np.ndarray, single: np.ndarray) -> np.ndarray:
    """Max ITL per row, NaN for the rows of several sequences (``per_token_rows``)."""
    return max_itl if single.all() else np.where(single, max_itl, np.nan)


def summarize_batches(
    batches: Iterable[pa.Table | pa.RecordBatch],
    options: SummaryOptions = SummaryOptions(),
    monitor: pa.Table | None = None,
    exact_limit: int = EXACT_LIMIT,
    scalars: pa.Table | None = None,
) -> RunSummary:
    """``summarize`` over the requests table given as consecutive batches of rows.

    ``scalars``: the whole table's REQUEST_SCALAR_COLUMNS (every row, warm-up included, in
    the batches' order) when the batches hold only REQUEST_STREAMED_COLUMNS.
    Per-request metrics are computed per batch and kept (one value per request); ITL and
    chunk gaps go into pooled distributions, exact up to ``exact_limit`` values each
    (docs/metrics.md, Aggregates). Batches are prepared (``_prepare``) by a thread per core
    and pooled in their order (``_pool_batches``), so the result does not depend on the
    threads; ``_summary_of`` then computes the figures.
    """
    deadlines = Deadlines.from_slo(options.slo.as_dict())
    pooled = _pool_batches(batches, deadlines, exact_limit, scalars)
    if scalars is None:
        table = pa.concat_tables(pooled.parts) if pooled.parts else pa.table({})
    else:
        if pooled.rows != scalars.num_rows:
            raise _RowsChanged(f"{scalars.num_rows} rows given, {pooled.rows} streamed")
        table = measured(scalars)
    return _summary_of(table, pooled, options, deadlines, monitor)


class _Pooled(NamedTuple):
    """What ``_pool_batches`` gathered from every batch."""

    rows: int  # rows streamed, warm-up and cool-down included
    cooldown: int  # rows of the cool-down (phase "cooldown")
    parts: list[pa.Table]  # the measured rows' per-request columns (when no ``scalars`` were given)
    per_row: list[_PerRow]
    itl: PooledDistribution
    chunk_gap: PooledDistribution


def _joined(batches: Iterable[pa.Table | pa.RecordBatch], scalars: pa.Table | None) -> Iterator[pa.Table | pa.RecordBatch]:
    """The batches, each with its rows' ``_JOINED_COLUMNS`` of ``scalars`` when given."""
    rows = 0
    for batch in batches:
        if scalars is not None:
            if batch.num_rows == 0:
                continue
            if rows + batch.num_rows > scalars.num_rows:
                raise _RowsChanged(f"more rows streamed than the {scalars.num_rows} given")
            joined = [c for c in _JOINED_COLUMNS if c in scalars.column_names]
            side = scalars.slice(rows, batch.num_rows).select(joined).combine_chunks()
            batch = pa.RecordBatch.from_arrays(
                [*(side.column(c).chunk(0) for c in joined), *batch.columns],
                names=[*joined, *batch.schema.names],
            )
        rows += batch.num_rows
        yield batch


def _pool_batches(
    batches: Iterable[pa.Table | pa.RecordBatch], deadlines: Deadlines, exact_limit: int, scalars: pa.Table | None
) -> _Pooled:
    """Prepare the batches in threads, a few ahead, and pool them in their order."""
    itl = PooledDistribution(exact_limit)
    chunk_gap = PooledDistribution(exact_limit)
    parts: list[pa.Table] = []
    per_row: list[_PerRow] = []
    rows = cooldown = 0
    workers = max(1, os.cpu_count() or 1)
    pending: deque[Future[_Prepared]] = deque()
    with ThreadPoolExecutor(workers, thread_name_prefix="bench-summary") as pool:
        try:
            for batch in _joined(batches, scalars):
                # whether to count a batch into bins in its thread is decided now, by the pooled state
                rows += batch.num_rows
                cooldown += _cooldown_rows(batch)
                pending.append(pool.submit(
                    _prepare, batch, deadlines, scalars is None,
                    itl.method == "histogram", chunk_gap.method == "histogram",
                ))
                if len(pending) > workers:
                    _take(pending.popleft().result(), parts, per_row, itl, chunk_gap)
                    return_freed_memory()  # the batch's temporaries, freed in the threads' arenas
            while pending:
                _take(pending.popleft().result(), parts, per_row, itl, chunk_gap)
            return_freed_memory()
        finally:
            for future in pending:
                future.cancel()
    return _Pooled(rows, cooldown, parts, per_row, itl, chunk_gap)


def _cooldown_rows(batch: pa.Table | pa.RecordBatch) -> int:
    return int(pc.sum(pc.equal(batch.column("phase"), "cooldown")).as_py() or 0)


def _take(
    prepared: _Prepared, parts: list[pa.Table], per_row: list[_PerRow], itl: PooledDistribution, chunk_gap: PooledDistribution
) -> None:
    """Pool one prepared batch (in batch order)."""
    if prepared.scalars is not None:
        parts.append(prepared.scalars)
    if prepared.per_row is None:
        return
    per_row.append(prepared.per_row)
    assert prepared.itl is not None
    _pool(itl, prepared.itl)
    if prepared.chunk_gap is None:
        _pool(chunk_gap, prepared.itl, same_as=itl)
    else:
        _pool(chunk_gap, prepared.chunk_gap)


def _summary_of(
    table: pa.Table, pooled: _Pooled, options: SummaryOptions, deadlines: Deadlines, monitor: pa.Table | None
) -> RunSummary:
    """The figures of the measured rows (``table``'s per-request columns, ``pooled``'s
    per-row arrays and token-level distributions)."""
    per_row = pooled.per_row
    df = scalar_metrics(table)
    row_arrays = [np.concatenate([p[i] for p in per_row]) if per_row else np.empty(0) for i in range(6)]
    df["max_itl_ms"] = row_arrays[0]
    df["anomaly"] = row_arrays[4].astype(np.int8) if per_row else np.zeros(len(df), np.int8)
    one_read = row_arrays[5].astype(bool) if per_row else np.zeros(len(df), bool)
    ps = options.percentiles
    judged = judged_mask(df)
    meets = slo_mask(df, options.slo) if options.slo.request_limits else None
    totals = run_totals(df, meets)
    ok_rows = df["ok"].to_numpy(dtype=bool) & judged
    ok_df = df[ok_rows]

    latency: dict[str, dict[str, float]] = {}
    for name in ("ttft_ms", "ttfo_ms", "tpot_ms", "e2e_ms", "schedule_lag_ms", "ttft_from_intended_ms", "max_itl_ms"):
        latency[name] = percentiles(ok_df[name].to_numpy(dtype=float), ps)
    # the exact distributions' values are consumed here (held once, percentiles in place)
    latency["itl_ms"], latency["chunk_gap_ms"] = final_summaries([pooled.itl, pooled.chunk_gap], ps)
    slo = None
    if options.slo.request_limits:  # (job bounds are judged per job: analysis/jobs.py)
        slo = SloAttainment(
            objectives=dict(options.slo.request_limits),
            met=int(totals.met or 0),  # an SLO was given: counted
            judged=totals.judged,
            attainment=totals.attainment if totals.judged else 0.0,
            attainment_interval=totals.attainment_interval(),
            goodput_rps=totals.goodput_rps,
        )
    return RunSummary(
        requests=_request_counts(df, judged, totals, pooled.rows, table.num_rows, pooled.cooldown),
        window_s=totals.window_s,
        throughput=Throughput(totals.requests_per_s, totals.output_tokens_per_s, totals.total_tokens_per_s),
        latency=latency,
        timing=_timing_measurable(ok_df, one_read[ok_rows]),
        token_distributions=_distribution_method(pooled.itl, pooled.chunk_gap),
        tokens=_token_accounting(ok_df),
        percentiles=tuple(ps),
        slo=slo,
        # structured output, embeddings, a model mix: only where a request was of that kind
        kinds=kinds_summary(_counted(df, judged), totals.window_s) or None,
        client=client_health(df[judged], monitor),
        smoothness=Smoothness(
            deadlines_ms={"ttft": deadlines.ttft_ms, "token_interval": deadlines.token_interval_ms},
            fluidity=percentiles(row_arrays[1][ok_rows], (1, 5, 10, 50)),
            longest_gap_ms=percentiles(row_arrays[3][ok_rows], (50, 90, 95, 99)),
        ),
    )


def _counted(df: pd.DataFrame, judged: np.ndarray) -> pd.DataFrame:
    """The judged rows the counts are over: a request cancelled at the end is not one of them."""
    return df[judged & ~df["error_type"].eq("cancelled").to_numpy()]


def _request_counts(
    df: pd.DataFrame, judged: np.ndarray, totals: RunTotals, all_rows: int, measured_rows: int, cooldown_rows: int
) -> RequestCounts:
    counted = _counted(df, judged)
    ok_mask = counted["ok"].to_numpy(dtype=bool)
    errors = counted.loc[~ok_mask, "error_type"].value_counts().to_dict()
    failed_df = counted[~ok_mask]
    messages = failed_df["error_message"] if "error_message" in failed_df else [None] * len(failed_df)
    return RequestCounts(
        rows=all_rows,
        warmup_excluded=all_rows - measured_rows - cooldown_rows,
        cooldown_excluded=cooldown_rows,
        measured=len(counted),
        ok=totals.ok,
        failed=totals.failed,
        cancelled_at_end=totals.cancelled,
        anomalies=totals.anomalies,
        anomaly_kinds=anomaly_counts(df["anomaly"].to_numpy()),
        error_rate=totals.error_rate,
        errors={str(k): int(v) for k, v in errors.items()},
        top_errors=top_errors(failed_df["error_type"], messages),
        non_streaming=int(counted["token_source"].eq(SOURCE_NON_STREAMING).sum()),
    )


def _timing_measurable(ok_df: pd.DataFrame, one_read: np.ndarray) -> TimingCheck:
    """Whether the per-token timings (ITL, TPOT, chunk gap) stand for the engine's: not when
    most multi-token responses arrived in one read (the gaps are then the client's)."""
    multi = int((ok_df["output_tokens"].to_numpy() >= 2).sum())
    k = int(one_read.sum())
    several = int((sequences(ok_df) > 1).sum())
    return TimingCheck(one_read_responses=k, multi_token_responses=multi, itl_measurable=timing_measurable(k, multi),
                       several_sequences=several or None)


def _distribution_method(*dists: PooledDistribution) -> DistributionMethod:
    """How the pooled token-level percentiles (ITL, chunk gap) were computed."""
    exact = all(d.method == "exact" for d in dists)
    return DistributionMethod(
        method="exact" if exact else "histogram",
        values=max(d.n for d in dists),
        exact_limit=dists[0].exact_limit,
        max_relative_error=0.0 if exact else HISTOGRAM_RELATIVE_ERROR,
    )


def _token_accounting(ok_df: pd.DataFrame) -> TokenAccounting:
    sources = ok_df["token_source"].value_counts().to_dict()
    comp = ok_df["completion_tokens"].astype("float64")
    has = ~comp.isna()
    mismatch = int((comp[has] != ok_df.loc[has, "output_tokens"].astype("float64")).sum())
    asked = ok_df["max_output_tokens"].to_numpy(dtype="float64") * sequences(ok_df)  # n > 1: every sequence's
    got = ok_df["output_tokens"].to_numpy(dtype="float64")
    short = int((got < asked).sum())
    # TGI 3.x generates in 1024-token segments and can end past max_new_tokens (docs/engines.md)
    long = int((got > asked).sum())
    finish = ok_df["finish_reason"] if "finish_reason" in ok_df else pd.Series([None] * len(ok_df), dtype=object)
    reasons = finish.fillna("none").value_counts().to_dict()
    return TokenAccounting(
        sources={str(k): int(v) for k, v in sources.items()},
        chunk_vs_server_mismatches=mismatch,
        shorter_than_requested=short,
        longer_than_requested=long,
        prompt=prompt_length_accounting(ok_df),
        finish_reasons={str(k): int(v) for k, v in sorted(reasons.items())},
        natural_stops=int(finish.isin(NATURAL_STOPS).sum()),
        reasoning=_reasoning(ok_df),
    )


def _reasoning(ok_df: pd.DataFrame) -> Reasoning | None:
    """Reasoning vs answer tokens, where some request reasoned (docs/metrics.md); None: none did."""
    if "reasoning_tokens" not in ok_df:
        return None
    reasoning = ok_df["reasoning_tokens"].astype("float64")
    known = ~reasoning.isna()
    if not (reasoning[known] > 0).any():
        return None
    out = ok_df.loc[known, "output_tokens"].astype("float64")
    return Reasoning(
        requests=int((reasoning[known] > 0).sum()),
        reasoning_tokens=int(reasoning[known].sum()),
        answer_tokens=int((out - reasoning[known]).sum()),
        reasoning_tokens_mean=float(reasoning[known].mean()),
        answer_tokens_mean=float((out - reasoning[known]).mean()),
    )


#: A run warns when more than this share of its prompts are off their requested length by more
#: than this fraction (docs/metrics.md, Prompt length).
PROMPT_LENGTH_TOLERANCE = 0.05


def prompt_length_accounting(ok_df: pd.DataFrame) -> PromptLengths:
    """Requested (``input_tokens_target``) against server-reported (``prompt_tokens``) prompt
    lengths, over the successful requests that carry no conversation history (later turns of
    a session also hold the earlier turns, so their length is not the requested one; images and
    embeddings batches add tokens the requested length does not count)."""
    turn = ok_df["turn"].astype("float64") if "turn" in ok_df else pd.Series(np.nan, index=ok_df.index)
    own = turn.isna() | turn.eq(0)
    for extra in ("images", "inputs"):
        if extra in ok_df:
            own &= ok_df[extra].isna()
    got = ok_df.loc[own, "prompt_tokens"].astype("float64")
    want = ok_df.loc[own, "input_tokens_target"].astype("float64")
    keep = got.notna().to_numpy() & (want > 0).to_numpy()
    got_a, want_a = got.to_numpy()[keep], want.to_numpy()[keep]
    if not len(got_a):
        return PromptLengths(compared=int(keep.sum()))
    ratio = got_a / want_a
    off_share = float(np.mean(np.abs(ratio - 1) > PROMPT_LENGTH_TOLERANCE))
    ratio_p50 = float(np.median(ratio))
    warning = None
    source = ok_df.loc[own, "input_tokens_source"] if "input_tokens_source" in ok_df else pd.Series(dtype=object)
    counted = bool(len(source)) and bool(source[keep].isin(EXACT_PROMPT_SOURCES).all())
    added = engine_added_tokens(got_a - want_a) if counted else 0
    if off_share > PROMPT_LENGTH_TOLERANCE:
        why = ("the text was counted exactly, so the rest is what the engine adds (a chat template, BOS)" if counted
               else "exact lengths need --tokenizer DIR or --tokenize-url auto")  # fmt: skip
        warning = (
            f"prompts are not the length asked for: {100 * off_share:.0f}% of {len(got_a)} are off by more "
            f"than {100 * PROMPT_LENGTH_TOLERANCE:g}% (server/requested p50 {ratio_p50:.2f}); {why}"
        )
    return PromptLengths(int(keep.sum()), float(np.mean(got_a == want_a + added)), ratio_p50, off_share, warning, added)


def approximate_prompts(p: PromptLengths, words: bool = False) -> str | None:
    """How far the prompts were from the lengths asked for, in one phrase; None when they were
    (nearly) as asked: the SLO is judged on the prompts sent. ``words``: the prompts were word
    approximations, said even when the server reported no lengths to compare."""
    if not p.compared:
        return ("word approximations: the engine reported no prompt lengths, so how far off they were "
                "is unknown") if words else None  # fmt: skip
    if not p.off_share > PROMPT_LENGTH_TOLERANCE:
        return None
    return (f"the engine counted {p.ratio_p50:.2f}x the requested prompt length (p50), "
            f"{100 * p.off_share:.0f}% of prompts off by more than {100 * PROMPT_LENGTH_TOLERANCE:g}%")  # fmt: skip


#: At most this many tokens count as what an engine adds to every prompt (BOS and the like).
ENGINE_ADDED_MAX = 4


def engine_added_tokens(diff: np.ndarray) -> int:
    """Tokens the engine adds to every counted prompt (its start token): the most common
    server-minus-requested difference, when at least half of the prompts share it and it is
    at most ``ENGINE_ADDED_MAX``; 0 otherwise. A prompt counted exactly by the engine's own
    /tokenize (or tokenizer) without its start token is then exact at requested + that many."""
    if not len(diff):
        return 0
    values, counts = np.unique(diff.astype(np.int64), return_counts=True)
    top = int(np.argmax(counts))
    mode = int(values[top])
    return mode if 0 < mode <= ENGINE_ADDED_MAX and counts[top] * 2 >= len(diff) else 0


#: ``input_tokens_source`` values whose prompt text was counted with the model's tokenizer.
EXACT_PROMPT_SOURCES = ("tokenizer", "server_tokenize")
