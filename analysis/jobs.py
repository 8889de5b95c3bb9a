"""Job-level metrics: a job is the requests of one session (a session graph's job, or a
multi-turn session, the chain case), judged as one (docs/metrics.md, Jobs).

``job_table`` computes every per-job figure, once, from the run's Parquet files alone (the
requests' stamps and ``schedule.parquet``'s session ids and predecessors); ``job_summary``
aggregates it; summary, report and compare take them from here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench_llm.analysis.bootstrap import Change
from bench_llm.analysis.confidence import wilson_interval
from bench_llm.analysis.distributions import percentiles
from bench_llm.analysis.slo import JOB_SLO_METRICS, SLO
from bench_llm.results.reader import read_parquet_file, read_requests
from bench_llm.results.schema import SCHEDULE_FILE

#: the requests' columns job metrics read
REQUEST_COLUMNS = ["request_id", "phase", "session_id", "ok", "error_type", "intended_send_ns", "send_ns",
                   "first_token_ns", "end_ns", "prompt_tokens", "input_tokens_target", "output_tokens",
                   "cached_tokens"]


def predecessors(schedule: pd.DataFrame) -> dict[str, tuple[str, ...]]:
    """Per request id, the requests that must finish before it: a graph node's ``after``; a
    session turn's previous turn (the chain case)."""
    out: dict[str, tuple[str, ...]] = {}
    has_after = "after" in schedule
    chains: dict[str, list[tuple[int, str]]] = {}
    for row in schedule.itertuples(index=False):
        after = tuple(row.after) if has_after and row.after is not None else ()
        if after:
            out[row.request_id] = after
        elif row.session_id is not None and row.phase == "measure":
            chains.setdefault(row.session_id, []).append((int(row.turn or 0), row.request_id))
    graphs = {sid for sid in chains if any(rid in out for _, rid in chains[sid])}
    for sid, turns in chains.items():
        if sid in graphs or any(out.get(r) for _, r in turns):
            continue
        turns.sort()
        for (_, a), (_, b) in zip(turns, turns[1:]):
            if b not in out:
                out[b] = (a,)
    return out


def read_schedule(run_dir: Path) -> pd.DataFrame | None:
    path = Path(run_dir) / SCHEDULE_FILE
    if not path.is_file():
        return None
    cols = ["request_id", "phase", "session_id", "turn"]
    table = read_parquet_file(path)
    cols += [c for c in ("after",) if c in table.column_names]
    return table.select(cols).to_pandas()


