"""The one rule for secrets in text bench writes or prints: credentials in a URL
(``http://user:password@host``) become ``http://***@host``.

Every file, line, report and log bench writes passes its URL-bearing text through ``redact``
(``results.writer`` for a run's metadata, the sweep's store, the recorder's error messages,
the CLI's error lines). API keys never reach text at all (``bench.secrets``), and neither does
the value of an environment variable whose name says it is a secret (``secret_name``): such a
value is read from bench's own environment when an engine starts, never given on a command line
or stored in a sweep's definition.
"""

from __future__ import annotations

import re
from typing import Any

#: ``scheme://userinfo@``: the userinfo is everything up to the last ``@`` before the host
#: part ends (a password may hold ``@``, ``:`` or ``#``; a path, whitespace or a quote ends it),
#: but not an ``@GPUS`` suffix (``bench sweep --url NAME=URL@2``).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?\s\"'<>]*@(?!\d+(?:[\s/\"'<>,;]|\Z))")


#: Environment variable names that hold secrets (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, …).
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL", re.IGNORECASE)


def secret_name(name: str) -> bool:
    """Whether an environment variable of this name holds a secret (its value is never shown)."""
    return _SECRET_NAME.search(name) is not None


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``."""
    if "@" not in text:  # the common case costs one scan
        return text
    return _USERINFO.sub(r"\1***@", text)


def redact_value(value: Any) -> Any:
    """``value`` with every string in it (nested in dicts, lists and tuples) redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value
