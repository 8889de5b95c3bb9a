"""Whether an answer fits its structured-output constraint (docs/metrics.md, Structured output).

The client's own check, written apart from the simulated engine's generator (sim/structured.py)
so a bug in one cannot hide the same bug in the other. A JSON schema is checked for the
keywords below; any other keyword is not checked (a ``$ref``, ``oneOf`` … passes unexamined):
type, enum, const, properties, required, additionalProperties, items, minItems, maxItems,
minLength, maxLength, pattern, minimum, maximum, anyOf.
"""

from __future__ import annotations

import json
import re
from typing import Any

from bench_llm.workloads.spec import Constraint

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,), "null": (type(None),),
    "integer": (int,), "number": (int, float),
}


def conforms(constraint: Constraint, text: str) -> bool:
    """True when ``text`` (the whole answer) satisfies ``constraint``."""
    if constraint.json_schema is not None:
        try:
            value = json.loads(text)
        except ValueError:
            return False
        return fits_schema(value, constraint.schema())
    if constraint.regex is not None:
        return re.fullmatch(constraint.regex, text) is not None
    return text in constraint.choice


def fits_schema(value: Any, schema: dict[str, Any]) -> bool:
    """``value`` against the supported keywords of ``schema`` (the module docstring lists them)."""
    if not isinstance(schema, dict):
        return True
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_is(value, k) for k in kinds):
            return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "const" in schema and value != schema["const"]:
        return False
    if "anyOf" in schema and not any(fits_schema(value, s) for s in schema["anyOf"]):
        return False
    if isinstance(value, dict):
        return _fits_object(value, schema)
    if isinstance(value, list):
        items = schema.get("items")
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            return False
        return not isinstance(items, dict) or all(fits_schema(v, items) for v in value)
    if isinstance(value, str):
        pattern = schema.get("pattern")
        return (schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value))
                and (pattern is None or re.search(pattern, value) is not None))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return schema.get("minimum", value) <= value <= schema.get("maximum", value)
    return True


def _fits_object(value: dict[str, Any], schema: dict[str, Any]) -> bool:
    props = schema.get("properties") or {}
    if any(name not in value for name in schema.get("required", ())):
        return False
    extra = schema.get("additionalProperties", True)
    for name, v in value.items():
        if name in props:
            if not fits_schema(v, props[name]):
                return False
        elif extra is False or (isinstance(extra, dict) and not fits_schema(v, extra)):
            return False
    return True


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES.get(kind, (object,)))
