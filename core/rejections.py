"""Requests an engine refused at admission: one error type per way an engine says so.

A request turned away because the engine (or its router) is full never ran, so its latency
says nothing, and a load that causes any is past what the configuration serves: the
capacity rule (analysis/capacity_saturation.py) counts every type here as saturation. Recording (the
adapters and the recorder) and counting (analysis) share these names, so they live here.
Where each comes from (docs/engines.md, "Admission limits"):
"""

from __future__ import annotations

from collections.abc import Mapping

#: TGI's in-stream error past ``--max-concurrent-requests`` (router/src/infer/mod.rs).
OVERLOADED = "overloaded"
#: HTTP 429 on a generation route: TGI's non-streaming answer past its limit, smg's router with
#: its queue full (``--queue-size``), a rate limiter in front of the engine.
HTTP_429 = "http_429"
#: HTTP 503 on a generation route: vLLM past ``--max-num-queued-reqs`` (v1/engine/async_llm.py),
#: SGLang's non-streaming answer past ``--max-queued-requests``.
HTTP_503 = "http_503"
#: A stream the engine ended with status 503 after HTTP 200: SGLang's native ``/generate`` with
#: ``finish_reason {"type": "abort", "status_code": 503}``, its OpenAI routes with an error chunk of
#: ``code`` 503; its waiting queue was full (``--max-queued-requests``; managers/scheduler.py
#: ``_abort_on_queued_limit``).
ABORT_503 = "abort_503"

#: Every admission-rejection error type -> what it means, for a verdict's reason.
ADMISSION_ERRORS: dict[str, str] = {
    OVERLOADED: "TGI answered 'overloaded' (--max-concurrent-requests)",
    HTTP_429: "HTTP 429 (TGI past --max-concurrent-requests, a router's or limiter's queue full)",
    HTTP_503: "HTTP 503 (vLLM past --max-num-queued-reqs, SGLang past --max-queued-requests)",
    ABORT_503: "the stream ended with status 503 (SGLang past --max-queued-requests: the request queue is full)",
}

#: HTTP statuses whose answer is an admission rejection, and the type recorded for each.
_HTTP = {429: HTTP_429, 503: HTTP_503}


def http_error_type(status: int) -> str:
    """The error type of an HTTP error answer: an admission rejection's own type, else ``http_error``."""
    return _HTTP.get(status, "http_error")


def describe_rejections(counts: Mapping[str, int], total: int) -> str:
    """``"5 of 40 requests rejected at admission (3 http_503: HTTP 503 (...); 2 overloaded: ...)"``."""
    shown = {k: n for k, n in counts.items() if n}
    detail = "; ".join(f"{n} {k}: {ADMISSION_ERRORS.get(k, k)}" for k, n in sorted(shown.items()))
    return f"{sum(shown.values())} of {total} requests rejected at admission ({detail})"
