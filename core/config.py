"""TOML configuration into frozen dataclasses. Unknown keys are rejected with their dotted path.

Used by every layer that reads TOML (workloads, sweeps, gates, simulator presets); it
depends on nothing else in bench.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from bench_llm.core.errors import BenchError
from bench_llm.core.limits import MAX_TOML_BYTES, read_bounded

T = TypeVar("T")


class ConfigError(BenchError, ValueError):
    """A configuration problem; the message names the file and dotted key."""


def load_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(read_bounded(path, MAX_TOML_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None
    except ValueError as exc:  # larger than the bound (core.limits)
        raise ConfigError(str(exc)) from None


def from_mapping(cls: type[T], data: Any, path: str = "", source: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; nested dataclasses, lists/tuples, unions handled."""
    where = f"{source}: " if source else ""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}{path or 'top level'}: expected a table, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = f"{path}.{unknown[0]}" if path else unknown[0]
        raise ConfigError(f"{where}unknown key {key!r} (known: {', '.join(sorted(fields))})")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{path}.{name}" if path else name
        kwargs[name] = _convert(hints[name], value, key, source)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where}{path or 'top level'}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{where}{path or 'top level'}: {exc}") from None


def _convert(tp: Any, value: Any, key: str, source: str) -> Any:
    where = f"{source}: " if source else ""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, key, source)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}{key}: invalid value {value!r}")
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}{key}: {value!r} is not one of {', '.join(map(repr, allowed))}")
        return value
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, key, source)  # type: ignore[arg-type]
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{where}{key}: expected a list")
        args = typing.get_args(tp)
        item_tp = args[0] if args else Any
        items = [_convert(item_tp, v, f"{key}[{i}]", source) for i, v in enumerate(value)]
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}{key}: expected a table")
        args = typing.get_args(tp)
        vt = args[1] if len(args) == 2 else Any
        return {k: _convert(vt, v, f"{key}.{k}", source) for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}{key}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}{key}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}{key}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}{key}: expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, str):
            raise ConfigError(f"{where}{key}: expected a path string")
        return Path(value)
    return value


def load(cls: type[T], path: Path, table: str | None = None) -> T:
    data = load_toml(path)
    if table is not None:
        data = data.get(table, {})
    return from_mapping(cls, data, table or "", str(path))