def job_table(requests: pd.DataFrame, schedule: pd.DataFrame) -> pd.DataFrame:
    """One row per job of the measured schedule (sessions with any measured request).

    Columns: ``job``, ``requests`` (scheduled), ``ok`` (every scheduled request recorded and
    successful), ``start_ns`` (the root's intended send), ``job_ms`` (completion: last end −
    start), ``job_ttft_ms`` (the root's first token − start), ``request_time_ms`` (Σ end −
    send), ``critical_path_ms`` (the longest chain of predecessors by request time, end − send),
    ``prompt_tokens``, ``output_tokens``, ``cached_tokens`` (NaN where the server reported
    none) and ``hit_rate`` (cached / prompt tokens). Times of a job that is not ok are NaN.
    One pass over the requests in job and node order (every predecessor first).
    """
    sched = schedule[(schedule["phase"] == "measure") & schedule["session_id"].notna()]
    if sched.empty:
        return pd.DataFrame(columns=["job", "requests", "ok"])
    preds = predecessors(schedule)
    req = requests[requests["phase"] == "measure"]
    row_of = {rid: i for i, rid in enumerate(req["request_id"].tolist())}
    f64 = lambda c: req[c].to_numpy(dtype="float64", na_value=np.nan)  # noqa: E731
    ok_a = req["ok"].to_numpy(dtype=bool)
    intended, send, first, end = f64("intended_send_ns"), f64("send_ns"), f64("first_token_ns"), f64("end_ns")
    prompt = np.where(np.isnan(f64("prompt_tokens")), f64("input_tokens_target"), f64("prompt_tokens"))
    output, cached = f64("output_tokens"), f64("cached_tokens")
    order = sched.assign(_t=sched["turn"].fillna(0)).sort_values(["session_id", "_t"], kind="stable")
    rows: list[dict[str, Any]] = []
    job: Any = None
    acc: dict[str, Any] = {}

    def close() -> None:
        if job is None:
            return
        ok = acc["ok"]
        has_cache = acc["cache_n"] > 0
        rows.append({
            "job": job, "requests": acc["n"], "ok": ok, "start_ns": acc["start"],
            "job_ms": (acc["end"] - acc["start"]) / 1e6 if ok else math.nan,
            "job_ttft_ms": (acc["first"] - acc["start"]) / 1e6 if ok else math.nan,
            "request_time_ms": acc["work"] if ok else math.nan,
            "critical_path_ms": max(acc["longest"].values()) if ok and acc["longest"] else math.nan,
            "end_ns": acc["end"], "prompt_tokens": acc["prompt"], "output_tokens": acc["output"],
            "cached_tokens": acc["cached"] if has_cache else math.nan,
            "hit_rate": acc["cached"] / acc["prompt"] if has_cache and acc["prompt"] > 0 else math.nan,
        })

    for rid, sid in zip(order["request_id"].tolist(), order["session_id"].tolist()):
        if sid != job:
            close()
            job = sid
            i = row_of.get(rid)  # the job's root: its first node
            acc = {"n": 0, "ok": True, "start": intended[i] if i is not None else math.nan,
                   "first": first[i] if i is not None else math.nan, "end": math.nan, "work": 0.0,
                   "longest": {}, "prompt": 0.0, "output": 0.0, "cached": 0.0, "cache_n": 0}
        acc["n"] += 1
        i = row_of.get(rid)
        if i is None:  # scheduled, never recorded
            acc["ok"] = False
            continue
        acc["ok"] = acc["ok"] and bool(ok_a[i])
        dur = (end[i] - send[i]) / 1e6
        before = [acc["longest"][p] for p in preds.get(rid, ()) if p in acc["longest"]]
        acc["longest"][rid] = dur + (max(before) if before else 0.0)
        acc["work"] += dur
        acc["end"] = end[i] if math.isnan(acc["end"]) else max(acc["end"], end[i])
        acc["prompt"] += prompt[i]
        acc["output"] += output[i]
        if not math.isnan(cached[i]):
            acc["cached"] += cached[i]
            acc["cache_n"] += 1
    close()
    return pd.DataFrame(rows)


def job_met(jobs: pd.DataFrame, slo: SLO) -> np.ndarray:
    """Per job: ok and met every job bound (the one attainment rule, docs/metrics.md)."""
    met = jobs["ok"].to_numpy(dtype=bool).copy()
    for key, limit in slo.job_limits:
        met &= np.nan_to_num(jobs[JOB_SLO_METRICS[key]].to_numpy(dtype=float), nan=math.inf) <= limit
    return met


@dataclass(frozen=True)
class JobSummary:
    jobs: int
    ok: int
    window_s: float
    #: per metric: n, mean and the percentiles asked for
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    requests_per_job: float = math.nan
    prompt_tokens_per_job: float = math.nan
    output_tokens_per_job: float = math.nan
    #: Σ cached / Σ prompt tokens over the jobs (NaN: the server reported no cached tokens)
    hit_rate: float = math.nan
    #: the per-job hit rates' mean and percentiles
    hit_rate_per_job: dict[str, float] = field(default_factory=dict)
    met: int | None = None

    @property
    def jobs_per_s(self) -> float:
        return self.ok / self.window_s if self.window_s > 0 else math.nan

    @property
    def attainment(self) -> float:
        return self.met / self.jobs if self.met is not None and self.jobs else math.nan

    def attainment_interval(self) -> tuple[float, float]:
        return wilson_interval(self.met, self.jobs) if self.met is not None else (math.nan, math.nan)

    @property
    def goodput_jobs_per_s(self) -> float:
        return self.met / self.window_s if self.met is not None and self.window_s > 0 else math.nan

    def to_json(self) -> dict[str, Any]:
        lo, hi = self.attainment_interval()
        return {"jobs": self.jobs, "ok": self.ok, "window_s": self.window_s, "jobs_per_s": self.jobs_per_s,
                "metrics": self.metrics, "requests_per_job": self.requests_per_job,
                "prompt_tokens_per_job": self.prompt_tokens_per_job,
                "output_tokens_per_job": self.output_tokens_per_job, "hit_rate": self.hit_rate,
                "hit_rate_per_job": self.hit_rate_per_job, "met": self.met, "attainment": self.attainment,
                "attainment_interval": [lo, hi], "goodput_jobs_per_s": self.goodput_jobs_per_s}


