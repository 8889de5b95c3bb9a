"""Where each engine states the context length it serves, and how to read the answer.

No I/O here (bench asks, ``bench/execute.py``): a route and a small parser of its JSON
answer. Which routes an engine has, in the order to try them, is its profile's
(``launch/profiles.py``, ``ControlRoutes.context``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ContextRoute:
    path: str
    #: (JSON answer, served model name) -> context length in tokens, or None
    parse: Callable[[Any, str], int | None]
    #: what the figure is called there, for the run's notes
    label: str


def _positive_int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def openai_models_max_model_len(obj: Any, model: str) -> int | None:
    """vLLM (and SGLang) ``GET /v1/models``: ``data[].max_model_len`` of the served model
    (the only model when the name does not match one)."""
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        return None
    cards = [c for c in data if isinstance(c, dict)]
    mine = [c for c in cards if c.get("id") == model] or (cards if len(cards) == 1 else [])
    return _positive_int(mine[0].get("max_model_len")) if mine else None


def sglang_server_info_context_length(obj: Any, model: str) -> int | None:
    """SGLang ``GET /get_server_info``: ``context_length`` (the server argument, when set)."""
    return _positive_int(obj.get("context_length")) if isinstance(obj, dict) else None


def tgi_info_max_total_tokens(obj: Any, model: str) -> int | None:
    """TGI ``GET /info``: ``max_total_tokens`` (prompt plus generated tokens per request)."""
    return _positive_int(obj.get("max_total_tokens")) if isinstance(obj, dict) else None
