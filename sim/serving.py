"""The simulated server's state and how it serves one generation request, for every flavour.

``SimServer`` holds what the routes share (the backend and its engine loop, the flavour's
Prometheus metrics, the fault planner, resident LoRA adapters), runs the app's lifecycle (start
the engine loop, end open streams at shutdown, flush the emission log), and takes a request the
routes (``sim.routes``) have parsed through admission, the engine and its response: one JSON
body, or an event stream written by the request's ``HttpStream`` (``sim.stream``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
import zlib
from typing import Any

import orjson
from aiohttp import web

from bench_llm.core import __version__
from bench_llm.core.tokenizer import tokenize
from bench_llm.sim.backend import FixedBackend, ModelBackend
from bench_llm.sim.config import SGLANG_SCHEMA_CHECK_SINCE, SGLANG_VERSION, ServerConfig
from bench_llm.sim.emission import EmissionLog
from bench_llm.sim.faults import FaultPlanner
from bench_llm.sim.loop import EngineLoop
from bench_llm.sim.otlp import SimSpan, SpanExporter, request_span, sglang_root_span
from bench_llm.sim.prom import FlavorMetrics
from bench_llm.sim.request import SimRequest
from bench_llm.sim.sampling import SGLANG_SAMPLING_FIELDS
from bench_llm.sim.stream import HttpStream
from bench_llm.sim.structured import Unsupported, answer, pieces

_now = time.perf_counter_ns
VERSION = f"{__version__}-bench-sim"
#: TGI 3.x generates in segments of min(max_new_tokens, 1024) tokens and re-queues the request,
#: prompt plus text so far, after each (router/src/validation.rs DEFAULT_GENERATION_LENGTH,
#: router/src/infer/mod.rs); a request may end past its max_new_tokens.
TGI_SEGMENT_TOKENS = 1024


def tgi_generated(prompt: int, max_new: int, limit: int) -> int:
    """Tokens TGI 3.x generates for ``max_new_tokens`` (router/src/infer/mod.rs): segments of
    min(max_new, 1024) while fewer than max_new are out and the grown input plus one more
    segment still fits ``--max-total-tokens``; so 1500 asked gives 2048."""
    chunk = min(max_new, TGI_SEGMENT_TOKENS)
    total = chunk
    while total < max_new and prompt + total + chunk <= limit:
        total += chunk
    return total


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

    # -- engine state the routes report ----------------------------------------------------
    def prometheus_text(self) -> str:
        """The flavour's /metrics page, with the generation throughput refreshed at most once a second."""
        b = self.backend
        if isinstance(b, ModelBackend):
            st = (b.running, b.waiting, b.kv_usage, b.prefix_queries, b.prefix_hits, b.preemptions)
            its = b.stats.iteration_tokens
            gen = b.stats.generation_tokens
            spec = b.spec_decode
        else:
            st = (b.running, b.waiting, 0.0, 0, 0, 0)
            its = []
            gen = 0
            spec = None
        n0, t0 = self._gen_mark
        now = _now()
        if now - t0 > 1e9:
            self.gen_throughput = (gen - n0) / ((now - t0) / 1e9)
            self._gen_mark = (gen, now)
        return self.metrics.render(*st, self.kv_tokens, self._budget(), its, self.gen_throughput, spec)

    def _budget(self) -> int:
        mt = self.config.model_timing
        return mt.limits()[1] if mt is not None else 0

    def reset_prefix_cache(self) -> None:
        """Drop every cached prefix block (in every replica) so the next load starts cold."""
        b = self.backend
        if isinstance(b, ModelBackend):
            for inst in b.instances:
                inst.pool.reset_prefix_cache()

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

    async def run_generation(
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
