"""Tool definitions sent with chat requests (``--tools N``): the same N functions every time,
so runs compare; each takes a small JSON object, as agents' tools typically do."""

from __future__ import annotations

from typing import Any

_PARAMS: tuple[dict[str, Any], ...] = (
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
     "required": ["city"]},
    {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
     "required": ["query"]},
    {"type": "object", "properties": {"path": {"type": "string"}, "recursive": {"type": "boolean"}},
     "required": ["path"]},
)
_WHAT = ("Look up the weather forecast for a city.", "Search the knowledge base.", "List the files under a path.")

#: the ``tool_choice`` values besides a tool's name
TOOL_CHOICES = ("auto", "required", "none")


def tool_definitions(n: int) -> list[dict[str, Any]]:
    """``n`` OpenAI-style function tools named ``tool_0`` … ``tool_{n-1}``."""
    return [{"type": "function", "function": {"name": f"tool_{i}", "description": _WHAT[i % len(_WHAT)],
                                              "parameters": _PARAMS[i % len(_PARAMS)]}} for i in range(n)]


def tool_choice_field(choice: str | None) -> Any:
    """The body's ``tool_choice``: a mode as is, a tool's name as the named-function object."""
    if choice is None or choice in TOOL_CHOICES:
        return choice
    return {"type": "function", "function": {"name": choice}}