#: the per-job times summarised, in the order printed
TIME_METRICS = ("job_ms", "job_ttft_ms", "critical_path_ms", "request_time_ms")


def summarize_jobs(jobs: pd.DataFrame, slo: SLO = SLO(), ps: tuple[float, ...] = (50, 90, 95, 99)) -> JobSummary:
    if jobs.empty:
        return JobSummary(0, 0, 0.0)
    okj = jobs[jobs["ok"]]
    window = (float(np.nanmax(jobs["end_ns"])) - float(np.nanmin(jobs["start_ns"]))) / 1e9
    metrics = {m: percentiles(okj[m].to_numpy(dtype=float), ps) for m in TIME_METRICS}
    par = (okj["request_time_ms"] / okj["critical_path_ms"]).to_numpy(dtype=float)
    metrics["parallelism"] = percentiles(par, ps)
    hit = jobs["cached_tokens"].to_numpy(dtype=float)
    pooled = float(np.nansum(hit) / jobs["prompt_tokens"][~np.isnan(hit)].sum()) if (~np.isnan(hit)).any() else math.nan
    return JobSummary(
        jobs=len(jobs),
        ok=int(jobs["ok"].sum()),
        window_s=max(window, 0.0) if math.isfinite(window) else 0.0,
        metrics=metrics,
        requests_per_job=float(jobs["requests"].mean()),
        prompt_tokens_per_job=float(jobs["prompt_tokens"].mean()),
        output_tokens_per_job=float(jobs["output_tokens"].mean()),
        hit_rate=pooled,
        hit_rate_per_job=percentiles(jobs["hit_rate"].to_numpy(dtype=float), ps) if (~np.isnan(hit)).any() else {},
        met=int(job_met(jobs, slo).sum()) if slo.job_limits else None,
    )


