"""How true are bench's client timestamps under load? (issue 8: the precision instrument)

Runs ``bench run`` (the real CLI path: runner, transport, recorder, Parquet writers)
closed loop at rising concurrency against a fixed-timing engine whose streams all step
together like a real batch, pins client and engine to different cores, and compares
every client timestamp with the engine's own emission log (same CLOCK_MONOTONIC).

Printed per concurrency (after ``c=``, the clock the run's timestamps came from: kernel or
user; ``--clock`` picks it, by default bench run's own default, auto):
  tok/s        achieved output tokens/s (whole run)
  TTFT err     client TTFT minus true TTFT = client first-token stamp minus the engine's
               first-token emission (the send is stamped when the bytes reach the socket,
               so the send side adds no error; what the engine does between the socket
               and its read of the request is engine time, printed as "send->read")
  ITL          the client's ITL p50/p99 (nominal: --itl-ms between steps); in brackets the
               engine's own gaps between the same two tokens (its emission log), i.e. what
               a perfect client would have measured
  ITL err      client gap minus the engine's gap between the same two tokens
  stamp        client chunk stamp minus the engine's emission time (p50/p99)
  re-send      closed loop: previous response end -> next request at the socket (p50)
  CPU/tok      client CPU microseconds per received token (all client processes)
  Python-parsed  % of the stream payloads the adapter's Python parser read (the rest: the
               compiled scan; the run's notes.read_path_payloads)
  RSS          peak RSS of the largest client process
  open         % of the requested streams open at the engine (steady part)
  late         engine lateness: actual minus intended emission (p50/p99)
  flags        the summary's "client saturated" warnings, if any

Engines:
  lean (default): a minimal batch-stepping emitter in this file (one write per stream
      per step, emission log in memory), cheap enough that it is not the bottleneck. It
      renders a step's frames before writing them back to back (a loopback write costs
      ~10 us here, so 256 streams take ~2.6 ms), keeps reading requests until 0.3 ms
      before a step and then spins, and runs without cyclic GC.
      benchmarks/host_noise.py measures what no engine can avoid: the host taking a core.
  sim: ``bench sim serve --timing fixed --fixed-grid --spin-us 1500 --emission-log``
      (options used when the sim offers them; without an emission log, truth is the
      nominal TTFT/ITL and lateness is unknown).

Example:
  python benchmarks/instrument.py --concurrency 64,256,1024 --clock user
  python benchmarks/instrument.py --concurrency 1024 --workers 2
  python benchmarks/instrument.py --concurrency 256,1024 --shape end   # usage only at the end
"""

from __future__ import annotations

import argparse
import array
import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

_now = time.perf_counter_ns

# ------------------------------------------------------------------------------------------
# The lean batch-stepping engine
# ------------------------------------------------------------------------------------------

_HEAD_OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
_HEALTH = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
_CHUNK = (
    b'data: {"id":"cmpl-%d","object":"text_completion","created":0,"model":"%s","choices":[{"index":0,'
    b'"text":" t%d","logprobs":null,"finish_reason":%s,"stop_reason":null}],'
    b'"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}\n\n'
)
#: A token event without usage (``--shape end`` and ``none``: stock OpenAI servers, llama.cpp).
_CHUNK_PLAIN = (
    b'data: {"id":"cmpl-%d","object":"text_completion","created":0,"model":"%s","choices":[{"index":0,'
    b'"text":" t%d","logprobs":null,"finish_reason":%s,"stop_reason":null}]}\n\n'
)
_DONE = b"data: [DONE]\n\n"
#: Where the engine puts usage: on every token event (vLLM's continuous usage), only in a
#: final usage event (``include_usage``), or nowhere.
SHAPES = ("every", "end", "none")
_USAGE = (
    b'data: {"id":"cmpl-%d","object":"text_completion","created":0,"model":"%s","choices":[],'
    b'"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}\n\ndata: [DONE]\n\n'
)


def _frame(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(body), body)


