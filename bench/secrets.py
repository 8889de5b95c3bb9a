"""API keys: from the environment or a file, never from argv, never written anywhere (a URL's
credentials are redacted wherever bench writes text: ``core.redact``)."""

from __future__ import annotations

import os
from pathlib import Path

from bench_llm.core.errors import BenchError


def load_api_key(env_var: str | None, key_file: Path | None) -> str | None:
    if key_file is not None:
        try:
            key = key_file.read_text().strip()
        except OSError as exc:
            raise BenchError(f"cannot read API key file {key_file}: {exc.strerror}") from None
        if not key:
            raise BenchError(f"API key file {key_file} is empty")
        return key
    if env_var:
        return os.environ.get(env_var) or None
    return None

