"""One client for an engine's control routes: health, version, metrics, tokenize, resets.

Blocking (urllib), for start-up, set-up and monitoring threads; never on the measured
request path, which loadgen's transports own. Like them it ignores the environment's
proxy settings: an ambient ``http_proxy`` must not capture loopback traffic. A call never
raises for a refused, failed or non-2xx answer: it returns a ``Reply`` saying what came.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench_llm.core.errors import BenchError
from bench_llm.core.limits import MAX_CONTROL_BYTES, MAX_METRICS_BYTES, human_bytes

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ControlError(BenchError, ValueError):
    """An engine answered a control call with something unusable; the message is one line."""


@dataclass(frozen=True, slots=True)
class Reply:
    """What a control call got: an HTTP status and body, or why there was no answer."""

    status: int | None  # None: no HTTP answer (refused, reset, timed out, larger than the bound)
    body: bytes = b""
    reason: str = ""
    #: The answer was longer than the call's bound (``max_bytes``) and was not read whole.
    too_large: bool = False

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def problem(self) -> str:
        """``HTTP 503``, or why no answer came (for a one-line message)."""
        return f"HTTP {self.status}" if self.status is not None else self.reason

    def json(self) -> Any:
        """The body as JSON; raises ValueError when it is not."""
        return json.loads(self.body)


def call(url: str, method: str = "GET", body: bytes | None = None,
         headers: Mapping[str, str] | None = None, timeout_s: float = 5.0,
         max_bytes: int = MAX_CONTROL_BYTES) -> Reply:  # fmt: skip
    """One HTTP call to a full ``url``; never raises for a transport failure. A body longer
    than ``max_bytes`` is not read past the bound: the reply has no status and says so.
    Credentials in the URL (``http://user:pw@host``) are sent as HTTP Basic authentication."""
    url, auth = _credentials(url)
    headers = {**auth, **(headers or {})}
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            data = resp.read(max_bytes + 1)
            if len(data) > max_bytes:
                return Reply(None, reason=f"an answer larger than {human_bytes(max_bytes)}, the bound; not read further",
                             too_large=True)  # fmt: skip
            return Reply(resp.status, data)
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, _error_body(exc))
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        return Reply(None, reason=str(getattr(exc, "reason", exc)) or type(exc).__name__)


def _credentials(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without its credentials, and the Basic authentication header they make."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return url, {}
    import base64

    pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}".encode()
    bare = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return bare, {"Authorization": "Basic " + base64.b64encode(pair).decode()}


def _error_body(exc: urllib.error.HTTPError) -> bytes:
    try:
        return exc.read(64 << 10)
    except (OSError, http.client.HTTPException):
        return b""


class EngineClient:
    """The control routes of the engine at ``base_url`` (``http://host:port``)."""

    def __init__(self, base_url: str, timeout_s: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        #: the /tokenize body's text field: "prompt" (vLLM, SGLang), "inputs" once TGI says so
        self._tokenize_field = "prompt"

    def get(self, path: str, timeout_s: float | None = None, max_bytes: int = MAX_CONTROL_BYTES) -> Reply:
        return call(self.base_url + path, timeout_s=self._timeout(timeout_s), max_bytes=max_bytes)

    def post(self, path: str, payload: Mapping[str, object] | None = None, timeout_s: float | None = None) -> Reply:
        """POST ``payload`` as JSON (an empty body without one)."""
        if payload is None:
            return call(self.base_url + path, "POST", b"", timeout_s=self._timeout(timeout_s))
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        return call(self.base_url + path, "POST", body, headers, self._timeout(timeout_s))

    def health(self, timeout_s: float | None = None) -> Reply:
        return self.get("/health", timeout_s)

    def metrics(self, path: str = "/metrics", timeout_s: float | None = None) -> Reply:
        """The /metrics page, at most ``MAX_METRICS_BYTES`` of it (``Reply.too_large`` past that)."""
        return self.get(path, timeout_s, MAX_METRICS_BYTES)

    def get_json(self, path: str, timeout_s: float | None = None) -> Any:
        """The JSON a 2xx answer at ``path`` carries; None when there is no such answer."""
        reply = self.get(path, timeout_s)
        if not reply.ok:
            return None
        try:
            return reply.json()
        except ValueError:
            return None

    def version(self, routes: Sequence[tuple[str, str]]) -> str | None:
        """The first non-empty ``key`` of a JSON object served at one of the ``routes``
        (``(path, key)`` pairs tried in order); None when none gives one."""
        for path, key in routes:
            obj = self.get_json(path)
            value = obj.get(key) if isinstance(obj, dict) else None
            if value:
                return str(value)
        return None

    def count_tokens(self, text: str, model: str | None = None, timeout_s: float | None = None) -> int:
        """Tokens the engine's ``/tokenize`` counts in ``text`` (vLLM, SGLang and the
        simulated engine reply with ``count``, ``tokens`` or a bare list). vLLM and SGLang take
        ``{"prompt": ...}``; TGI takes ``{"inputs": ...}`` (router/src/server.rs ``tokenize``, a
        ``GenerateRequest``) and answers a list of tokens: a refusal of ``prompt``, or no token
        for a non-empty text, is asked again with ``inputs``, which this client then keeps."""
        field = self._tokenize_field
        try:
            n = self._count(field, text, model, timeout_s)
        except ControlError as exc:
            if field != "prompt":
                raise
            first: ControlError | None = exc
            n = 0
        else:
            first = None
        if field == "prompt" and (first is not None or (n == 0 and text.strip())):
            try:
                other = self._count("inputs", text, None, timeout_s)
            except ControlError:
                other = None
            if other is not None and (other > 0 or not text.strip()):
                self._tokenize_field = "inputs"
                return other
            if first is not None:
                raise first
        return n

    def _count(self, field: str, text: str, model: str | None, timeout_s: float | None) -> int:
        payload: dict[str, object] = {field: text}
        if model and field == "prompt":
            payload["model"] = model
        where = f"{self.base_url}/tokenize"
        reply = self.post("/tokenize", payload, timeout_s)
        if not reply.ok:
            raise ControlError(f"{where}: {reply.problem()[:120]}")
        try:
            data = reply.json()
        except ValueError as exc:
            raise ControlError(f"{where}: not JSON ({str(exc)[:80]})") from None
        if isinstance(data, list):
            return len(data)
        if isinstance(data, dict):
            if isinstance(data.get("count"), int):
                return int(data["count"])
            if isinstance(data.get("tokens"), list):
                return len(data["tokens"])
        raise ControlError(f"{where}: unexpected reply {str(data)[:80]!r}")

    def _timeout(self, timeout_s: float | None) -> float:
        return self.timeout_s if timeout_s is None else timeout_s