class _Stream:
    __slots__ = ("tr", "rid", "max_tokens", "done", "first_step_ns", "prompt_tokens")

    def __init__(self, tr: asyncio.Transport, rid: int, max_tokens: int, first_step_ns: int, prompt_tokens: int) -> None:
        self.tr = tr
        self.rid = rid
        self.max_tokens = max_tokens
        self.done = 0
        self.first_step_ns = first_step_ns
        self.prompt_tokens = prompt_tokens


class LeanEngine:
    """Every ``itl`` one step writes the next token of every running stream.

    A request arriving at ``a`` gets its first token at the first step at or after
    ``a + ttft`` (so TTFT is ttft..ttft+itl, and the log says exactly when).
    """

    def __init__(self, ttft_ns: int, itl_ns: int, model: bytes, log: bool = True, shape: str = "every") -> None:
        self.shape = shape
        self.log = log  # False: no per-token emission log (a long recording would fill memory)
        self.ttft_ns = ttft_ns
        self.itl_ns = itl_ns
        self.model = model
        self.streams: list[_Stream] = []
        self.next_rid = 0
        self.t_start = _now()
        # emission log
        self.e_rid = array.array("q")
        self.e_tok = array.array("q")
        self.e_int = array.array("q")
        self.e_act = array.array("q")
        self.arrivals = array.array("q")
        # step log
        self.s_int = array.array("q")
        self.s_start = array.array("q")
        self.s_active = array.array("q")

    def step_at_or_after(self, t: int) -> int:
        k = -(-(t - self.t_start) // self.itl_ns)
        return self.t_start + k * self.itl_ns

    def start(self, tr: asyncio.Transport, max_tokens: int, prompt_tokens: int, arrival: int) -> None:
        rid = self.next_rid
        self.next_rid += 1
        self.arrivals.append(arrival)
        tr.write(_HEAD_OK)
        self.streams.append(_Stream(tr, rid, max_tokens, self.step_at_or_after(arrival + self.ttft_ns), prompt_tokens))

    #: Before a step the loop sleeps until this long before it, then keeps reading requests
    #: in zero-timeout loop iterations until ``SPIN_NS`` before it, then spins: a timer
    #: wakes up to ~1 ms late (libuv timers are ms-grained), a read of requests costs µs.
    POLL_NS = 3_000_000
    SPIN_NS = 300_000

    async def run(self) -> None:
        k = 1
        itl = self.itl_ns
        while True:
            intended = self.t_start + k * itl
            delay = intended - _now() - self.POLL_NS
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            while _now() < intended - self.SPIN_NS:
                await asyncio.sleep(0)
            while _now() < intended:
                pass
            self._step(intended)
            k += 1
            now = _now()
            if now > self.t_start + k * itl:  # fell behind: skip missed steps, never burst
                k = -(-(now - self.t_start) // itl)
            await asyncio.sleep(0)

    def _step(self, intended: int) -> None:
        self.s_int.append(intended)
        self.s_start.append(_now())
        self.s_active.append(len(self.streams))
        keep: list[_Stream] = []
        model = self.model
        # Render every frame first, then write them back to back: the step's writes then
        # take only the syscalls, so a stream's place in the step moves its emission little.
        out: list[tuple[_Stream, bytes]] = []
        for st in self.streams:
            if st.first_step_ns > intended:
                keep.append(st)
                continue
            if st.tr.is_closing():
                continue
            i = st.done
            st.done = n = i + 1
            last = n >= st.max_tokens
            finish = b'"length"' if last else b"null"
            if self.shape == "every":
                body = _CHUNK % (st.rid, model, i, finish, st.prompt_tokens, st.prompt_tokens + n, n)
            else:
                body = _CHUNK_PLAIN % (st.rid, model, i, finish)
            if last:
                end = _DONE if self.shape == "none" else _USAGE % (st.rid, model, st.prompt_tokens, st.prompt_tokens + n, n)
                out.append((st, _frame(body) + _frame(end) + b"0\r\n\r\n"))
            else:
                out.append((st, _frame(body)))
                keep.append(st)
        if not self.log:
            for st, data in out:
                st.tr.write(data)
            self.streams = keep
            return
        e_act = self.e_act
        for st, data in out:
            st.tr.write(data)
            e_act.append(_now())
        e_rid, e_tok, e_int = self.e_rid, self.e_tok, self.e_int
        for st, _ in out:
            e_rid.append(st.rid)
            e_tok.append(st.done - 1)
            e_int.append(intended)
        self.streams = keep

    def write_log(self, path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rid = np.frombuffer(self.e_rid, dtype=np.int64) if len(self.e_rid) else np.empty(0, np.int64)
        arrivals = np.frombuffer(self.arrivals, dtype=np.int64) if len(self.arrivals) else np.empty(0, np.int64)
        table = pa.table(
            {
                "server_request_id": pa.array([f"cmpl-{r}" for r in rid.tolist()], pa.string()),
                "token_index": pa.array(np.frombuffer(self.e_tok, dtype=np.int64)),
                "intended_ns": pa.array(np.frombuffer(self.e_int, dtype=np.int64)),
                "actual_ns": pa.array(np.frombuffer(self.e_act, dtype=np.int64)),
                "arrival_ns": pa.array(arrivals[rid] if len(rid) else np.empty(0, np.int64)),
            }
        )
        pq.write_table(table, path)
        steps = pa.table(
            {
                "intended_ns": pa.array(np.frombuffer(self.s_int, dtype=np.int64)),
                "start_ns": pa.array(np.frombuffer(self.s_start, dtype=np.int64)),
                "active": pa.array(np.frombuffer(self.s_active, dtype=np.int64)),
            }
        )
        pq.write_table(steps, path.with_name(path.stem + "-steps.parquet"))


class _EngineProtocol(asyncio.Protocol):
    def __init__(self, engine: LeanEngine) -> None:
        self.engine = engine
        self.buf = b""
        self.tr: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        import socket

        self.tr = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        import orjson

        arrival = _now()
        buf = self.buf + data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end].lower()
            cl = 0
            i = head.find(b"content-length:")
            if i >= 0:
                cl = int(head[i + 15 : head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0 else len(head)].strip())
            if len(buf) < end + 4 + cl:
                break
            body = buf[end + 4 : end + 4 + cl]
            buf = buf[end + 4 + cl :]
            if head.startswith(b"get"):
                self.tr.write(_HEALTH)  # type: ignore[union-attr]
                continue
            obj = orjson.loads(body)
            prompt = obj.get("prompt") or ""
            self.engine.start(self.tr, int(obj.get("max_tokens", 16)), max(1, len(prompt) // 4), arrival)  # type: ignore[arg-type]
        self.buf = buf


def serve_main(args: argparse.Namespace) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    async def main() -> None:
        engine = LeanEngine(int(args.ttft_ms * 1e6), int(args.itl_ms * 1e6), args.model.encode(), log=not args.no_log,
                            shape=args.shape)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _EngineProtocol(engine), "127.0.0.1", args.port, backlog=4096)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        # No cyclic GC while serving: a full collection pauses the loop for a step's worth of
        # time, and what this engine allocates per step is freed by reference counting.
        gc.collect()
        gc.freeze()
        gc.disable()
        stepper = asyncio.ensure_future(engine.run())
        await stop.wait()
        stepper.cancel()
        server.close()
        if engine.log:
            engine.write_log(Path(args.log))

    asyncio.run(main())


# ------------------------------------------------------------------------------------------
# The measurement
# ------------------------------------------------------------------------------------------


def _pin(cpus: set[int] | None) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def _cpuset(text: str | None) -> set[int] | None:
    if not text:
        return None
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    cpus = {int(c) for c in text.split(",")} & allowed if allowed else {int(c) for c in text.split(",")}
    return cpus or None


def _start_engine(args: argparse.Namespace, port: int, log: Path, engine_log: Path) -> tuple[subprocess.Popen[bytes], bool]:
    """Start the engine pinned to its cores; returns (process, has_emission_log)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cpus = _cpuset(args.server_cpus)
    if args.server == "lean":
        argv = [sys.executable, __file__, "serve", "--port", str(port), "--ttft-ms", str(args.ttft_ms),
                "--itl-ms", str(args.itl_ms), "--model", args.model, "--log", str(log), "--shape", args.shape]
        has_log = not getattr(args, "no_log", False)
        if not has_log:
            argv.append("--no-log")
    else:
        help_text = subprocess.run([sys.executable, "-m", "bench_llm.bench", "sim", "serve", "--help"], capture_output=True,
                                   text=True, env=env, cwd=REPO).stdout
        argv = [sys.executable, "-m", "bench_llm.bench", "sim", "serve", "--port", str(port), "--ttft-ms", str(args.ttft_ms),
                "--itl-ms", str(args.itl_ms), "--model", args.model]
        has_log = "--emission-log" in help_text
        if has_log:
            argv += ["--emission-log", str(log)]
        if "--timing" in help_text:
            argv += ["--timing", "fixed"]
        if "--fixed-grid" in help_text:  # every stream steps on one grid, like a batch
            argv += ["--fixed-grid"]
        if "--spin-us" in help_text:
            argv += ["--spin-us", "1500"]
    with open(engine_log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                preexec_fn=(lambda: _pin(cpus)) if cpus else None)
    from bench_llm.core.control import EngineClient

    engine = EngineClient(f"http://127.0.0.1:{port}", timeout_s=1)
    deadline = time.monotonic() + 30
    while not engine.health().ok:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"engine did not start; see {engine_log}")
        time.sleep(0.1)
    return proc, has_log


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _bench_argv(args: argparse.Namespace, url: str, concurrency: int, out: Path) -> list[str]:
    """The ``bench run`` command line of one measurement."""
    argv = [sys.executable, "-m", "bench_llm.bench", "run", "--url", url, "--model", args.model, "--concurrency", str(concurrency),
            "--requests", str(concurrency * args.rounds), "--input-tokens", "32", "--output-tokens", str(args.tokens),
            "--out", str(out), "--no-progress", "--json", "--stall-timeout", "60"]
    if args.workers > 1:
        argv += ["--workers", str(args.workers)]
    if args.transport:
        argv += ["--transport", args.transport]
    if args.clock:
        argv += ["--clock", args.clock]
    return argv


def _client(args: argparse.Namespace, url: str, concurrency: int, out: Path) -> tuple[int, str]:
    """Run ``bench run``; returns (peak RSS in KiB of its largest process, stderr tail)."""
    argv = _bench_argv(args, url, concurrency, out)
    cpus = _cpuset(args.client_cpus)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO,
                            preexec_fn=(lambda: _pin(cpus)) if cpus else None)
    stdout, stderr = proc.communicate()
    # wait4 already reaped it inside communicate(); RUSAGE_CHILDREN holds the largest child
    import resource

    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode not in (0,):
        raise SystemExit(f"bench run failed ({proc.returncode}): {stderr.decode()[-2000:]}")
    return rss, stdout.decode()


def _pct(v: np.ndarray, p: float) -> float:
    return float(np.percentile(v, p)) if len(v) else float("nan")


def analyse(run_dir: Path, log: Path | None, args: argparse.Namespace, concurrency: int) -> dict[str, float | str]:
    import pyarrow.compute as pc

    from bench_llm.analysis.summary import summarize
    from bench_llm.results.reader import read_monitor, read_requests, read_run_meta

    req = read_requests(run_dir)
    req = req.filter(pc.equal(req["phase"], "measure"))
    ok = req.filter(req["ok"])
    n_failed = req.num_rows - ok.num_rows
    mon = read_monitor(run_dir)
    summary = summarize(req, monitor=mon)
    send = ok["send_ns"].to_numpy().astype(np.int64)
    intended = ok["intended_send_ns"].to_numpy().astype(np.int64)
    ends = ok["end_ns"].to_numpy().astype(np.int64)
    lists = ok["chunk_ns"].to_pylist()
    toks = ok["chunk_tokens"].to_pylist()
    rids = ok["server_request_id"].to_pylist()
    total_tokens = int(sum(sum(t) for t in toks))
    window = (ends.max() - send.min()) / 1e9 if len(send) else float("nan")
    res: dict[str, float | str] = {"c": concurrency, "failed": n_failed, "tok_s": total_tokens / window}
    meta = read_run_meta(run_dir)
    res["clock"] = str(meta.get("clock") or "?").split(":")[0]  # the clock actually used
    paths = (meta.get("notes") or {}).get("read_path_payloads") or {}
    parsed = int(paths.get("compiled") or 0) + int(paths.get("python") or 0)
    res["python_pct"] = 100 * int(paths.get("python") or 0) / parsed if parsed else float("nan")

    client_itl: list[np.ndarray] = []
    for ts, tk in zip(lists, toks):
        a = np.asarray(ts, np.int64)[np.asarray(tk) > 0]
        client_itl.append(np.diff(a))
    citl = np.concatenate(client_itl) / 1e6 if client_itl else np.empty(0)
    res["itl_p50"], res["itl_p99"] = _pct(citl, 50), _pct(citl, 99)

    # closed-loop re-send: requests whose intended time is a previous response's end
    lag = (send - intended) / 1e6
    later = intended > send.min() + 1_000_000
    res["resend_p50"] = _pct(lag[later], 50)
    res["resend_p99"] = _pct(lag[later], 99)

    if log is not None and log.exists():
        import pyarrow.parquet as pq

        em = pq.read_table(log).sort_by([("server_request_id", "ascending"), ("token_index", "ascending")])
        e_rid = em["server_request_id"].to_pylist()
        e_act = em["actual_ns"].to_numpy()
        e_int = em["intended_ns"].to_numpy()
        arrival = em["arrival_ns"].to_numpy() if "arrival_ns" in em.column_names else None
        starts: dict[str, int] = {}
        for i, r in enumerate(e_rid):
            if r not in starts:
                starts[r] = i
        ttft_err, itl_err, stamp_err, to_read, gaps = [], [], [], [], []
        for r, ts, tk, s in zip(rids, lists, toks, send):
            if r not in starts:
                continue
            a = np.asarray(ts, np.int64)[np.asarray(tk) > 0]
            i0 = starts[r]
            truth = e_act[i0 : i0 + len(a)]
            if len(truth) != len(a):
                continue
            stamp_err.append(a - truth)
            gaps.append(np.diff(truth))
            itl_err.append(np.diff(a) - gaps[-1])
            # client TTFT (a0 - s) minus true TTFT (truth0 - s)
            ttft_err.append(a[0] - truth[0])
            if arrival is not None:
                to_read.append(arrival[i0] - s)
        te = np.asarray(ttft_err) / 1e6
        ie = np.concatenate(itl_err) / 1e6 if itl_err else np.empty(0)
        se = np.concatenate(stamp_err) / 1e6 if stamp_err else np.empty(0)
        late = (e_act - e_int) / 1e6
        eg = np.concatenate(gaps) / 1e6 if gaps else np.empty(0)
        res.update(engine_itl_p50=_pct(eg, 50), engine_itl_p99=_pct(eg, 99))
        tr = np.asarray(to_read) / 1e6
        res.update(read_p50=_pct(tr, 50), read_p99=_pct(tr, 99))
        res.update(ttft_err_p50=_pct(te, 50), ttft_err_p99=_pct(te, 99), itl_err_p50=_pct(ie, 50), itl_err_p99=_pct(ie, 99),
                   stamp_p50=_pct(se, 50), stamp_p99=_pct(se, 99), late_p50=_pct(late, 50), late_p99=_pct(late, 99))
        steps_path = log.with_name(log.stem + "-steps.parquet")
        if steps_path.exists():
            st = pq.read_table(steps_path)
            s_int = st["intended_ns"].to_numpy()
            active = st["active"].to_numpy()
            lo, hi = send.min() + int(args.ttft_ms * 1e6) + 500_000_000, send.max()
            sel = (s_int >= lo) & (s_int <= hi)
            res["open_pct"] = float(100 * active[sel].mean() / concurrency) if sel.any() else float("nan")
    else:
        ttft = (ok["first_token_ns"].to_numpy().astype(np.int64) - send) / 1e6
        res.update(ttft_err_p50=_pct(ttft, 50) - args.ttft_ms, ttft_err_p99=_pct(ttft, 99) - args.ttft_ms)

    # client CPU per token, from each process's monitor samples over the same interval
    cpu_us = 0.0
    tokens_in = 0
    if mon is not None and mon.num_rows:
        w_col = mon["worker_id"].to_numpy()
        worker_of_row = ok["worker_id"].to_numpy()
        for w in np.unique(w_col):
            m = mon.filter(pc.equal(mon["worker_id"], int(w)))
            ts = m["ts_ns"].to_numpy()
            cpu = m["cpu_s"].to_numpy()
            lo, hi = ts[0], ts[-1]
            cpu_us += (cpu[-1] - cpu[0]) * 1e6
            for row in np.nonzero(worker_of_row == w)[0]:
                a = np.asarray(lists[row], np.int64)[np.asarray(toks[row]) > 0]
                tokens_in += int(((a >= lo) & (a <= hi)).sum())
    res["cpu_us_tok"] = cpu_us / tokens_in if tokens_in else float("nan")
    res["flags"] = "; ".join(summary.client.warnings) or "-"
    return res


def synthesize_run(out: Path, requests: int, tokens: int, rows_per_part: int | None = None, seed: int = 0) -> None:
    """A results folder as ``bench run`` writes it: ``requests`` rows of ``tokens`` tokens.

    Closed loop at 1024 in flight, TTFT ~50 ms, ITL ~10 ms with jitter, a final usage
    frame of 0 tokens per request (257 chunks), written in part files with the
    writer's atomic part writing (its encodings), ``rows_per_part`` rows each (default:
    the writer's flush size, as a recorded run has them; fewer rows only when the 1 s flush
    interval passes first).
    """
    import uuid

    import pyarrow as pa

    from bench_llm.results.schema import REQUESTS_SCHEMA, SCHEMA_VERSION
    from bench_llm.results.writer import FLUSH_ROWS, write_run_meta, write_table_atomic

    rows_per_part = rows_per_part or FLUSH_ROWS
    rng = np.random.default_rng(seed)
    run_id = uuid.uuid4().hex[:16]
    out.mkdir(parents=True, exist_ok=True)
    write_run_meta(out, {"run_id": run_id, "schema_version": SCHEMA_VERSION, "bench_version": "synthetic",
                         "status": "complete", "engine": "synthetic", "model": "m", "clock": "user: perf_counter_ns at read"})
    chunks = tokens + 1
    slot_period = int((0.05 + tokens * 0.01) * 1e9)
    for part, first in enumerate(range(0, requests, rows_per_part)):
        n = min(rows_per_part, requests - first)
        idx = np.arange(first, first + n)
        send = (idx // 1024) * slot_period + (idx % 1024) * 1000 + 10**12
        ttft = 50_000_000 + rng.integers(0, 2_000_000, n)
        steps = np.cumsum(10_000_000 + rng.integers(-300_000, 300_000, (n, chunks)), axis=1) - 10_000_000
        ts = (send + ttft)[:, None] + steps
        ts[:, -1] = ts[:, -2] + 20_000
        tk = np.ones((n, chunks), np.int32)
        tk[:, -1] = 0
        offsets = pa.array(np.arange(0, (n + 1) * chunks, chunks, dtype=np.int32))
        chunk_ns = pa.ListArray.from_arrays(offsets, pa.array(ts.ravel()))
        chunk_tokens = pa.ListArray.from_arrays(offsets, pa.array(tk.ravel()))
        cols = {
            "run_id": pa.array([run_id] * n),
            "request_id": pa.array([f"r{i:07d}" for i in idx]),
            "phase": pa.array(["measure"] * n),
            "worker_id": pa.array(np.zeros(n, np.int32)),
            "intended_send_ns": pa.array(send - 50_000),
            "send_ns": pa.array(send),
            "first_byte_ns": pa.array(send + 1_000_000),
            "first_token_ns": pa.array(ts[:, 0]),
            "first_content_ns": pa.array(ts[:, 0]),
            "end_ns": pa.array(ts[:, -1]),
            "chunk_ns": chunk_ns,
            "chunk_tokens": chunk_tokens,
            "output_tokens": pa.array(np.full(n, tokens, np.int32)),
            "token_source": pa.array(["server_cumulative"] * n),
            "input_tokens_target": pa.array(np.full(n, 32, np.int32)),
            "input_tokens_source": pa.array(["approx"] * n),
            "max_output_tokens": pa.array(np.full(n, tokens, np.int32)),
            "prompt_tokens": pa.array(np.full(n, 32, np.int32)),
            "completion_tokens": pa.array(np.full(n, tokens, np.int32)),
            "http_status": pa.array(np.full(n, 200, np.int32)),
            "finish_reason": pa.array(["length"] * n),
            "ok": pa.array(np.ones(n, bool)),
            "server_request_id": pa.array([f"cmpl-{i}" for i in idx]),
        }
        table = pa.table({f.name: cols.get(f.name, pa.nulls(n, f.type)) for f in REQUESTS_SCHEMA}, schema=REQUESTS_SCHEMA)
        write_table_atomic(table, out / "requests" / f"part-000-{part:06d}.parquet")


def scale_main(args: argparse.Namespace) -> None:
    out = Path(args.out)
    if not (out / "run.parquet").exists():
        t = time.perf_counter()
        synthesize_run(out, args.requests, args.tokens, args.rows_per_part)
        print(f"synthesised {args.requests} requests x {args.tokens} tokens in {time.perf_counter() - t:.1f} s "
              f"({sum(p.stat().st_size for p in (out / 'requests').glob('*.parquet')) / 1e9:.2f} GB)")
    if args.compact:
        from bench_llm.results.writer import compact_requests

        t = time.perf_counter()
        done = compact_requests(out)
        print(f"compact_requests: {'done' if done else 'nothing to do / unsupported'} in {time.perf_counter() - t:.1f} s, "
              f"{len(list((out / 'requests').glob('*.parquet')))} part files")
    argv = [sys.executable, "-m", "bench_llm.bench", "summary", str(out)]
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t
    import resource

    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(proc.stdout[-3000:] if proc.returncode == 0 else proc.stderr[-3000:])
    print(f"bench summary: {wall:.2f} s wall, peak RSS {rss:.0f} MB, loadavg {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    sv = sub.add_parser("serve", help="(internal) the lean batch-stepping engine")
    sv.add_argument("--port", type=int, required=True)
    sv.add_argument("--ttft-ms", type=float, default=50.0)
    sv.add_argument("--itl-ms", type=float, default=10.0)
    sv.add_argument("--model", default="sim-model")
    sv.add_argument("--log", required=True)
    sv.add_argument("--no-log", action="store_true", help="keep no per-token emission log (long recordings)")
    sv.add_argument("--shape", choices=SHAPES, default="every")
    sc = sub.add_parser("scale", help="time `bench summary` on a synthesised run of many requests")
    sc.add_argument("--out", required=True, help="results folder (synthesised when absent)")
    sc.add_argument("--requests", type=int, default=1_000_000)
    sc.add_argument("--tokens", type=int, default=256)
    sc.add_argument("--rows-per-part", type=int, default=None, help="rows per part file (default: the writer's flush size)")
    sc.add_argument("--compact", action="store_true", help="results.writer.compact_requests before timing the summary")
    ap.add_argument("--concurrency", default="64,256,1024", help="comma-separated in-flight levels")
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    ap.add_argument("--rounds", type=int, default=3, help="requests per closed-loop slot")
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--model", default="sim-model")
    ap.add_argument("--server", choices=["lean", "sim"], default="lean")
    ap.add_argument("--shape", choices=SHAPES, default="every",
                    help="lean engine: usage on every token event, only in a final usage event, or none")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--transport", choices=["raw", "aiohttp"], default=None)
    from bench_llm.loadgen.transport import CLOCKS

    ap.add_argument("--clock", choices=CLOCKS, default=None)
    ap.add_argument("--client-cpus", default="0", help="cores for the client (comma-separated; '' = no pinning)")
    ap.add_argument("--server-cpus", default="1", help="cores for the engine")
    ap.add_argument("--keep", type=Path, help="keep the run folders here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.cmd == "serve":
        serve_main(args)
        return
    if args.cmd == "scale":
        scale_main(args)
        return
    from bench_llm.launch.process import free_port

    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="bench-instrument-")) if args.keep is None else args.keep
    tmp.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(f"# engine={args.server} transport={args.transport or 'default'} clock={args.clock or 'auto (bench run default)'} "
          f"workers={args.workers} client cpus={args.client_cpus or 'any'} engine cpus={args.server_cpus or 'any'} "
          f"shape={args.shape} tokens={args.tokens} truth TTFT {args.ttft_ms:g} ms ITL {args.itl_ms:g} ms; loadavg before {load[0]:.2f}")
    rows = []
    for c in levels:
        port = free_port()
        log = tmp / f"emission-c{c}.parquet"
        proc, has_log = _start_engine(args, port, log, tmp / f"engine-c{c}.log")
        try:
            rss, _ = _client(args, f"http://127.0.0.1:{port}", c, tmp / f"run-c{c}")
        finally:
            _stop(proc)
        res = analyse(tmp / f"run-c{c}", log if has_log else None, args, c)
        res["rss_mb"] = rss / 1024
        rows.append(res)
        if args.json:
            print(json.dumps(res))
        else:
            _print_row(res)
    if args.keep is None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# loadavg after {os.getloadavg()[0]:.2f}")


def _print_row(r: dict[str, float | str]) -> None:
    f = lambda k, fmt="{:.2f}": fmt.format(r[k]) if k in r and r[k] == r[k] else "n/a"  # noqa: E731
    print(
        f"c={r['c']:<5} {r.get('clock', '?'):<6} tok/s {float(r['tok_s']):>8.0f} | TTFT err p50/p99 {f('ttft_err_p50')}/{f('ttft_err_p99')} ms"
        f" | ITL p50/p99 {f('itl_p50')}/{f('itl_p99')} ms (engine's {f('engine_itl_p50')}/{f('engine_itl_p99')})"
        f" | ITL err p50/p99 {f('itl_err_p50')}/{f('itl_err_p99')} ms"
        f" | stamp p50/p99 {f('stamp_p50', '{:.3f}')}/{f('stamp_p99', '{:.3f}')} ms"
        f" | re-send p50/p99 {f('resend_p50', '{:.3f}')}/{f('resend_p99', '{:.3f}')} ms"
        f" | CPU/tok {f('cpu_us_tok', '{:.1f}')} us | Python-parsed {f('python_pct', '{:.1f}')} % | RSS {f('rss_mb', '{:.0f}')} MB | open {f('open_pct', '{:.1f}')} %"
        f" | engine late p50/p99 {f('late_p50', '{:.3f}')}/{f('late_p99', '{:.3f}')} ms"
        f" | send->read p50/p99 {f('read_p50', '{:.3f}')}/{f('read_p99', '{:.3f}')} ms | failed {r['failed']}"
        f" | flags: {r['flags']}"
    )


if __name__ == "__main__":
    main()