def run_jobs(run_dir: Path, requests: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """The job table of a run folder (None: no schedule, or no sessions in it)."""
    schedule = read_schedule(run_dir)
    if schedule is None or not schedule["session_id"].notna().any():
        return None
    if requests is None:
        requests = read_requests(run_dir, REQUEST_COLUMNS).to_pandas()
    return job_table(requests, schedule)


def job_summary(run_dir: Path, slo: SLO = SLO(), ps: tuple[float, ...] = (50, 90, 95, 99)) -> JobSummary | None:
    """The job summary of a run folder; None when its schedule has no sessions."""
    jobs = run_jobs(run_dir)
    return None if jobs is None else summarize_jobs(jobs, slo, ps)


_LABELS = {"job_ms": "Job completion (ms)", "job_ttft_ms": "Job TTFT (ms)",
           "critical_path_ms": "Critical path, requests (ms)", "request_time_ms": "Request time, total (ms)",
           "parallelism": "Parallelism (total/critical)"}


def format_jobs(s: JobSummary) -> list[str]:
    """The job section of ``bench summary``."""
    lines = [f"jobs: {s.jobs} ({s.ok} ok), {s.requests_per_job:.1f} requests, {s.prompt_tokens_per_job:,.0f} prompt "
             f"and {s.output_tokens_per_job:,.0f} output tokens per job; {s.jobs_per_s:.3f} jobs/s"]
    keys = [k for k in s.metrics if k != "n"]
    pcols = [c for c in next(iter(s.metrics.values())) if c.startswith("p")] if s.metrics else []
    head = f"{'job metric':<32}{'n':>6}{'mean':>11}" + "".join(f"{c:>11}" for c in pcols)
    lines += [head, "-" * len(head)]
    for k in keys:
        m = s.metrics[k]
        fmt = (lambda v: f"{v:>11.2f}") if k == "parallelism" else (lambda v: f"{v:>11,.0f}")
        lines.append(f"{_LABELS.get(k, k):<32}{m['n']:>6}{fmt(m['mean'])}" + "".join(fmt(m[c]) for c in pcols))
    if not math.isnan(s.hit_rate):
        per = s.hit_rate_per_job
        lines.append(f"prefix-cache hit rate per job (server's cached tokens): pooled {100 * s.hit_rate:.1f}%, "
                     f"per-job mean {100 * per.get('mean', math.nan):.1f}%, p50 {100 * per.get('p50', math.nan):.1f}%")
    if s.met is not None:
        lo, hi = s.attainment_interval()
        lines.append(f"job SLO attainment {100 * s.attainment:.1f}% ({s.met}/{s.jobs} jobs; 95% CI "
                     f"{100 * lo:.1f}-{100 * hi:.1f}%), goodput {s.goodput_jobs_per_s:.3f} jobs/s")
    return lines


def judged_by_jobs(point: Any, run_dir: Path, slo: SLO) -> Any:
    """A sweep point (``analysis.capacity_points.PointMetrics``) judged per job: with a job bound in
    the SLO, the unit a load is judged on is the job (``jobs`` judged, ``met`` counts jobs;
    attainment and goodput are the jobs'), so capacity is searched in jobs per second."""
    import dataclasses

    s = job_summary(run_dir, slo)
    if s is None or not s.jobs:
        return point
    lo, hi = s.attainment_interval()
    return dataclasses.replace(point, jobs=float(s.jobs), met=float(s.met or 0), attainment=s.attainment,
                               attainment_low=lo, attainment_high=hi, goodput_rps=s.goodput_jobs_per_s)


#: job metrics ``bench compare`` shows and ``bench gate`` can gate: name -> (job column, percentile)
JOB_COMPARE_METRICS: dict[str, tuple[str, float]] = {
    "job_p50_ms": ("job_ms", 50.0),
    "job_p90_ms": ("job_ms", 90.0),
    "job_ttft_p90_ms": ("job_ttft_ms", 90.0),
    "critical_path_p90_ms": ("critical_path_ms", 90.0),
}


def _one_run_jobs(path: Path) -> pd.DataFrame | None:
    from bench_llm.results.reader import find_runs

    runs = find_runs(Path(path))
    jobs = run_jobs(runs[0]) if len(runs) == 1 else None
    if jobs is None or jobs.empty or not jobs["ok"].any():
        return None
    return jobs[jobs["ok"]]


def job_changes(baseline: Path, current: Path, names: Sequence[str] = tuple(JOB_COMPARE_METRICS),
                level: float = 0.95, resamples: int = 1000, seed: int = 0) -> list[Change]:
    """Job percentiles of two single runs, each change with a percentile-bootstrap interval
    (ok jobs resampled: in pairs when both sides ran the same jobs, else each side on its own).
    Empty unless each side is one run with jobs."""
    sa, sb = _one_run_jobs(baseline), _one_run_jobs(current)
    if sa is None or sb is None:
        return []
    # the same jobs on both sides (the same workload and seed): resampled in pairs, so the
    # interval is the change's, not the spread between different jobs
    paired = set(sa["job"]) == set(sb["job"])
    if paired:
        sa, sb = sa.sort_values("job"), sb.sort_values("job")
    rng = np.random.default_rng(seed)
    tail = [50 * (1 - level), 100 - 50 * (1 - level)]
    out = []
    for name in names:
        col, q = JOB_COMPARE_METRICS[name]
        a, b = sa[col].to_numpy(dtype=float), sb[col].to_numpy(dtype=float)
        base, cur = float(np.percentile(a, q)), float(np.percentile(b, q))
        ia = [rng.integers(0, len(a), len(a)) for _ in range(resamples)]
        ib = ia if paired else [rng.integers(0, len(b), len(b)) for _ in range(resamples)]
        ra = np.array([np.percentile(a[i], q) for i in ia])
        rb = np.array([np.percentile(b[i], q) for i in ib])
        d_lo, d_hi = np.percentile(rb - ra, tail)
        c_lo, c_hi = np.percentile(rb, tail)
        rel = cur / base - 1 if base else math.nan
        r_lo, r_hi = (np.percentile(rb / ra - 1, tail) if base and (ra > 0).all() else (math.nan, math.nan))
        out.append(Change(name, "ms", "lower", base, cur, float(c_lo), float(c_hi), cur - base, float(d_lo),
                          float(d_hi), rel, float(r_lo), float(r_hi), level, bool(d_lo > 0 or d_hi < 0)))
    return out


def format_job_changes(changes: Sequence[Change], jobs: tuple[int, int] | None = None) -> list[str]:
    if not changes:
        return []
    lines = [f"jobs ({100 * changes[0].level:g}% bootstrap, ok jobs resampled):"]
    for c in changes:
        mark = "  significant" if c.significant else ""
        lines.append(f"  {c.metric:<22}{c.baseline:>12,.0f} -> {c.current:>10,.0f} ms  change "
                     f"{c.diff:+,.0f} ms [{c.diff_low:+,.0f}, {c.diff_high:+,.0f}]{mark}")
    return lines
