"""The embedded engine's HTTP server: vLLM, SGLang or TGI on the wire, paced in real time.

One engine loop (``sim.loop``) drives a backend (fixed timing or the performance model);
at each step boundary it hands every due token to its request's ``HttpStream``, which
formats the flavour's payload and writes it to the socket synchronously, in the same
pass, then records the token in the emission log. Request handlers only parse, submit
and wait for the end of their stream.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import random
import struct
import sys
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from bench_llm.core import __version__
from bench_llm.core.tokenizer import count_tokens, output_token, tokenize
from bench_llm.sim.backend import FixedBackend, ModelBackend
from bench_llm.sim.config import SGLANG_SCHEMA_CHECK_SINCE, SGLANG_VERSION, ServerConfig
from bench_llm.sim.emission import EmissionLog
from bench_llm.sim.faults import FaultPlanner, RequestFaults
from bench_llm.sim.loop import EngineLoop
from bench_llm.sim.options import describe
from bench_llm.sim.otlp import SimSpan, SpanExporter, request_span, sglang_root_span
from bench_llm.sim.prom import FlavorMetrics
from bench_llm.sim.request import SimRequest
from bench_llm.sim.sampling import SGLANG_SAMPLING_FIELDS, openai_problem, sglang_problem, tgi_problem
from bench_llm.sim.structured import Unsupported, answer, openai_constraint, pieces, sglang_constraint, tgi_constraint
from bench_llm.sim.wire import EmbeddingWire, OpenAIWire, SGLangWire, TGIWire

_now = time.perf_counter_ns
VERSION = f"{__version__}-bench-sim"
ENGINE_KEY: web.AppKey["SimServer"] = web.AppKey("sim_engine")
SPLIT_TOKEN = " caf\u00e9"  # one token whose UTF-8 bytes the split_utf8 fault cuts in half
#: TGI 3.x generates in segments of min(max_new_tokens, 1024) tokens and re-queues the request,
#: prompt plus text so far, after each (router/src/validation.rs DEFAULT_GENERATION_LENGTH,
#: router/src/infer/mod.rs); a request may end past its max_new_tokens.
TGI_SEGMENT_TOKENS = 1024


class HttpStream:
    """A request's token sink: formats and writes its stream in the engine loop's pass."""

    __slots__ = ("srv", "req", "rid", "wire", "kind", "seed", "faults", "pw", "transport", "done", "sent",
                 "held", "hold_until", "buf_text", "buf_pieces", "buf_intended", "buf_first", "first_ns", "last_ns",
                 "arrival_ns", "unary_text", "closed", "fast", "finish_reason", "ended", "planned", "segment", "first_req",
                 "script")

    def __init__(self, srv: "SimServer", rid: str, wire: Any, kind: str, seed: int, faults: RequestFaults,
                 arrival_ns: int) -> None:
        self.srv = srv
        self.req: SimRequest | None = None
        self.rid = rid
        self.wire = wire
        self.kind = kind  # "openai" | "sglang" | "tgi"
        self.seed = seed
        self.faults = faults
        self.pw: Any = None
        self.transport: Any = None
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.sent = 0
        self.held: list[tuple[bytes, int, tuple[int, ...]]] | None = None
        self.hold_until = 0
        self.buf_text = ""
        self.buf_pieces: list[str] = []
        self.buf_intended: list[int] = []
        self.buf_first = 0
        self.first_ns: int | None = None
        self.last_ns: int | None = None
        self.arrival_ns = arrival_ns
        self.unary_text: list[str] | None = None
        self.closed = False
        self.fast = False  # set once streaming starts with no faults planned
        self.finish_reason = "length"
        self.ended = False  # the engine ended the stream with its own in-stream error or abort
        #: TGI: tokens the whole request generates, and per segment (0: one segment, no re-queue)
        self.planned = 0
        self.segment = 0
        #: TGI: the first segment, whose queue and start TGI's timings are taken from
        self.first_req: SimRequest | None = None
        #: a structured answer's pieces, one per output token (sim/structured.py); None: free text
        self.script: list[str] | None = None

    # -- engine-loop side --------------------------------------------------------------------
    def emit(self, req: SimRequest, n: int, intended: tuple[int, ...], finished: bool) -> None:
        """Called by the engine loop; a failure here fails this request only, never the loop."""
        try:
            self._emit(req, n, intended, finished)
        except Exception as exc:  # noqa: BLE001 - one broken stream must not stop the engine
            sys.stderr.write(f"bench sim: stream {self.rid} failed: {type(exc).__name__}: {exc}\n")
            self._fail("internal")

    def _emit(self, req: SimRequest, n: int, intended: tuple[int, ...], finished: bool) -> None:
        if self.closed or self.ended:
            return
        tr = self.transport
        if tr is not None and tr.is_closing():
            self._fail("client_disconnected")
            return
        first = self.sent
        if first == 0 and self.kind == "sglang":  # the first token: the request's timings are known
            self.wire.timing = self.srv.request_timing(req, intended[0] if intended else _now())
        f = self.faults
        if self.fast and n == 1 and not finished:
            # hot path: one token, no faults, streaming, OpenAI/SGLang framing
            self.sent = first + 1
            wire = self.wire
            wire.cached = req.cached_tokens
            data = wire.tokens(output_token(self.seed, first), first + 1, None)
            tr.write(b"%x\r\n%b\r\n" % (len(data), data))
            actual = _now()
            self._timing(1, actual)
            log = self.srv.emission_log
            if log is not None:
                log.add1(self.rid, first, intended[0], actual)
            return
        script = self.script
        pieces = script[first : first + n] if script is not None else [output_token(self.seed, first + j) for j in range(n)]
        if f.split_at >= 0 and first <= f.split_at < first + n:
            pieces[f.split_at - first] = SPLIT_TOKEN
        self.sent += n
        if finished and self.sent < self.planned:
            finished = False  # a TGI segment ended: the request is re-queued, the stream goes on
            self._next_segment(req)
        if self.kind != "tgi":
            self.wire.cached = req.cached_tokens
        if self.unary_text is not None:
            self.unary_text.extend(pieces)
            self._timing(n, _now())
            if finished:
                self._finish(req)
            return
        # several tokens per event (multi_token fault) are gathered before writing
        tpe = f.tokens_per_event
        if tpe > 1 or self.buf_pieces:
            if not self.buf_pieces:
                self.buf_first = first
            self.buf_pieces.extend(pieces)
            self.buf_intended.extend(intended)
            if len(self.buf_pieces) < tpe and not finished:
                return
            pieces, intended, first = self.buf_pieces, tuple(self.buf_intended), self.buf_first
            self.buf_pieces, self.buf_intended = [], []
            n = len(pieces)
        self._write_event(req, pieces, first, n, intended, finished)

    def _write_event(
        self, req: SimRequest, pieces: list[str], first: int, n: int, intended: tuple[int, ...], finished: bool,
    ) -> None:
        """Frame ``pieces`` (the ``n`` tokens from ``first`` on) as one event, send it, and apply the
        faults planned inside it (malformed, split, in-stream error, abort, reset, stall).

        The slow path of ``_emit``: the one-token hot path never comes here.
        """
        f = self.faults
        done = first + n
        finish = self.finish_reason if finished else None
        if f.malformed_at >= 0 and first <= f.malformed_at < done:
            data = self.wire.malformed("".join(pieces))
        elif self.kind == "tgi":
            data = self.wire.token_list(pieces, done, finish, suppress_final=finished and f.no_done)
        elif req.seqs > 1:  # n sequences: this step's token of each, one chunk per choice
            data = self.wire.choices_tokens(["".join(pieces), *self.other_choices(first, n, req.seqs)], done, finish)
        else:
            data = self.wire.tokens("".join(pieces), done, finish)
        if f.split_at >= 0 and first <= f.split_at < done and self.held is None:
            cut = data.find("\u00e9".encode()) + 1
            self._send(data[:cut], first, intended)
            self._hold(0.005)
            self._send(data[cut:], -1, ())
        else:
            self._send(data, first, intended)
        if f.error_at >= 0 and first <= f.error_at < done:
            self._end_in_stream(self.wire.error("Request failed during generation: injected fault", *_GEN_ERROR[self.kind]),
                                "stream_error")
            return
        if f.abort_at >= 0 and first <= f.abort_at < done:
            self._end_in_stream(self.wire.aborted(done), "abort")
            return
        if f.reset_at >= 0 and first <= f.reset_at < done:
            self._reset()
            return
        if f.stall_at >= 0 and first <= f.stall_at < done:
            self._hold(f.stall_s)
        if finished:
            self._send(self.wire.closing(done, f.no_done), -1, ())
            self._finish(req)

    def other_choices(self, first: int, n: int, seqs: int) -> list[str]:
        """The text of tokens ``first`` .. ``first + n`` of sequences 1 .. ``seqs`` − 1 (sequence 0's
        are the request's own tokens; each other sequence is seeded apart)."""
        return ["".join(output_token(self.seed + c, first + j) for j in range(n)) for c in range(1, seqs)]

    def _next_segment(self, done: SimRequest) -> None:
        """Re-queue a TGI request for its next segment: prompt plus output so far, prefilled again."""
        req = SimRequest(self.rid, _now(), done.prompt_len + done.generated,
                         min(self.segment, self.planned - self.sent), self, done.block_hashes)
        req.tag = self
        self.first_req = self.first_req or done
        self.req = req
        asyncio.get_running_loop().call_soon(self.srv.engine.submit, req)

    def _end_in_stream(self, data: bytes, why: str) -> None:
        """The engine's own failure inside a stream already answered HTTP 200: its event(s), then the end."""
        self._send(data, -1, ())
        if self.req is not None and not self.req.finished:
            self.srv.engine.abort(self.req)
        self.srv.metrics.failed(why)
        self.ended = True
        if self.held is None:
            self._resolve("ended")

    def _timing(self, n: int, actual: int) -> None:
        m = self.srv.metrics
        if self.first_ns is None:
            self.first_ns = actual
            m.first_token((actual - self.arrival_ns) / 1e9)
        elif self.last_ns is not None:
            gap = (actual - self.last_ns) / 1e9 / n
            for _ in range(n):
                m.inter_token(gap)
        self.last_ns = actual

    def _send(self, data: bytes, first_index: int, intended: tuple[int, ...]) -> None:
        if self.held is not None:
            self.held.append((data, first_index, intended))
            return
        self._write(data, first_index, intended)

    def _write(self, data: bytes, first_index: int, intended: tuple[int, ...]) -> None:
        if self.closed:
            return
        if data:
            try:
                self.pw._write_chunked_payload(data)
            except (ConnectionError, RuntimeError, AttributeError):
                self._fail("client_disconnected")
                return
        if first_index >= 0:
            actual = _now()
            self._timing(len(intended), actual)
            log = self.srv.emission_log
            if log is not None:
                log.add(self.rid, first_index, intended, actual)

    def _hold(self, seconds: float) -> None:
        self.held = []
        asyncio.get_running_loop().call_later(seconds, self._release)

    def _release(self) -> None:
        held, self.held = self.held or [], None
        for data, idx, intended in held:
            self._write(data, idx, intended)
        if self.ended:
            self._resolve("ended")
        elif self.req is not None and self.req.finished and not self.done.done():
            self._resolve("ok")

    def _finish(self, req: SimRequest) -> None:
        if self.held is not None:
            return  # resolved when the hold ends
        self._resolve("ok")

    def _resolve(self, how: str) -> None:
        if not self.done.done():
            self.done.set_result(how)

    def _reset(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        if self.req is not None:
            self.srv.engine.abort(self.req)
        self.srv.metrics.failed("reset")
        self._resolve("reset")

    def _fail(self, why: str) -> None:
        self.closed = True
        if self.req is not None and not self.req.finished:
            self.srv.engine.abort(self.req)
        self.srv.metrics.failed(why)
        self._resolve(why)


class SimServer:
    """State shared by the routes."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.flavor = config.flavor
        #: Streams being answered; a graceful shutdown ends them first (``on_shutdown``).
        self._streaming: set[HttpStream] = set()
        mt = config.model_timing
        self.backend: FixedBackend | ModelBackend
        if mt is not None:
            self.backend = ModelBackend(mt)  # raises OutOfMemory
            self.max_model_len = min(config.max_model_len, self.backend.max_model_len)
            self.kv_tokens = self.backend.cost.kv_tokens()
        else:
            self.backend = FixedBackend(config.timing, _now(), grid=config.fixed_grid)
            self.max_model_len = config.max_model_len
            self.kv_tokens = 0
        self.engine = EngineLoop(self.backend, spin_ns=config.spin_us * 1000)
        self.metrics = FlavorMetrics(self.flavor, config.model)
        self.emission_log = EmissionLog(config.emission_log) if config.emission_log else None
        self.faults = FaultPlanner(config.faults, config.seed)
        self.started_ns = _now()
        self._ids = itertools.count()
        self._flush_task: asyncio.Task[None] | None = None
        self._gen_mark = (0, _now())
        self.gen_throughput = 0.0
        #: TGI flavour: requests holding one of its --max-concurrent-requests permits
        self.tgi_admitted = 0
        #: resident LoRA adapters, least recently used first, and the loads so far
        self.loras: list[str] = []
        self.lora_swaps = 0
        self.otlp = SpanExporter(config.otlp_traces_endpoint, f"bench-sim-{self.flavor}") if config.otlp_traces_endpoint else None
        #: perf_counter_ns -> Unix ns: SGLang's wall-clock timing stamps (0.5.10 on)
        self.wall_offset_ns = time.time_ns() - _now()
        #: SGLang flavour: the generation imitated (ServerConfig.sglang_generation)
        self.sglang_generation = config.sglang_generation

    # -- lifecycle ---------------------------------------------------------------------
    async def on_startup(self, app: web.Application) -> None:
        self.started_ns = _now()
        if isinstance(self.backend, FixedBackend):
            self.backend.origin = self.started_ns
        self.engine.start()
        if self.otlp is not None:
            self.otlp.start()
        if self.emission_log is not None:
            self._flush_task = asyncio.get_running_loop().create_task(self._flush_loop())

    async def on_shutdown(self, app: web.Application) -> None:
        """Ends the streams still being answered before aiohttp closes their connections:
        cancelled mid-stream by the shutdown instead, aiohttp 3.x can trip over its own
        handler state ("invalid state") and print a traceback at every SIGTERM."""
        for sink in list(self._streaming):
            if not sink.done.done():
                sink.done.set_result("shutdown")

    async def on_cleanup(self, app: web.Application) -> None:
        await self.engine.stop()
        if self.otlp is not None:  # the spans still pending are posted before the engine goes
            await asyncio.get_running_loop().run_in_executor(None, self.otlp.stop)
        if self._flush_task is not None:
            self._flush_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flush_task
        if self.emission_log is not None:
            self.emission_log.close()

    async def _flush_loop(self) -> None:
        log = self.emission_log
        assert log is not None
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(2.0)
            table = log.take()
            if table is not None:
                await loop.run_in_executor(None, log.write, table)

    # -- helpers -----------------------------------------------------------------------
    def next_id(self) -> str:
        return f"{next(self._ids):08x}{zlib.crc32(str(self.started_ns).encode()):08x}"

    @property
    def starting(self) -> bool:
        s = self.config.faults.slow_start_s
        return s > 0 and (_now() - self.started_ns) < s * 1e9

    def _make_request(self, rid: str, prompt_ids: list[int], max_tokens: int, arrival: int,
                      sink: HttpStream) -> SimRequest:
        hashes = self.backend.hashes_for(prompt_ids) if isinstance(self.backend, ModelBackend) else ()
        req = SimRequest(rid, arrival, len(prompt_ids), max_tokens, sink, hashes)
        req.tag = sink
        sink.req = req
        return req

    def _load_adapter(self, req: SimRequest, adapter: str) -> None:
        """The adapter-swap cost: a request whose LoRA adapter is not among the ``max_loras``
        resident ones waits ``lora_swap_ms`` (the load) before it can be scheduled; the adapter
        then evicts the least recently used one. A resident adapter costs nothing."""
        resident = self.loras
        if adapter in resident:
            resident.remove(adapter)
        else:
            self.lora_swaps += 1
            delay = int(self.config.lora_swap_ms * 1e6)
            if isinstance(self.backend, FixedBackend):
                req.arrival_ns += delay  # fixed timing counts from arrival
            else:
                overhead = int(getattr(self.backend, "request_overhead_ns", 0))
                req.ready_ns = max(req.ready_ns, req.arrival_ns + overhead + delay)
            if len(resident) >= max(1, self.config.max_loras):
                resident.pop(0)
        resident.append(adapter)

    @property
    def reported_version(self) -> str:
        """The version the engine reports: the SGLang flavour the release it imitates (so that
        bench picks its rules as for the real one), marked as the simulated engine's."""
        if self.flavor == "sglang":
            return f"{self.config.engine_version or SGLANG_VERSION}-bench-sim"
        return VERSION

    def sglang_schema_error(self, sp: Any) -> str | None:
        """SGLang 0.5.22 on refuses unknown ``sampling_params`` keys with the schema's text
        (sglang/api/v1/api_types.py ``_unknown_field``); older releases ignore them."""
        if self.config.sglang_release < SGLANG_SCHEMA_CHECK_SINCE or not isinstance(sp, dict):
            return None
        for key in sp:
            if key not in SGLANG_SAMPLING_FIELDS:
                listed = ", ".join(f"`{f}`" for f in SGLANG_SAMPLING_FIELDS)
                return f"unknown field `{key}`, expected one of {listed}"
        return None

    def queue_full(self, kind: str) -> bool:
        """Whether the admission limit of the imitated engine turns the next request away:
        vLLM's --max-num-queued-reqs counts the requests in the engine, waiting and running
        (v1/engine/async_llm.py); SGLang's --max-queued-requests its waiting queue only
        (scheduler.py ``_abort_on_queued_limit``)."""
        b = self.backend
        if self.flavor == "vllm" and self.config.max_num_queued_reqs:
            return b.waiting + b.running >= self.config.max_num_queued_reqs
        if self.flavor == "sglang" and self.config.max_queued_requests:
            return kind != "tgi" and b.waiting >= self.config.max_queued_requests
        return False

    def _phases(self, req: SimRequest, first_token_ns: int) -> tuple[int, int, int, int]:
        """(queue entry: the end of the HTTP/tokenizer overhead, admission, prefill done, first
        token) of ``req`` on the model's clock, perf_counter ns."""
        entry = req.arrival_ns + int(getattr(self.backend, "request_overhead_ns", 0))
        first = req.first_token_ns if req.first_token_ns is not None else first_token_ns
        admitted = req.admitted_ns if req.admitted_ns is not None else entry
        done = req.prefill_done_ns if req.prefill_done_ns is not None else first
        return entry, admitted, done, first

    def request_timing(self, req: SimRequest, first_token_ns: int) -> dict[str, float]:
        """SGLang's per-request timings (``meta_info`` with ``--enable-metrics``, seconds) as the
        imitated generation names them, from the model's own clock: the queue from the end of
        the HTTP/tokenizer overhead to admission, prefill from admission to the step that
        completes it. 0.5.8: ``queue_time``, ``prefill_launch_delay`` (0: the sim launches a
        batch as it is formed), ``prefill_launch_latency``; 0.5.10: the delay renamed
        ``prefill_waiting_latency``, plus the wall-clock stamps ``forward_entry_time`` and
        ``prefill_finished_time`` (Unix seconds); 0.5.23: ``queue_time`` and the stamps only.
        With P/D, ``kv_transfer_time`` (a bench sim field, no SGLang one) is the rest up to the
        first token: KV transfer, decode admission and step."""
        entry, admitted, done, first = self._phases(req, first_token_ns)
        queue, prefill = max(0, admitted - entry) / 1e9, max(0, done - admitted) / 1e9
        gen = self.sglang_generation
        if gen == "0.5.8":
            timing = {"queue_time": queue, "prefill_launch_delay": 0.0, "prefill_launch_latency": prefill}
        else:
            wall = self.wall_offset_ns
            timing = {"forward_entry_time": (admitted + wall) / 1e9, "prefill_finished_time": (max(done, admitted) + wall) / 1e9,
                      "queue_time": queue}  # fmt: skip
            if gen == "0.5.10":
                timing.update(prefill_waiting_latency=0.0, prefill_launch_latency=prefill)
        if first > done:
            timing["kv_transfer_time"] = (first - done) / 1e9
        return timing

    def _record_finish(self, sink: HttpStream, prompt_tokens: int) -> None:
        # TGI times a segmented request from its first segment (server.rs first_queued/first_start)
        req = sink.first_req or sink.req
        if req is None:
            return
        now = _now()
        e2e = (now - sink.arrival_ns) / 1e9
        queue = prefill = decode = None
        if req.admitted_ns is not None:
            queue = max(0, req.admitted_ns - req.arrival_ns) / 1e9
            if req.prefill_done_ns is not None:
                prefill = max(0, req.prefill_done_ns - req.admitted_ns) / 1e9
        if sink.first_ns is not None and sink.last_ns is not None:
            decode = (sink.last_ns - sink.first_ns) / 1e9
        self.metrics.finished(e2e, sink.sent * req.seqs, req.cached_tokens, queue, prefill, decode, sink.finish_reason)
        if self.otlp is not None:
            self._export_span(sink, req, now)

    def _export_span(self, sink: HttpStream, req: SimRequest, end_ns: int) -> None:
        """The request's span (sim/otlp.py): vLLM's with queue and prefill on the model's clock
        (``_phases``) and the engine's TTFT from the HTTP arrival to the first token written;
        SGLang's root span as the imitated generation exports it."""
        assert self.otlp is not None
        off = self.otlp.offset_ns
        first_ns = sink.first_ns
        span: SimSpan | None
        if self.flavor == "sglang":  # its root span: SGLang's own attributes (sim/otlp.py)
            entry = self._phases(req, first_ns or end_ns)[0]
            span = sglang_root_span(sink.rid, self.sglang_generation, sink.arrival_ns + off, entry + off,
                                    None if first_ns is None else first_ns + off, end_ns + off)
        else:
            queue = prefill = ttft = None
            if first_ns is not None:
                entry, admitted, done, _ = self._phases(req, first_ns)
                queue, prefill = max(0, admitted - entry) / 1e9, max(0, done - admitted) / 1e9
                ttft = (first_ns - sink.arrival_ns) / 1e9
            span = request_span(self.flavor, sink.rid, sink.arrival_ns + off, end_ns + off, queue, prefill, ttft)
        if span is not None:
            self.otlp.add(span)

    # -- common routes -------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if self.starting:
            if self.flavor == "tgi":
                return web.json_response({"error": "unhealthy", "error_type": "healthcheck"}, status=503)
            return web.Response(status=503, text="")
        return web.Response(text="")

    async def metrics_page(self, request: web.Request) -> web.Response:
        b = self.backend
        if isinstance(b, ModelBackend):
            st = (b.running, b.waiting, b.kv_usage, b.prefix_queries, b.prefix_hits, b.preemptions)
            its = b.stats.iteration_tokens
            gen = b.stats.generation_tokens
        else:
            st = (b.running, b.waiting, 0.0, 0, 0, 0)
            its = []
            gen = 0
        n0, t0 = self._gen_mark
        now = _now()
        if now - t0 > 1e9:
            self.gen_throughput = (gen - n0) / ((now - t0) / 1e9)
            self._gen_mark = (gen, now)
        text = self.metrics.render(*st, self.kv_tokens, self._budget(), its, self.gen_throughput)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    def _budget(self) -> int:
        mt = self.config.model_timing
        return mt.limits()[1] if mt is not None else 0

    async def models(self, request: web.Request) -> web.Response:
        m = self.config.model
        data = {"object": "list", "data": [{"id": m, "object": "model", "created": int(time.time()),
                                            "owned_by": "bench-sim", "root": m, "parent": None,
                                            "max_model_len": self.max_model_len}]}
        return web.json_response(data)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def tokenize_route(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if self.flavor == "tgi":
            text = str(body.get("inputs", ""))
            out = [{"id": i, "text": t, "start": 0, "stop": 0} for i, t in zip(tokenize(text), _pieces(text))]
            return web.json_response(out)
        prompt = body.get("prompt")
        if prompt is None and "messages" in body:
            prompt = _chat_prompt(body["messages"])
        tokens = tokenize(str(prompt or ""))
        return web.json_response({"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens,
                                  "token_strs": None})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        ids = body.get("tokens") or []
        return web.json_response({"prompt": "".join(output_token(int(i), 0) for i in ids)})

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix block (in every replica) so the next load starts cold."""
        b = self.backend
        if isinstance(b, ModelBackend):
            for inst in b.instances:
                inst.pool.reset_prefix_cache()

    async def reset_prefix_cache_route(self, request: web.Request) -> web.Response:
        self.reset_prefix_cache()
        return web.Response(text="")

    # -- generation (all flavours) -------------------------------------------------------
    async def refuse(self, request: web.Request, wire: Any, kind: str, stream: bool, status: int, message: str,
                     etype: str, status_error: Any) -> web.StreamResponse:
        """A request turned down before generation. SGLang's and TGI's streaming handlers validate
        inside the stream: HTTP 200, then the error event (SGLang: then [DONE]). Otherwise an HTTP error."""
        if not (stream and kind in ("sglang", "tgi")):
            return status_error(status, message)  # type: ignore[no-any-return]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await resp.write(wire.error(message, etype, status))
            await resp.write_eof()
        return resp

    async def _refuse_queue_full(self, request: web.Request, wire: Any, kind: str, stream: bool,
                                 status_error: Any) -> web.StreamResponse:  # fmt: skip
        """Past the admission limit. vLLM: HTTP 503 (v1/engine/async_llm.py). SGLang's /generate:
        streaming, HTTP 200 and one event ending the request with an abort, status 503; its OpenAI
        routes, HTTP 200 and an error chunk of code 503 (serving_completions.py); without
        streaming, HTTP 503 (tokenizer_manager.py ``_handle_abort_finish_reason``)."""
        self.metrics.failed("queue_full")
        message = "The request queue is full."
        if self.flavor == "sglang" and stream:  # HTTP 200, then the abort (native) or an error chunk (OpenAI routes)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            data = wire.queue_full() if kind == "sglang" else wire.error(message, "SERVICE_UNAVAILABLE", 503)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await resp.write(data)
                await resp.write_eof()
            return resp
        if kind == "sglang":
            return web.json_response({"object": "error", "message": message, "type": "503", "param": None,
                                      "code": 503}, status=503)  # fmt: skip
        return status_error(503, message if self.flavor == "sglang" else
                            "The server is at capacity: too many requests waiting (--max-num-queued-reqs).")  # fmt: skip

    def _too_long(self, kind: str, prompt: int, max_tokens: int) -> tuple[int, str, str] | None:
        """(status, message, error type) in the imitated engine's words when the request does not fit."""
        limit = self.max_model_len
        if kind == "tgi":
            chunk = min(max_tokens, TGI_SEGMENT_TOKENS)  # TGI validates the first segment only
            if prompt + chunk <= limit:
                return None
            return (422, f"Input validation error: `inputs` tokens + `max_new_tokens` must be <= {limit}. "
                         f"Given: {prompt} `inputs` tokens and {chunk} `max_new_tokens`", "validation")
        if prompt + max_tokens <= limit:
            return None
        if kind == "sglang":  # tokenizer_manager.py _validate_one_request, 0.5.23
            if prompt >= limit:
                return 400, f"The input ({prompt} tokens) is longer than the model's context length ({limit} tokens).", \
                    "invalid_request_error"
            return (400, f"Requested token count exceeds the model's maximum context length of {limit} tokens. "
                         f"You requested a total of {prompt + max_tokens} tokens: {prompt} tokens from the input "
                         f"messages and {max_tokens} tokens for the completion. Please reduce the number of tokens "
                         "in the input messages or the completion to fit within the limit.", "invalid_request_error")
        return (400, f"This model's maximum context length is {limit} tokens. However, you requested "
                     f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the completion).",
                "BadRequestError")

    async def _run(
        self, request: web.Request, kind: str, wire: Any, rid: str, prompt: str, max_tokens: int, stream: bool,
        arrival: int, status_error: Any, forced: bool = True, min_tokens: int = 0, stop_sequences: bool = False,
        constraint: tuple[str, Any] | None = None, adapter: str | None = None, image_ids: list[int] | None = None,
    ) -> web.StreamResponse:
        if self.starting:
            return status_error(503, "the engine is starting")
        script = None
        if constraint is not None:
            try:
                # the answer's pieces, then the end-of-sequence token (no text; TGI sends it as special)
                script = [*pieces(answer(constraint, zlib.crc32(rid.encode()))), ""]
            except Unsupported as exc:
                return status_error(400, f"structured output: {exc}")
        prompt_ids = tokenize(prompt)
        if not prompt_ids:
            prompt_ids = [0]
        if image_ids:  # the images' tokens are prefilled with the text's (their prefill is charged)
            prompt_ids = prompt_ids + image_ids
        refusal = self._too_long(kind, len(prompt_ids), max_tokens)
        if refusal is not None:
            if kind == "tgi":  # tgi_request_failure{err="validation"}; vLLM/SGLang count no request
                self.metrics.failed("validation")
            return await self.refuse(request, wire, kind, stream, *refusal, status_error)
        segment = 0
        if kind == "tgi":
            segment = min(max_tokens, TGI_SEGMENT_TOKENS)
            max_tokens = tgi_generated(len(prompt_ids), max_tokens, self.max_model_len)
        faults = self.faults.plan(max_tokens)
        if faults.http_status:
            self.metrics.failed(f"http{faults.http_status}")
            msg = {429: "Too many requests", 503: "Service unavailable", 500: "Internal server error"}
            return status_error(faults.http_status, msg[faults.http_status])
        if self.queue_full(kind):
            return await self._refuse_queue_full(request, wire, kind, stream, status_error)
        seed = zlib.crc32(rid.encode())
        sink = HttpStream(self, rid, wire, kind, seed, faults, arrival)
        mean = self.config.natural_stop_mean
        if mean > 0 and not forced and script is None:  # a structured answer ends where its structure does
            natural = 1 + int(random.Random(seed ^ self.config.seed).expovariate(1.0 / mean))
            n = min(max_tokens, max(min_tokens, natural))
            if n < max_tokens:
                max_tokens = n
                # TGI names what ended it; vLLM and SGLang say "stop" for both
                sink.finish_reason = ("stop_sequence" if stop_sequences else "eos_token") if kind == "tgi" else "stop"
        if script is not None:
            # the answer ends where its structure does (an end-of-sequence token), or is cut at max_tokens
            sink.script = script
            if len(script) <= max_tokens:
                max_tokens = len(script)
                sink.finish_reason = "eos_token" if kind == "tgi" else "tool_calls" if getattr(wire, "tool", None) else "stop"
        if segment:
            sink.planned, sink.segment = max_tokens, segment
        req = self._make_request(rid, prompt_ids, min(max_tokens, segment) if segment else max_tokens, arrival, sink)
        req.seqs = getattr(wire, "n", 1)  # n sequences: one prefill, decoded in the same steps
        if adapter is not None:
            self._load_adapter(req, adapter)
        self.metrics.request(len(prompt_ids))
        headers = {"x-request-id": rid}
        if not stream:
            return await self._respond_unary(sink, req, wire, len(prompt_ids), headers)
        fast = faults.clean and kind != "tgi" and request.transport is not None and script is None and req.seqs == 1
        return await self._respond_stream(request, sink, req, wire, len(prompt_ids), headers, fast)

    async def _respond_unary(
        self, sink: HttpStream, req: SimRequest, wire: Any, prompt_len: int, headers: dict[str, str],
    ) -> web.Response:
        """Run a non-streaming request to its end and answer it in one JSON body."""
        sink.unary_text = []
        self.engine.submit(req)
        try:
            await sink.done
        except asyncio.CancelledError:
            self.engine.abort(sink.req or req)
            raise
        if hasattr(wire, "cached"):
            wire.cached = req.cached_tokens
        self._record_finish(sink, prompt_len)
        if req.seqs > 1:
            texts = ["".join(sink.unary_text), *sink.other_choices(0, sink.sent, req.seqs)]
            body = wire.unary_choices(texts, sink.sent, sink.finish_reason)
        elif getattr(wire, "reasoning", 0):
            r = wire.reasoning
            body = wire.unary("".join(sink.unary_text[r:]), sink.sent, sink.finish_reason,
                              "".join(sink.unary_text[:r]))
        else:
            body = wire.unary("".join(sink.unary_text), sink.sent, sink.finish_reason)
        return web.json_response(body, headers=headers, dumps=lambda o: orjson.dumps(o).decode())

    async def _respond_stream(
        self, request: web.Request, sink: HttpStream, req: SimRequest, wire: Any, prompt_len: int,
        headers: dict[str, str], fast: bool,
    ) -> web.StreamResponse:
        """Open the event stream, let the engine write the tokens into it, and close it at the end.

        ``fast`` selects the sink's one-token hot path (no faults, no script, OpenAI/SGLang framing).
        """
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        pw = resp._payload_writer  # noqa: SLF001 - synchronous writes from the engine loop
        assert pw is not None
        pw.send_headers()
        sink.pw = pw
        sink.transport = request.transport
        sink.fast = fast
        if hasattr(wire, "cached"):
            wire.cached = 0
        self.engine.submit(req)
        self._streaming.add(sink)
        try:
            how = await sink.done
        except asyncio.CancelledError:
            self.engine.abort(sink.req or req)
            raise
        finally:
            self._streaming.discard(sink)
        if how == "shutdown":
            self.engine.abort(sink.req or req)
        if how == "ok":
            self._record_finish(sink, prompt_len)
        if how in ("ok", "ended"):
            with contextlib.suppress(ConnectionError, RuntimeError):
                await resp.write_eof()
        return resp


#: Each flavour's in-stream generation error: (error type, code) as its engine reports it.
_GEN_ERROR: dict[str, tuple[str, int]] = {"openai": ("InternalServerError", 500), "sglang": ("internal_error", 500),
                                          "tgi": ("generation", 500)}


def tgi_generated(prompt: int, max_new: int, limit: int) -> int:
    """Tokens TGI 3.x generates for ``max_new_tokens`` (router/src/infer/mod.rs): segments of
    min(max_new, 1024) while fewer than max_new are out and the grown input plus one more
    segment still fits ``--max-total-tokens``; so 1500 asked gives 2048."""
    chunk = min(max_new, TGI_SEGMENT_TOKENS)
    total = chunk
    while total < max_new and prompt + total + chunk <= limit:
        total += chunk
    return total


def tune_process(mlock: bool = False) -> None:
    """Process-wide settings for a dedicated engine process (``bench sim serve``)."""
    import gc

    if mlock:
        _mlockall()
    gc.freeze()  # start-up objects (modules, presets) never need scanning again: shorter GC pauses
    sys.setswitchinterval(0.0005)  # the log-writer thread must not hold the GIL for 5 ms slices


def _mlockall() -> None:
    """Keep every page resident: proactive reclaim on a busy host otherwise stalls the engine
    for hundreds of milliseconds when it touches a reclaimed page. Needs CAP_IPC_LOCK/root."""
    try:
        import ctypes
        import os

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if libc.mlockall(3) != 0:  # MCL_CURRENT | MCL_FUTURE
            sys.stderr.write(f"bench sim: --mlock failed: {os.strerror(ctypes.get_errno())}\n")
    except OSError as exc:
        sys.stderr.write(f"bench sim: --mlock unavailable: {exc}\n")


def _pieces(text: str) -> list[str]:
    import re

    return re.findall(r"\s*\S+", text)


#: pixels per side of one image token (Qwen2-VL-style 28x28 merged patches)
IMAGE_PATCH = 28


def _image_ids(urls: list[Any]) -> list[int]:
    """The prompt token ids the images stand for: ceil(w/28) x ceil(h/28) per image, read from
    each PNG's header, ids derived from the image's bytes (the same image, the same prefix).
    ``Unsupported`` for anything but a PNG data URL: the simulated engine fetches nothing."""
    ids: list[int] = []
    for url in urls:
        head, _, data = str(url).partition(",")
        if not head.startswith("data:image/png;base64"):
            raise Unsupported("images must be PNG data URLs (the simulated engine fetches nothing)")
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            raise Unsupported("an image's base64 data is invalid") from None
        if raw[:8] != b"\x89PNG\r\n\x1a\n" or raw[12:16] != b"IHDR":
            raise Unsupported("an image is not a PNG")
        w, h = struct.unpack(">II", raw[16:24])
        n = -(-w // IMAGE_PATCH) * -(-h // IMAGE_PATCH)
        c = zlib.crc32(raw)
        ids.extend(1000 + (c + k * 7919) % 30000 for k in range(n))
    return ids


def _message_images(messages: Any) -> list[Any]:
    """The image URLs of a chat request's content parts."""
    urls = []
    for m in messages if isinstance(messages, list) else ():
        c = m.get("content") if isinstance(m, dict) else None
        for p in c if isinstance(c, list) else ():
            if isinstance(p, dict) and p.get("type") == "image_url":
                urls.append((p.get("image_url") or {}).get("url"))
    return urls


def _chat_prompt(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    parts = []
    for m in messages:
        if isinstance(m, dict):
            c = m.get("content", "")
            if isinstance(c, list):
                c = " ".join(str(p.get("text", "")) for p in c if isinstance(p, dict))
            parts.append(str(c))
    return "\n".join(parts)


# -- flavour routes ------------------------------------------------------------------------------
def _openai_error(status: int, message: str) -> web.Response:
    etype = {400: "BadRequestError", 404: "NotFoundError", 429: "TooManyRequestsError", 500: "InternalServerError",
             503: "ServiceUnavailableError"}.get(status, "Error")
    return web.json_response({"error": {"message": message, "type": etype, "param": None, "code": status}},
                             status=status)


def _tgi_error(status: int, message: str) -> web.Response:
    etype = {400: "validation", 422: "validation", 429: "overloaded", 503: "unhealthy"}.get(status, "generation")
    return web.json_response({"error": message, "error_type": etype}, status=status)


def _sglang_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


class OpenAIRoutes:
    def __init__(self, srv: SimServer) -> None:
        self.srv = srv

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = _now()
        srv = self.srv
        body = await _json_body(request)
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return _openai_error(400, "messages must be a non-empty list")
            prompt = _chat_prompt(messages)
        else:
            raw_prompt = body.get("prompt")
            if isinstance(raw_prompt, list) and raw_prompt and all(isinstance(p, int) for p in raw_prompt):
                raw_prompt = " ".join(f"t{p}" for p in raw_prompt)
            if not isinstance(raw_prompt, str):
                return _openai_error(400, "prompt must be a string")
            prompt = raw_prompt
        model = body.get("model", srv.config.model)
        if model != srv.config.model and model not in srv.config.lora_adapters:
            return _openai_error(404, f"The model `{model}` does not exist.")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            max_tokens = 16 if not chat else max(1, srv.max_model_len - count_tokens(prompt))
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return _openai_error(400, "max_tokens must be a positive integer")
        min_tokens = body.get("min_tokens", 0)
        if not isinstance(min_tokens, int) or min_tokens < 0 or min_tokens > max_tokens:
            return _openai_error(400, "min_tokens must be an integer between 0 and max_tokens")
        problem = openai_problem(body, chat)
        if problem:
            return _openai_error(400, problem)
        opts = body.get("stream_options") or {}
        stream = bool(body.get("stream"))
        if opts and not stream:
            return _openai_error(400, "Stream options can only be defined when `stream=True`.")
        rid = ("chatcmpl-" if chat else "cmpl-") + srv.next_id()
        try:
            image_ids = _image_ids(_message_images(body.get("messages"))) if chat else []
        except Unsupported as exc:
            return _openai_error(400, str(exc))
        wire = OpenAIWire(rid, chat, model, (count_tokens(prompt) or 1) + len(image_ids), bool(opts.get("include_usage")),
                          bool(opts.get("continuous_usage_stats")), cached_details=True)
        try:
            constraint = openai_constraint(body)
            call = _tool_call(body, rid) if chat else None
        except Unsupported as exc:
            return _openai_error(400, str(exc))
        if call is not None:  # the answer is a call of one of the tools, its arguments fitting its parameters
            wire.tool, constraint = call[0], call[1]
        wire.n = body.get("n") or 1
        if wire.n > 1 and (constraint is not None or srv.flavor != "vllm"):
            # vLLM's stream of several sequences is modelled (HttpStream, OpenAIWire.choices_tokens); not
            # structured or tool answers of several, nor SGLang's OpenAI routes' own shape
            return _openai_error(400, "n > 1 is modelled by the simulated engine for vLLM text answers only")
        if chat and constraint is None:
            wire.reasoning = min(srv.config.reasoning_tokens, max_tokens - 1)
        return await srv._run(request, "openai", wire, rid, prompt, max_tokens, stream, arrival, _openai_error,
                              forced=bool(body.get("ignore_eos")), min_tokens=min_tokens, constraint=constraint,
                              adapter=model if model != srv.config.model else None, image_ids=image_ids)


    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/embeddings``: one vector per input. The inputs are prefilled as one
        sequence of their summed length (the cost of that prefill step; the one token the
        scheduler samples with it is not sent), then the vectors come in one response."""
        arrival = _now()
        srv = self.srv
        body = await _json_body(request)
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) for i in inputs):
            return _openai_error(400, "input must be a string or a non-empty list of strings")
        model = body.get("model", srv.config.model)
        if model != srv.config.model and model not in srv.config.lora_adapters:
            return _openai_error(404, f"The model `{model}` does not exist.")
        rid = "embd-" + srv.next_id()
        prompt = "\n".join(inputs)
        wire = EmbeddingWire(rid, model, [count_tokens(i) or 1 for i in inputs])
        return await srv._run(request, "openai", wire, rid, prompt, 1, False, arrival, _openai_error,
                              adapter=model if model != srv.config.model else None)


class SGLangRoutes:
    def __init__(self, srv: SimServer) -> None:
        self.srv = srv

    async def generate(self, request: web.Request) -> web.StreamResponse:
        arrival = _now()
        srv = self.srv
        body = await _json_body(request)
        text = body.get("text")
        if text is None and isinstance(body.get("input_ids"), list):
            text = " ".join(f"t{i}" for i in body["input_ids"])
        if not isinstance(text, str):
            return _sglang_error(400, "text (a string) or input_ids is required")
        sp = body.get("sampling_params") or {}
        unknown = srv.sglang_schema_error(sp)
        if unknown:  # 0.5.22 on: the schema's own 400 body, {"error": "<text>"} (entrypoints/api_contract.py)
            return web.json_response({"error": unknown}, status=400)
        max_tokens = sp.get("max_new_tokens", 128)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _sglang_error(400, "sampling_params.max_new_tokens must be a positive integer")
        problem = sglang_problem(sp)
        if problem:
            return _sglang_error(400, problem)
        lora = body.get("lora_path")
        if lora is not None and lora not in srv.config.lora_adapters:
            return _sglang_error(400, f"lora_path {lora!r} is not a loaded LoRA adapter")
        try:
            constraint = sglang_constraint(sp)
        except Unsupported as exc:
            return _sglang_error(400, str(exc))
        try:
            image_ids = _image_ids(body.get("image_data") or [])
        except Unsupported as exc:
            return _sglang_error(400, str(exc))
        rid = str(body.get("rid") or srv.next_id())
        wire = SGLangWire(rid, (count_tokens(text) or 1) + len(image_ids), arrival,
                          engine_ttft=srv.sglang_generation == "0.5.23")
        min_new = sp.get("min_new_tokens", 0)
        return await srv._run(request, "sglang", wire, rid, text, max_tokens, bool(body.get("stream")), arrival,
                              _sglang_error, forced=bool(sp.get("ignore_eos")),
                              min_tokens=min_new if isinstance(min_new, int) else 0, constraint=constraint, adapter=lora,
                              image_ids=image_ids)

    async def server_info(self, request: web.Request) -> web.Response:
        srv = self.srv
        mt = srv.config.model_timing
        info: dict[str, Any] = {
            "model_path": srv.config.model,
            "served_model_name": srv.config.model,
            "tp_size": mt.tp if mt else 1,
            "dp_size": mt.dp if mt else 1,
            "pp_size": mt.pp if mt else 1,
            "ep_size": mt.ep if mt else 1,
            "max_total_num_tokens": srv.kv_tokens,
            "chunked_prefill_size": mt.limits()[1] if mt else 8192,
            "max_running_requests": mt.limits()[0] if mt else 1024,
            "disaggregation_mode": "null" if not (mt and mt.disaggregated) else "prefill-decode",
            "version": srv.reported_version,
            "internal_states": [{"avg_spec_accept_length": None, "last_gen_throughput": srv.gen_throughput}],
        }
        if mt is not None:
            info["sim"] = describe(mt)
        return web.json_response(info)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.srv.config.model, "tokenizer_path": self.srv.config.model,
                                  "is_generation": True})

    async def health_generate(self, request: web.Request) -> web.Response:
        return await self.srv.health(request)

    async def flush_cache(self, request: web.Request) -> web.Response:
        """GET or POST: refused while requests are pending, unless ``?timeout=S`` (0.5.10 on;
        ignored before) waits up to S seconds for the engine to go idle first."""
        srv = self.srv
        b = srv.backend
        try:
            wait_s = float(request.query.get("timeout", 0)) if srv.config.sglang_release >= (0, 5, 10) else 0.0
        except ValueError:
            return web.json_response({"error": {"message": "timeout must be a number of seconds", "code": 400}},
                                     status=400)  # fmt: skip
        deadline = _now() + int(max(0.0, wait_s) * 1e9)
        while (b.running or b.waiting) and _now() < deadline:
            await asyncio.sleep(0.01)
        if b.running or b.waiting:  # scheduler.py flush_cache: refused while requests are pending
            return web.Response(status=400, text="Cache not flushed because there are pending requests. "
                                f"#queue-req: {b.waiting}, #running-req: {b.running}\n")
        self.srv.reset_prefix_cache()
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. "
                                 "(When there are running or waiting requests, the operation will not be performed.)\n")


class TGIRoutes:
    def __init__(self, srv: SimServer) -> None:
        self.srv = srv

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, stream=True)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """``POST /generate`` never streams: its body has no ``stream`` field (router/src/lib.rs
        GenerateRequest; only the compat route ``/`` reads one), so a ``stream: true`` there is ignored."""
        return await self._generate(request, stream=False, body=await _json_body(request))

    async def _generate(self, request: web.Request, stream: bool, body: dict[str, Any] | None = None) -> web.StreamResponse:
        arrival = _now()
        srv = self.srv
        if body is None:
            body = await _json_body(request)
        text = body.get("inputs")
        params = body.get("parameters") or {}
        m = params.get("max_new_tokens")
        if not isinstance(text, str) or (m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 0)):
            # axum's Json extractor, before TGI's own validation (`inputs`: String, max_new_tokens: u32)
            return _tgi_error(422, "Failed to deserialize the JSON body into the target type")
        wire = TGIWire(count_tokens(text) or 1, bool(params.get("details")), params.get("seed"))
        limit = srv.config.max_concurrent_requests
        if limit > 0 and srv.tgi_admitted >= limit:
            # the permit is taken before validation (router/src/infer/mod.rs generate_stream)
            srv.metrics.failed("overloaded")
            return await srv.refuse(request, wire, "tgi", stream, 429, "Model is overloaded", "overloaded", _tgi_error)
        srv.tgi_admitted += 1
        try:
            invalid = _tgi_invalid(text, params, stream)
            if invalid is not None:
                srv.metrics.failed("validation")
                return await srv.refuse(request, wire, "tgi", stream, 422, f"Input validation error: {invalid}",
                                        "validation", _tgi_error)
            lora = params.get("adapter_id")
            if lora is not None and lora not in srv.config.lora_adapters:
                return await srv.refuse(request, wire, "tgi", stream, 422, f"Input validation error: adapter {lora!r} "
                                        "is not loaded", "validation", _tgi_error)
            try:
                constraint = tgi_constraint(params)
            except (Unsupported, ValueError) as exc:
                return await srv.refuse(request, wire, "tgi", stream, 422, f"Input validation error: {exc}",
                                        "validation", _tgi_error)
            # no max_new_tokens: all that fits, in segments (validation.rs)
            max_tokens = params.get("max_new_tokens") or max(1, srv.max_model_len - (count_tokens(text) or 1))
            return await srv._run(request, "tgi", wire, srv.next_id(), text, max_tokens, stream, arrival, _tgi_error,
                                  forced=False, stop_sequences=bool(params.get("stop")), constraint=constraint,
                                  adapter=lora)
        finally:
            srv.tgi_admitted -= 1

    async def info(self, request: web.Request) -> web.Response:
        srv = self.srv
        return web.json_response({  # router/src/lib.rs Info: no shard count
            "model_id": srv.config.model,
            "model_sha": None,
            "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": srv.config.max_concurrent_requests,
            "max_best_of": 2,
            "max_stop_sequences": 4,
            "max_input_tokens": srv.max_model_len - 1,
            "max_total_tokens": srv.max_model_len,
            "validation_workers": 2,
            "max_client_batch_size": 4,
            "router": "text-generation-router",
            "version": VERSION,
            "sha": None,
            "docker_label": None,
        })


def _tool_call(body: dict[str, Any], rid: str) -> tuple[tuple[str, str], tuple[str, Any]] | None:
    """With ``tools`` (and a ``tool_choice`` other than "none"): ((call id, function name), the
    constraint its arguments fit). The named tool, or one chosen by the request id."""
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools):
        raise Unsupported("tools must be a list of {type: function, function: {...}} objects")
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        return None
    functions = [t["function"] for t in tools]
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        named = [f for f in functions if f.get("name") == name]
        if not named:
            raise Unsupported(f"tool_choice names {name!r}, which is not among the tools")
        fn = named[0]
    else:
        fn = functions[zlib.crc32(rid.encode()) % len(functions)]
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return ("chatcmpl-tool-" + rid.rsplit("-", 1)[-1], str(fn.get("name", ""))), ("json", params)


def _tgi_invalid(text: str, params: dict[str, Any], stream: bool = False) -> str | None:
    """TGI's validation message for what the sim checks (router/src/validation.rs), or None.
    A stream takes neither ``decoder_input_details`` nor ``best_of`` > 1 (ValidationError
    PrefillDetailsStream, BestOfStream)."""
    if not text:
        return "`inputs` cannot be empty"
    if stream and params.get("decoder_input_details") is True:
        return "`decoder_input_details` == true is not supported when streaming tokens"
    best_of = params.get("best_of")
    if stream and best_of is not None and best_of != 1:
        return "`best_of` != 1 is not supported when streaming tokens"
    if params.get("max_new_tokens") == 0:
        return "`max_new_tokens` must be strictly positive"
    return tgi_problem(params)  # the sampling fields


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise web.HTTPBadRequest(text='{"object":"error","message":"invalid JSON body"}', content_type="application/json")
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text='{"object":"error","message":"body must be an object"}', content_type="application/json")
    return body


def create_app(config: ServerConfig = ServerConfig()) -> web.Application:
    """The simulated engine as an aiohttp app (raises ``OutOfMemory`` for impossible configurations)."""
    srv = SimServer(config)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[ENGINE_KEY] = srv
    app.on_startup.append(srv.on_startup)
    app.on_shutdown.append(srv.on_shutdown)
    app.on_cleanup.append(srv.on_cleanup)
    r = app.router
    r.add_get("/health", srv.health)
    r.add_get("/metrics", srv.metrics_page)
    r.add_get("/v1/models", srv.models)
    oa = OpenAIRoutes(srv)
    if config.flavor == "vllm":
        r.add_get("/version", srv.version)
        r.add_get("/ping", srv.health)
        r.add_post("/tokenize", srv.tokenize_route)
        r.add_post("/detokenize", srv.detokenize)
        r.add_post("/reset_prefix_cache", srv.reset_prefix_cache_route)  # vLLM dev-mode route
        r.add_post("/v1/completions", oa.completions)
        r.add_post("/v1/chat/completions", oa.chat)
        r.add_post("/v1/embeddings", oa.embeddings)
    elif config.flavor == "sglang":
        sg = SGLangRoutes(srv)
        r.add_post("/generate", sg.generate)
        r.add_get("/health_generate", sg.health_generate)
        r.add_get("/get_server_info", sg.server_info)
        r.add_get("/server_info", sg.server_info)
        r.add_get("/get_model_info", sg.model_info)
        r.add_get("/model_info", sg.model_info)
        r.add_post("/flush_cache", sg.flush_cache)
        r.add_get("/flush_cache", sg.flush_cache)  # GET and POST (http_server.py, 0.5.8 on)
        r.add_post("/v1/completions", oa.completions)
        r.add_post("/v1/chat/completions", oa.chat)
        r.add_post("/v1/embeddings", oa.embeddings)
    else:
        tg = TGIRoutes(srv)
        r.add_post("/generate_stream", tg.generate_stream)
        r.add_post("/generate", tg.generate)
        r.add_get("/info", tg.info)
        r.add_get("/ping", srv.health)
        r.add_post("/tokenize", srv.tokenize_route)
        r.add_post("/v1/completions", oa.completions)
        r.add_post("/v1/chat/completions", oa.chat)
    return app


@contextlib.asynccontextmanager
async def serve_in_process(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Run ``app`` on the current event loop; yields its base URL."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    sock_port = runner.addresses[0][1]
    try:
        yield f"http://[{host}]:{sock_port}" if ":" in host else f"http://{host}:{sock_port}"
    finally:
        await runner.cleanup()
