"""Structured output in the simulated engine: the constraint a request body carries, in each
flavour's fields, and an answer that fits it.

Written apart from the client's check (workloads/structured.py): the engine only needs *one*
conforming answer, so it builds the smallest simple one (every property of an object, the
minimum of a number, the shortest repetition of a regex), then sends it in pieces of
``CHARS_PER_TOKEN`` characters, one piece per output token.
"""

from __future__ import annotations

import json
import re
from typing import Any

from bench_llm.core.errors import BenchError

try:  # the regex parser's module: re._parser from Python 3.11, sre_parse before
    from re import _parser as _sre  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_parse as _sre  # type: ignore[no-redef]

#: characters of a structured answer per output token (JSON tokenises at about 3)
CHARS_PER_TOKEN = 3


class Unsupported(BenchError, ValueError):
    """A constraint the simulated engine cannot produce an answer for (answered 400)."""


def openai_constraint(body: dict[str, Any]) -> tuple[str, Any] | None:
    """(kind, value) from a vLLM/SGLang OpenAI body: ``structured_outputs`` {json, regex, choice},
    ``response_format`` json_schema / json_object, or SGLang's top-level ``regex``."""
    so = body.get("structured_outputs")
    if isinstance(so, dict):
        for kind in ("json", "regex", "choice"):
            if so.get(kind) is not None:
                return kind, so[kind]
    rf = body.get("response_format")
    if isinstance(rf, dict):
        if rf.get("type") == "json_schema":
            return "json", (rf.get("json_schema") or {}).get("schema") or {}
        if rf.get("type") == "json_object":
            return "json", {"type": "object"}
    if isinstance(body.get("regex"), str):
        return "regex", body["regex"]
    return None


def sglang_constraint(params: dict[str, Any]) -> tuple[str, Any] | None:
    """(kind, value) from SGLang's native ``sampling_params`` (``json_schema`` is JSON text)."""
    if isinstance(params.get("json_schema"), str):
        try:
            return "json", json.loads(params["json_schema"])
        except ValueError:
            raise Unsupported("json_schema is not valid JSON") from None
    if isinstance(params.get("regex"), str):
        return "regex", params["regex"]
    return None


def tgi_constraint(params: dict[str, Any]) -> tuple[str, Any] | None:
    """(kind, value) from TGI's ``parameters.grammar`` ({type: json|regex, value})."""
    grammar = params.get("grammar")
    if not isinstance(grammar, dict):
        return None
    kind = grammar.get("type")
    if kind not in ("json", "regex"):
        raise Unsupported(f"grammar type {kind!r} (json or regex)")
    value = grammar.get("value")
    if kind == "json" and isinstance(value, str):
        value = json.loads(value)
    return kind, value


def answer(constraint: tuple[str, Any], seed: int) -> str:
    """A text that fits ``constraint``; ``Unsupported`` for what the sim cannot build."""
    kind, value = constraint
    if kind == "json":
        if not isinstance(value, dict):
            raise Unsupported("the JSON schema must be an object")
        return json.dumps(_instance(value, 0), separators=(", ", ": "))
    if kind == "choice":
        if not isinstance(value, list) or not value:
            raise Unsupported("choice must be a non-empty list")
        return str(value[seed % len(value)])
    try:
        parsed = _sre.parse(str(value))
    except re.error as exc:
        raise Unsupported(f"regex: {exc}") from None
    return _from_regex(list(parsed))


def pieces(text: str) -> list[str]:
    """The answer as the output tokens that carry it."""
    return [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)] or [""]


def _instance(schema: dict[str, Any], depth: int) -> Any:
    if depth > 8:
        raise Unsupported("JSON schema nested deeper than 8 levels")
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if schema.get("anyOf"):
        return _instance(schema["anyOf"][0], depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: _instance(sub, depth + 1) for name, sub in props.items()}
    if kind == "array":
        item = schema.get("items") or {"type": "string"}
        return [_instance(item, depth + 1) for _ in range(max(1, int(schema.get("minItems", 1))))]
    if kind == "integer":
        return int(schema.get("minimum", 0))
    if kind == "number":
        return float(schema.get("minimum", 0.5))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if kind == "string":
        if "pattern" in schema:
            return _from_regex(list(_sre.parse(schema["pattern"])))
        return "x" * max(1, int(schema.get("minLength", 1)))
    raise Unsupported(f"JSON schema type {kind!r}")


def _from_regex(items: list[Any]) -> str:
    out = []
    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(av))
        elif name == "ANY":
            out.append("a")
        elif name == "IN":
            out.append(_from_set(av))
        elif name == "NOT_LITERAL":
            out.append("a" if av != ord("a") else "b")
        elif name == "BRANCH":
            out.append(_from_regex(list(av[1][0])))
        elif name == "SUBPATTERN":
            out.append(_from_regex(list(av[-1])))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = av
            count = max(low, 1) if high != 0 else 0
            out.append(_from_regex(list(sub)) * count)
        elif name == "AT":
            continue
        elif name == "CATEGORY":
            out.append(_category(str(av)))
        else:
            raise Unsupported(f"regex construct {name}")
    return "".join(out)


def _from_set(items: list[Any]) -> str:
    for op, av in items:
        name = str(op)
        if name == "NEGATE":
            raise Unsupported("negated character sets")
        if name == "LITERAL":
            return chr(av)
        if name == "RANGE":
            return chr(av[0])
        if name == "CATEGORY":
            return _category(str(av))
    raise Unsupported("empty character set")


def _category(name: str) -> str:
    if name == "CATEGORY_DIGIT":
        return "7"
    if name == "CATEGORY_SPACE":
        return " "
    if name == "CATEGORY_WORD":
        return "a"
    raise Unsupported(f"regex category {name}")
