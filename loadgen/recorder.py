"""Per-request recording: the sink a transport feeds, turned into a RequestRecord.

The hot path (``data``) only appends the read's timestamp and bytes to two lists. The
SSE framing and payload parsing ("digest") happen later, off the read path, in batches:
a recorder joins the runner's ``DigestQueue`` once it holds ``QUEUE_AFTER`` undigested
reads, and the queue is drained a few recorders per event-loop iteration, after that
iteration's sockets were read and stamped (without a queue: inline every
``DIGEST_EVERY`` reads). Batching keeps the fixed cost of a digest off every token, and
memory per stream stays bounded by the batch. ``finish`` digests the rest and resolves
the token accounting once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from bench_llm.adapters.base import EventKind, ScanState, ScanStateParser, StreamEvent, StreamParser, keeps_scan_state
from bench_llm.adapters.sse import SSEFramer
from bench_llm.core.redact import redact
from bench_llm.core.rejections import http_error_type
from bench_llm.loadgen.transport import StreamError
from bench_llm.results.record import SOURCE_NON_STREAMING, RequestRecord
from bench_llm.workloads.spec import RequestSpec
from bench_llm.workloads.structured import conforms

#: Token-count sources, most trusted first (see docs/metrics.md).
SOURCE_CUMULATIVE = "server_cumulative"
SOURCE_PROTOCOL = "protocol_exact"
SOURCE_FINAL_SPREAD = "server_final_spread"
SOURCE_CHUNKS = "chunk_count"


#: Without a digest queue, reads are digested inline in batches of this size.
DIGEST_EVERY = 64
#: With a queue, a recorder is queued for digesting once it holds this many reads.
QUEUE_AFTER = 16
#: Default longest SSE event (or line) kept (``--max-event-bytes``): a server that streams
#: a line without end fails its request (``line_too_long``) instead of the client's memory.
MAX_EVENT_BYTES = 8 << 20


class DigestQueue:
    """Recorders with undigested reads, drained a few per event-loop iteration.

    ``schedule`` is called with ``drain`` when the queue becomes non-empty (the runner
    passes ``loop.call_soon``): every I/O callback of the current iteration runs (and
    stamps its read) before the parsing work of any of them.
    """

    __slots__ = ("_pending", "_schedule")

    def __init__(self, schedule: "Callable[[Callable[[], None]], object]") -> None:
        self._pending: list[RequestRecorder] = []
        self._schedule = schedule

    def add(self, recorder: RequestRecorder) -> None:
        if not self._pending:
            self._schedule(self.drain)
        self._pending.append(recorder)

    #: Recorders digested per loop iteration (each with ~QUEUE_AFTER reads: 0.1-0.2 ms of
    #: parsing); the rest wait, so the socket reads of the next iteration (and their
    #: stamps), and the closed-loop slots freed by them, never wait behind a backlog.
    BATCH = 1

    def drain(self) -> None:
        pending = self._pending
        if len(pending) > self.BATCH:
            batch, self._pending = pending[: self.BATCH], pending[self.BATCH :]
            self._schedule(self.drain)
        else:
            batch, self._pending = pending, []
        for rec in batch:
            rec._digest()


class FastStreamLike(Protocol):
    """What the recorder reads of the compiled path's per-response state
    (``loadgen._fastpath.FastStream``)."""

    done: int
    pending: bytes
    last_payload_ns: int
    scanned: int

    def columns(self, kinds: tuple[EventKind, ...], nfields: int) -> tuple[list[int], tuple[list[Any], ...]]: ...
    def flush(self, sink: RequestRecorder) -> None: ...


class RequestRecorder:
    """Receives one response from a transport; builds its record."""

    __slots__ = (
        "spec",
        "worker_id",
        "intended_ns",
        "send_ns",
        "first_byte_ns",
        "end_ns",
        "last_data_ns",
        "status",
        "_framer",
        "_parser",
        "_ts",
        "_events",
        "_done",
        "_error",
        "_keep_text",
        "_text",
        "_body",
        "_raw",
        "_raw_ts",
        "_queue",
        "_queued",
        "_fast",
        "_not_sse",
        "_last_payload_ns",
        "_parsed",
        "_after_end",
        "max_event_bytes",
    )

    def __init__(
        self,
        spec: RequestSpec,
        parser: StreamParser,
        worker_id: int,
        intended_ns: int,
        keep_text: bool = False,
        queue: DigestQueue | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
    ) -> None:
        self.spec = spec
        self.worker_id = worker_id
        self.intended_ns = intended_ns
        self.send_ns: int | None = None
        self.first_byte_ns: int | None = None
        self.end_ns: int | None = None
        #: When the last body bytes arrived: the end of a complete response.
        self.last_data_ns: int | None = None
        self.status: int | None = None
        self._framer = SSEFramer()
        self._parser = parser
        self._ts: list[int] = []
        self._events: list[StreamEvent] = []
        self._done = False
        self._error: StreamError | None = None
        self._keep_text = keep_text
        self._text: list[str] = []
        self._body = b""
        self._raw: list[bytes] = []
        self._raw_ts: list[int] = []
        self._queue = queue
        self._queued = False
        #: The compiled read path's state for this response (``use_fast``), if it took it.
        self._fast: FastStreamLike | None = None
        #: A 2xx response's Content-Type when it is not an event stream (an HTML login
        #: page behind a proxy): its body is kept like an error body, for the message.
        self._not_sse: str | None = None
        #: Stamp of the read that brought the last SSE data payload (-1: none yet).
        self._last_payload_ns = -1
        #: SSE data payloads the adapter's Python parser read.
        self._parsed = 0
        #: Payloads after the end-of-stream marker (dropped: a protocol anomaly).
        self._after_end = 0
        self.max_event_bytes = max_event_bytes

    # -- transport callbacks -------------------------------------------------------
    def sent(self, ts_ns: int) -> None:
        """The request bytes were handed to the socket."""
        self.send_ns = ts_ns

    def headers(self, ts_ns: int, status: int, content_type: str = "") -> None:
        self.first_byte_ns = ts_ns
        self.status = status
        media = content_type.split(";", 1)[0].strip().lower()
        # a non-streaming request's answer is one JSON body, not an event stream
        if 200 <= status < 300 and media and media != "text/event-stream" and self.spec.stream:
            self._not_sse = media

    def data(self, ts_ns: int, data: bytes) -> None:
        """Body bytes read at ``ts_ns``: kept for the digest. Never raises."""
        self.last_data_ns = ts_ns
        status = self.status
        if status is not None and status >= 400:
            if len(self._body) < 2048:
                self._body += data[: 2048 - len(self._body)]
            return
        if self._not_sse is not None and len(self._body) < 2048:
            self._body += data[: 2048 - len(self._body)]
        if self._error is not None:
            return  # failed (an event without end): nothing more is kept
        raw = self._raw
        raw.append(data)
        self._raw_ts.append(ts_ns)
        if len(raw) >= QUEUE_AFTER and not self._queued:
            queue = self._queue
            if queue is not None:
                self._queued = True
                queue.add(self)
            elif len(raw) >= DIGEST_EVERY:
                self._digest()

    # -- the compiled read path (loadgen/_fastpath.c) --------------------------------
    @property
    def fast_api(self) -> int:
        """Which compiled scan suits this response's payloads (0: none; the parser's
        ``fast_api``). Not when the answer text is kept: the scan does not keep text."""
        if self._keep_text or self._not_sse is not None or not self.spec.stream:
            return 0
        return getattr(self._parser, "fast_api", 0)

    def use_fast(self, fast: FastStreamLike) -> None:
        """The transport reads this response's body through ``fast``: it keeps the
        regular token events itself and hands the rest here (``fast_special``, or
        ``data`` for bytes the Python framer must frame)."""
        self._fast = fast

    def fast_special(self, ts_ns: int, payload: bytes) -> tuple[int, StreamEvent | None]:
        """One payload the compiled scan did not recognise, parsed by the adapter's own
        parser exactly as ``_digest`` would (in order; the scan keeps such payloads until
        a token event needs the parser's state, or until the record is built). Returns (code, event to keep): code 0 goes
        on, 1 means the scan may no longer take any payload (the parser's state changed
        what a regular event means), 2 means stop (the stream failed)."""
        event, failed = self._parse_one(payload)
        if failed:
            return 2, event
        return (0 if getattr(self._parser, "fast_ok", False) else 1), event

    def fast_state(self) -> ScanState:
        """The parser's stream state, for a scan that keeps it while taking events (SGLang)."""
        return self._stateful_parser().fast_state()

    def fast_sync(self, mode: int, tokens: int, text: bytes | None) -> None:
        """The scan's stream state, given back to the parser before it reads a payload."""
        self._stateful_parser().fast_sync(mode, tokens, text)

    def _stateful_parser(self) -> ScanStateParser:
        parser = self._parser
        if not keeps_scan_state(parser):  # only a scan whose parser keeps state calls these
            raise TypeError(f"{type(parser).__name__} keeps no scan state")
        return parser

    def _parse_one(self, payload: bytes) -> tuple[StreamEvent | None, bool]:
        """One payload through the adapter's parser: (the event to keep, whether the
        stream failed). A malformed payload or an error event fails it (``_error``); the
        end-of-stream marker is noted, not kept."""
        self._parsed += 1
        if self._done:  # the stream said it ended: what follows is never counted
            self._after_end += 1
            return None, False
        try:
            event = self._parser.parse(payload)
        except Exception as exc:  # a malformed payload fails this request only
            self._error = StreamError("malformed_chunk", str(exc)[:300])
            return None, True
        if event is None:
            return None, False
        kind = event.kind
        if kind == EventKind.DONE:
            self._done = True
            return None, False
        if kind == EventKind.ERROR:
            self._error = StreamError(event.error_type or "server_error", event.error_message or "")
            return event, True
        return event, False

    def _digest(self) -> None:
        """Frame and parse the reads received so far (off the read path)."""
        self._queued = False
        raw, stamps = self._raw, self._raw_ts
        if not raw or not self.spec.stream:  # a non-streaming body is parsed whole, at the end
            return
        self._raw, self._raw_ts = [], []
        if self._error is not None:
            return
        framer = self._framer
        parse_one = self._parse_one
        ts_list, events = self._ts, self._events
        keep_text = self._keep_text
        for ts_ns, data in zip(stamps, raw):
            if (
                data[:5] == b"data:"
                and data[-2:] == b"\n\n"
                and data.count(b"\n") == 2
                and b"\r" not in data
                and not framer.pending
            ):
                # fast path: the read is exactly one single-line event
                payloads = [data[6:-2] if data[5:6] == b" " else data[5:-2]]
            else:
                payloads = framer.feed(data)
                if len(framer.pending) > self.max_event_bytes:
                    self._error = StreamError("line_too_long", f"an SSE event or line longer than {self.max_event_bytes} bytes")
                    framer.reset()
                    return
            if payloads:
                self._last_payload_ns = ts_ns
            for payload in payloads:
                event, failed = parse_one(payload)
                if event is not None:
                    ts_list.append(ts_ns)
                    events.append(event)
                    if keep_text and event.text and event.kind == EventKind.CONTENT:
                        self._text.append(event.text)
                if failed:
                    return

    def progress_ns(self) -> int:
        """When this response last made progress, for the stall timeout: the read of its
        last SSE data payload (comments and keep-alives are not progress), or the last
        bytes of a body that is not an event stream; before either, its head (the stall
        clock runs from the response head: a stream that never sends data fails at the
        stall timeout after it), and before the head, the send."""
        base = self.send_ns or 0
        status = self.status
        if status is None:
            return base
        base = max(base, self.first_byte_ns or 0)
        if status >= 400 or self._not_sse is not None:
            return max(base, self.last_data_ns or self.first_byte_ns or 0)
        self._digest()
        last = self._last_payload_ns
        fast = self._fast
        if fast is not None:
            last = max(last, fast.last_payload_ns)
        return max(base, last)

    def _parse_unary(self) -> None:
        """A non-streaming response: the whole body through the parser's ``parse_unary``,
        kept as one event stamped when the body's last bytes arrived."""
        body, stamps = b"".join(self._raw), self._raw_ts
        self._raw, self._raw_ts = [], []
        if not body or self._error is not None:
            return
        parse = getattr(self._parser, "parse_unary", None)
        if parse is None:
            self._error = StreamError("client_error", "this adapter cannot read non-streaming responses")
            return
        try:
            event = parse(body)
        except Exception as exc:  # a malformed body fails this request only
            self._error = StreamError("malformed_response", str(exc)[:300])
            return
        if event.kind == EventKind.ERROR:
            self._error = StreamError(event.error_type or "server_error", event.error_message or "")
            return
        self._ts.append(stamps[-1])
        self._events.append(event)
        self._done = True
        if self._keep_text and event.text:
            self._text.append(event.text)

    @property
    def payloads_read(self) -> tuple[int, int]:
        """(payloads the compiled scan took itself, payloads the Python parser read): the
        run's read-path share (``RunStats``)."""
        fast = self._fast
        return (fast.scanned if fast is not None else 0), self._parsed

    @property
    def saw_done(self) -> bool:
        self._digest()
        if self._fast is not None:
            self._fast.flush(self)
            return self._done or bool(self._fast.done)
        return self._done

    @property
    def answer_text(self) -> str:
        return "".join(self._text)

    # -- result --------------------------------------------------------------------
    def _columns(self) -> tuple[list[int], tuple[Sequence[Any], ...], bytes, bool]:
        """The stream's events as (stamps, one column per StreamEvent field), the SSE bytes
        left after the last complete event, and whether the end-of-stream marker came.

        Column-wise (one transposition in C, then scans from the end where the fields the
        record needs sit): the record of a 256-token stream is built in a fraction of the
        per-event loop's time, which matters when a whole batch of streams ends in one step."""
        events = self._events
        cols: tuple[Sequence[Any], ...] = tuple(zip(*events)) if events else ((),) * _NFIELDS
        stamps: list[int] = self._ts
        pending = self._framer.pending
        done = self._done
        fast = self._fast
        if fast is not None:
            # the compiled path's events come first: the Python framer only ever takes over
            fast_stamps, fast_cols = fast.columns(_FAST_KINDS, _NFIELDS)
            if fast_stamps:
                stamps = fast_stamps + stamps if stamps else fast_stamps
                cols = tuple(f + list(c) for f, c in zip(fast_cols, cols)) if events else fast_cols
            pending = pending or fast.pending
            done = done or bool(fast.done)
        return stamps, cols, pending, done

    def _verdict(
        self, err: StreamError | None, any_event: bool, done: bool, pending: bool, finish_reason: str | None,
        requires_done: bool, unary: bool,
    ) -> StreamError | None:
        """The request's failure, if any: the transport's or the stream's own ``err``, else
        what the response lacked (a response, an event stream, its end)."""
        if err is None and self.status is None:
            err = StreamError("no_response", "no response received")
        if self._not_sse is not None and not any_event and not done and (err is None or err.error_type == "malformed_chunk"):
            # a 2xx answer of another kind (a login page, a JSON body), said as such; a
            # server that streams events under another Content-Type is still read
            body = " ".join(self._body.decode("utf-8", "replace").split())[:200]
            err = StreamError("not_event_stream", f"not an event stream ({self._not_sse})" + (f": {body}" if body else ""))
        if err is None:
            if requires_done and not done:
                err = StreamError("no_done", "stream ended without its end-of-stream marker")
            elif not requires_done and finish_reason is None and not unary:  # a parsed body is whole
                err = StreamError("truncated", "stream ended without a final event")
            elif pending:
                err = StreamError("truncated", "stream ended inside an event")
        return err

    def finish(
        self, end_ns: int, error: StreamError | None = None, requires_done: bool = True, save_text: bool = False
    ) -> RequestRecord:
        """Close the record. ``error`` comes from the transport (reset, timeout, ...).

        Kept as one function on purpose (over ~80 lines): it runs once per request on the
        path whose timing bench reports, and splitting it into steps would add calls there.
        """
        self._digest()
        self.end_ns = end_ns
        unary = not self.spec.stream
        if unary:
            self._parse_unary()
        fast = self._fast
        if fast is not None:
            try:
                fast.flush(self)  # the payloads the compiled scan left to the parser (final events)
            except Exception as exc:  # never lose the request to an error of the client's own
                self._error = self._error or StreamError("client_error", f"{type(exc).__name__}: {exc}")
        err = self._error or error
        if err is None and self.status is not None and self.status >= 400:
            # 429 and 503 are admission rejections, each with its own type (core/rejections.py)
            err = StreamError(http_error_type(self.status), f"HTTP {self.status}: {self._body.decode('utf-8', 'replace')[:300]}")

        stamps, cols, pending, done = self._columns()
        finish_reason = _last_set(cols[_FINISH])
        prompt_tokens = _last_set(cols[_PROMPT])
        completion_tokens = _last_set(cols[_COMPLETION])
        cached_tokens = _last_set(cols[_CACHED])
        server_id = next(filter(None, cols[_SERVER_ID]), None)
        timing = _last_set(cols[_TIMING])
        err = self._verdict(err, bool(stamps), done, bool(pending.strip()), finish_reason, requires_done, unary)
        kinds, texts = cols[_KIND], cols[_TEXT]
        counts, source, backwards = _token_counts(kinds, texts, cols[_TOKENS], completion_tokens, cols[_CUMULATIVE])
        after_end = self._after_end + (getattr(fast, "after_done", 0) if fast is not None else 0)
        output_tokens = sum(counts)
        reasoning: int | None = sum(n for n, kind in zip(counts, kinds) if kind == EventKind.REASONING)
        if unary:  # one response, no per-token times: E2E only
            stamps, counts, source, reasoning = [], [], SOURCE_NON_STREAMING, None
        first_token = first_content = None
        for ts, kind, text, n in zip(stamps, kinds, texts, counts):
            if n > 0 or (source == SOURCE_CHUNKS and kind == EventKind.CONTENT and text):
                if first_token is None:
                    first_token = ts
                if kind != EventKind.REASONING and kind != EventKind.ERROR:
                    first_content = ts
                    break
        spec = self.spec
        tool_calls = first_tool_call = None
        if spec.tools:
            calls = cols[_TOOLS]
            tool_calls = max((c for c in calls if c is not None), default=0)
            if stamps:
                first_tool_call = next((ts for ts, c in zip(stamps, calls) if c is not None), None)
        structured_ok = None
        if spec.constraint is not None and err is None:
            structured_ok = conforms(spec.constraint, self.answer_text)
        return RequestRecord(
            request_id=spec.request_id,
            phase=spec.phase,
            worker_id=self.worker_id,
            intended_send_ns=self.intended_ns,
            send_ns=self.send_ns,
            first_byte_ns=self.first_byte_ns,
            first_token_ns=first_token,
            first_content_ns=first_content,
            end_ns=end_ns,
            chunk_ns=stamps,
            chunk_tokens=counts,
            output_tokens=output_tokens,
            token_source=source,
            input_tokens_target=spec.input_tokens,
            input_tokens_source=spec.input_tokens_source,
            max_output_tokens=spec.max_output_tokens,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            http_status=self.status,
            finish_reason=finish_reason,
            ok=err is None,
            error_type=None if err is None else err.error_type,
            error_message=None if err is None else redact(str(err))[:500],  # a URL's credentials
            server_request_id=server_id,
            session_id=spec.session_id,
            turn=spec.turn,
            prefix_group=spec.prefix_group,
            length_class=spec.length_class,
            output_text=self.answer_text if save_text else None,
            server_timing_json=None if timing is None else json.dumps(timing, separators=(",", ":")),
            reasoning_tokens=reasoning,
            kind=None if spec.kind == "generate" else spec.kind,
            model=spec.model,
            structured_ok=structured_ok,
            inputs=spec.batch if spec.kind == "embeddings" else None,
            tool_calls=tool_calls,
            first_tool_call_ns=first_tool_call,
            images=len(spec.images) or None,
            n=spec.sampling.n if spec.sampling is not None and spec.sampling.n and spec.sampling.n > 1 else None,
            protocol_anomaly="event_after_end" if after_end else ("count_backwards" if backwards else None),
        )


_NFIELDS = len(StreamEvent._fields)
_KIND = StreamEvent._fields.index("kind")
_TEXT = StreamEvent._fields.index("text")
_TOKENS = StreamEvent._fields.index("tokens")
_FINISH = StreamEvent._fields.index("finish_reason")
_PROMPT = StreamEvent._fields.index("prompt_tokens")
_COMPLETION = StreamEvent._fields.index("completion_tokens")
_CACHED = StreamEvent._fields.index("cached_tokens")
_SERVER_ID = StreamEvent._fields.index("server_request_id")
_TIMING = StreamEvent._fields.index("server_timing")
_TOOLS = StreamEvent._fields.index("tool_calls")
#: The kinds the compiled scan's codes stand for (0 is a parser event kept whole).
_FAST_KINDS = (EventKind.EMPTY, EventKind.CONTENT, EventKind.REASONING)
_CUMULATIVE = StreamEvent._fields.index("cumulative")

_T = TypeVar("_T")


def _last_set(column: Sequence[_T | None]) -> _T | None:
    """The last value that is not None (the column of one field over a stream's events)."""
    if column.count(None) == len(column):
        return None
    for value in reversed(column):
        if value is not None:
            return value
    return None


def _token_counts(
    kinds: Sequence[EventKind],
    texts: Sequence[str],
    tokens: Sequence[int | None],
    final_completion: int | None,
    cumulative: Sequence[int | None],
) -> tuple[list[int], str, bool]:
    """Tokens carried by each event, from the events' columns (kind, text, tokens,
    cumulative count), where the numbers came from, and whether a cumulative count went
    down (a protocol anomaly: the stream's counts cannot all be true)."""
    if cumulative.count(None) != len(cumulative):
        counts: list[int] = []
        append = counts.append
        last = 0
        backwards = False
        for c in cumulative:
            if c is not None and c > last:
                append(c - last)
                last = c
            else:
                append(0)
                if c is not None and c < last:
                    backwards = True
        return counts, SOURCE_CUMULATIVE, backwards
    if tokens.count(None) != len(tokens):
        return [t or 0 for t in tokens], SOURCE_PROTOCOL, False
    carriers = [
        i for i, (kind, text) in enumerate(zip(kinds, texts)) if text and kind in (EventKind.CONTENT, EventKind.REASONING)
    ]
    if final_completion is not None:
        counts = [0] * len(kinds)
        if carriers:
            base, extra = divmod(final_completion, len(carriers))
            for j, i in enumerate(carriers):
                counts[i] = base + (1 if j < extra else 0)
        elif kinds and final_completion > 0:
            counts[-1] = final_completion
        return counts, SOURCE_FINAL_SPREAD, False
    counts = [0] * len(kinds)
    for i in carriers:
        counts[i] = 1
    return counts, SOURCE_CHUNKS, False
