"""The simulated server's stream writing: one request's token sink.

The engine loop (``sim.loop``) hands every due token to its request's ``HttpStream`` at each step
boundary; the stream formats the flavour's payload (``sim.wire``) and writes it to the socket
synchronously, in the same pass, applies the faults planned for the request (``sim.faults``),
then records the token in the emission log.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, Protocol

from bench_llm.core.tokenizer import output_token
from bench_llm.sim.emission import EmissionLog
from bench_llm.sim.faults import RequestFaults
from bench_llm.sim.loop import EngineLoop
from bench_llm.sim.prom import FlavorMetrics
from bench_llm.sim.request import SimRequest

_now = time.perf_counter_ns
SPLIT_TOKEN = " caf\u00e9"  # one token whose UTF-8 bytes the split_utf8 fault cuts in half

#: Each flavour's in-stream generation error: (error type, code) as its engine reports it.
_GEN_ERROR: dict[str, tuple[str, int]] = {"openai": ("InternalServerError", 500), "sglang": ("internal_error", 500),
                                          "tgi": ("generation", 500)}


class StreamOwner(Protocol):
    """What a stream needs of the server that opened it (``sim.serving.SimServer``)."""

    engine: EngineLoop
    metrics: FlavorMetrics
    emission_log: EmissionLog | None

    def request_timing(self, req: SimRequest, first_token_ns: int) -> dict[str, float]: ...


class HttpStream:
    """A request's token sink: formats and writes its stream in the engine loop's pass."""

    __slots__ = ("srv", "req", "rid", "wire", "kind", "seed", "faults", "pw", "transport", "done", "sent",
                 "held", "hold_until", "buf_text", "buf_pieces", "buf_intended", "buf_first", "first_ns", "last_ns",
                 "arrival_ns", "unary_text", "closed", "fast", "finish_reason", "ended", "planned", "segment", "first_req",
                 "script")

    def __init__(self, srv: StreamOwner, rid: str, wire: Any, kind: str, seed: int, faults: RequestFaults,
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
