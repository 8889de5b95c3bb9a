"""Trace readers: Azure CSV, BurstGPT CSV, Mooncake JSONL, length-only CSV, bench JSONL.

Each reader returns a ``TraceTable`` (columns as numpy arrays, in file order) or raises
``WorkloadError`` with one line naming the file, the line number and the field.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.jsonl import file_lines, jsonl_rows, not_utf8
from bench_llm.workloads.spec import MAX_REQUEST_TOKENS

FORMATS = ("azure", "burstgpt", "mooncake", "lengths", "bench", "dataset")

#: Mooncake traces quantise timestamps to 3-second buckets; replay spreads each bucket.
MOONCAKE_BUCKET_S = 3.0
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TraceTable:
    """Requests of a trace file. Optional columns are ``None`` when the format lacks them."""

    path: str
    format: str
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    timestamps_s: np.ndarray | None = None
    hash_ids: tuple[tuple[int, ...], ...] | None = None
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    bucket_s: float = 0.0
    #: bench JSONL extras (one entry per request; ``None`` where absent)
    prompts: tuple[str | None, ...] | None = None
    session_ids: tuple[str | None, ...] | None = None
    turns: tuple[int, ...] | None = None
    think_time_s: tuple[float, ...] | None = None
    prefix_groups: tuple[str | None, ...] | None = None
    dropped: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __len__(self) -> int:
        return int(len(self.input_tokens))


def detect_format(path: Path) -> str:
    """Guess the format from the extension and the first line."""
    if path.suffix.lower() == ".parquet":
        return "dataset"
    first = _first_line(path)
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        if first.lstrip().startswith("["):  # one JSON array: a ShareGPT-style dump
            return "dataset"
        try:
            obj = orjson.loads(first)
        except orjson.JSONDecodeError:
            raise WorkloadError(f"{path}:1: not valid JSON") from None
        if isinstance(obj, dict) and "input_length" in obj:
            return "mooncake"
        from bench_llm.workloads.datasets import looks_like_dataset

        return "dataset" if isinstance(obj, dict) and looks_like_dataset(obj) else "bench"
    header = {h.strip().lower() for h in first.split(",")}
    if "contexttokens" in header:
        return "azure"
    if "request tokens" in header:
        return "burstgpt"
    if header & {"num_prefill_tokens", "input_tokens", "prompt_tokens"}:
        return "lengths"
    raise WorkloadError(
        f"{path}:1: unrecognised trace header {first[:80]!r} "
        "(expected Azure, BurstGPT, Mooncake, length-only CSV or bench JSONL)"
    )


def read_trace(path: str | Path, fmt: str | None = None, **options: Any) -> TraceTable:
    """Read ``path`` in format ``fmt`` (guessed when None)."""
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"{p}: no such trace file")
    fmt = fmt or detect_format(p)
    readers = {
        "azure": read_azure,
        "burstgpt": read_burstgpt,
        "mooncake": read_mooncake,
        "lengths": read_lengths,
        "bench": read_bench_jsonl,
        "dataset": read_dataset_table,
    }
    if fmt not in readers:
        raise WorkloadError(f"trace format {fmt!r}: use one of {', '.join(FORMATS)}")
    allowed = {"burstgpt": {"model", "log_type"}, "mooncake": {"bucket_s", "block_tokens"},
               "dataset": {"output_tokens"}}.get(fmt, set())
    extra = sorted(k for k, v in options.items() if v is not None and k not in allowed)
    if extra:
        raise WorkloadError(f"{p}: option {extra[0]!r} does not apply to the {fmt} format")
    return readers[fmt](p, **{k: v for k, v in options.items() if v is not None})  # type: ignore[operator]


# -- helpers ------------------------------------------------------------------------------
def _first_line(path: Path) -> str:
    with open(path, "rb") as f:
        for raw in file_lines(f, path):
            line = raw.decode("utf-8-sig", "replace")
            if line.strip():
                return line.strip()
    raise WorkloadError(f"{path}: empty file, no requests")


def _int_field(
    path: Path, line: int, name: str, raw: Any, minimum: int = 1, maximum: int = MAX_REQUEST_TOKENS
) -> int:
    if isinstance(raw, bool):
        raise WorkloadError(f"{path}:{line}: field {name!r}: expected an integer, got {raw!r}")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, float) and raw.is_integer():
        value = int(raw)
    elif isinstance(raw, str):
        text = raw.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                f = float(text)
            except ValueError:
                f = math.nan
            if not (math.isfinite(f) and f.is_integer()):
                raise WorkloadError(f"{path}:{line}: field {name!r}: expected an integer, got {raw[:40]!r}") from None
            value = int(f)
    else:
        raise WorkloadError(f"{path}:{line}: field {name!r}: expected an integer, got {str(raw)[:40]!r}")
    if value < minimum:
        raise WorkloadError(f"{path}:{line}: field {name!r}: must be >= {minimum}, got {value}")
    if value > maximum:
        raise WorkloadError(f"{path}:{line}: field {name!r}: {value:,} is more than a request can hold (at most {maximum:,})")
    return value


def _float_field(path: Path, line: int, name: str, raw: Any) -> float:
    if isinstance(raw, bool):
        raise WorkloadError(f"{path}:{line}: field {name!r}: expected a number, got {raw!r}")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise WorkloadError(f"{path}:{line}: field {name!r}: expected a number, got {str(raw)[:40]!r}") from None
    if not math.isfinite(value) or value < 0:
        raise WorkloadError(f"{path}:{line}: field {name!r}: expected a finite number >= 0, got {str(raw)[:40]!r}")
    return value


def _csv_rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, row by lower-cased header) checking every row's field count."""
    try:
        yield from _csv_rows_utf8(path, required)
    except UnicodeDecodeError:
        raise not_utf8(path) from None


def _csv_checked(reader: Any, path: Path) -> Iterator[list[str]]:
    """The rows of ``reader``; its complaint (a field past csv's limit of 128 Ki characters,
    a malformed quote) as a ``WorkloadError`` naming the line."""
    try:
        yield from reader
    except csv.Error as exc:
        raise WorkloadError(f"{path}:{reader.line_num}: {exc}") from None


def _csv_rows_utf8(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    with open(path, "rb") as f:
        # lines within the bound (``file_lines``), decoded as UTF-8 (a byte-order mark dropped)
        text = (raw.decode("utf-8-sig" if i == 0 else "utf-8") for i, raw in enumerate(file_lines(f, path)))
        reader = csv.reader(text)
        header: list[str] | None = None
        for row in _csv_checked(reader, path):
            line = reader.line_num
            if header is None:
                if not row or not any(c.strip() for c in row):
                    continue
                header = [h.strip().lower() for h in row]
                missing = [c for c in required if c not in header]
                if missing:
                    raise WorkloadError(f"{path}:{line}: header lacks column {missing[0]!r} (found: {', '.join(header)})")
                continue
            if not row:
                continue
            if len(row) != len(header):
                raise WorkloadError(
                    f"{path}:{line}: expected {len(header)} fields, found {len(row)} (truncated or malformed line)"
                )
            yield line, dict(zip(header, row))
        if header is None:
            raise WorkloadError(f"{path}: empty file, no header and no requests")


def _finish(path: Path, fmt: str, inputs: list[int], outputs: list[int], **kw: Any) -> TraceTable:
    if not inputs:
        raise WorkloadError(f"{path}: no requests in the file")
    ts = kw.pop("timestamps_s", None)
    return TraceTable(
        path=str(path),
        format=fmt,
        input_tokens=np.asarray(inputs, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        timestamps_s=None if ts is None else np.asarray(ts, dtype=float),
        **kw,
    )


# -- readers -------------------------------------------------------------------------------
def read_azure(path: Path) -> TraceTable:
    """Azure LLM inference CSV: ``TIMESTAMP, ContextTokens, GeneratedTokens`` (2023/2024/2025)."""
    inputs: list[int] = []
    outputs: list[int] = []
    stamps: list[float] = []
    for line, row in _csv_rows(path, ("timestamp", "contexttokens", "generatedtokens")):
        raw_ts = row["timestamp"].strip()
        try:
            t = dt.datetime.fromisoformat(raw_ts)
        except ValueError:
            raise WorkloadError(f"{path}:{line}: field 'TIMESTAMP': not a date-time, got {raw_ts[:40]!r}") from None
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.timezone.utc)
        stamps.append(t.timestamp())
        inputs.append(_int_field(path, line, "ContextTokens", row["contexttokens"]))
        outputs.append(_int_field(path, line, "GeneratedTokens", row["generatedtokens"]))
    if stamps:
        t0 = min(stamps)
        stamps = [s - t0 for s in stamps]
    return _finish(path, "azure", inputs, outputs, timestamps_s=stamps)


def read_burstgpt(path: Path, model: str | None = None, log_type: str | None = None) -> TraceTable:
    """BurstGPT CSV. Rows with ``Response tokens == 0`` (failed requests) are dropped and counted.

    ``model`` / ``log_type`` keep only rows whose ``Model`` / ``Log Type`` match.
    """
    inputs: list[int] = []
    outputs: list[int] = []
    stamps: list[float] = []
    sessions: list[str | None] = []
    dropped = 0
    for line, row in _csv_rows(path, ("timestamp", "model", "request tokens", "response tokens", "log type")):
        ts = _float_field(path, line, "Timestamp", row["timestamp"])
        req = _int_field(path, line, "Request tokens", row["request tokens"], minimum=0)
        resp = _int_field(path, line, "Response tokens", row["response tokens"], minimum=0)
        if model is not None and row["model"].strip() != model:
            continue
        if log_type is not None and row["log type"].strip() != log_type:
            continue
        if resp == 0 or req == 0:
            dropped += 1
            continue
        stamps.append(ts)
        inputs.append(req)
        outputs.append(resp)
        sid = row.get("session id")
        sessions.append(sid.strip() if sid else None)
    if stamps:
        t0 = min(stamps)
        stamps = [s - t0 for s in stamps]
    notes = (f"dropped {dropped} failed rows (Response tokens = 0)",) if dropped else ()
    return _finish(path, "burstgpt", inputs, outputs, timestamps_s=stamps, dropped=dropped, notes=notes)


def _need(path: Path, line: int, obj: dict[str, Any], name: str) -> Any:
    if name not in obj:
        raise WorkloadError(f"{path}:{line}: field {name!r} is missing")
    return obj[name]


def read_mooncake(
    path: Path, bucket_s: float = MOONCAKE_BUCKET_S, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> TraceTable:
    """Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``."""
    inputs: list[int] = []
    outputs: list[int] = []
    stamps: list[float] = []
    hashes: list[tuple[int, ...]] = []
    for line, obj in jsonl_rows(path):
        stamps.append(_float_field(path, line, "timestamp", _need(path, line, obj, "timestamp")) / 1000.0)
        n_in = _int_field(path, line, "input_length", _need(path, line, obj, "input_length"))
        inputs.append(n_in)
        outputs.append(_int_field(path, line, "output_length", _need(path, line, obj, "output_length")))
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise WorkloadError(f"{path}:{line}: field 'hash_ids': expected a list of integers")
        if ids and len(ids) != math.ceil(n_in / block_tokens):
            raise WorkloadError(
                f"{path}:{line}: field 'hash_ids': {len(ids)} blocks do not cover input_length {n_in} "
                f"in {block_tokens}-token blocks"
            )
        hashes.append(tuple(ids))
    has_hashes = any(hashes)
    if stamps:
        t0 = min(stamps)
        stamps = [s - t0 for s in stamps]
    return _finish(
        path,
        "mooncake",
        inputs,
        outputs,
        timestamps_s=stamps,
        hash_ids=tuple(hashes) if has_hashes else None,
        block_tokens=block_tokens,
        bucket_s=bucket_s,
    )


_INPUT_COLS = ("num_prefill_tokens", "input_tokens", "prompt_tokens")
_OUTPUT_COLS = ("num_decode_tokens", "output_tokens", "completion_tokens")
_TIME_COLS = ("arrived_at", "timestamp_s", "offset_s")


def read_lengths(path: Path) -> TraceTable:
    """Length-only CSV (Vidur/Sarathi ``num_prefill_tokens, num_decode_tokens[, arrived_at]``)."""
    inputs: list[int] = []
    outputs: list[int] = []
    stamps: list[float] = []
    cols: tuple[str, str, str | None] | None = None
    for line, row in _csv_rows(path, ()):
        if cols is None:
            cin = next((c for c in _INPUT_COLS if c in row), None)
            cout = next((c for c in _OUTPUT_COLS if c in row), None)
            if cin is None or cout is None:
                raise WorkloadError(
                    f"{path}:1: header needs an input column ({'/'.join(_INPUT_COLS)}) "
                    f"and an output column ({'/'.join(_OUTPUT_COLS)})"
                )
            cols = (cin, cout, next((c for c in _TIME_COLS if c in row), None))
        cin, cout, ct = cols
        inputs.append(_int_field(path, line, cin, row[cin]))
        outputs.append(_int_field(path, line, cout, row[cout]))
        if ct is not None:
            stamps.append(_float_field(path, line, ct, row[ct]))
    has_t = cols is not None and cols[2] is not None
    return _finish(path, "lengths", inputs, outputs, timestamps_s=stamps if has_t else None)


_BENCH_KEYS = {
    "input_tokens",
    "output_tokens",
    "offset_s",
    "prompt",
    "session_id",
    "turn",
    "think_time_s",
    "prefix_group",
    "request_id",
}


def read_bench_jsonl(path: Path) -> TraceTable:
    """bench's own JSONL request format (one object per line, see docs/workloads.md)."""
    inputs: list[int] = []
    outputs: list[int] = []
    stamps: list[float] = []
    prompts: list[str | None] = []
    sessions: list[str | None] = []
    turns: list[int] = []
    thinks: list[float] = []
    groups: list[str | None] = []
    lines: list[int] = []
    n_offsets = 0
    for line, obj in jsonl_rows(path):
        lines.append(line)
        unknown = sorted(set(obj) - _BENCH_KEYS)
        if unknown:
            raise WorkloadError(f"{path}:{line}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_BENCH_KEYS))})")
        prompt = obj.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise WorkloadError(f"{path}:{line}: field 'prompt': expected a string")
        if "input_tokens" in obj or prompt is None:
            inputs.append(_int_field(path, line, "input_tokens", _need(path, line, obj, "input_tokens")))
        else:
            from bench_llm.core.tokenizer import count_tokens

            inputs.append(max(1, count_tokens(prompt)))
        outputs.append(_int_field(path, line, "output_tokens", _need(path, line, obj, "output_tokens")))
        if "offset_s" in obj:
            n_offsets += 1
            stamps.append(_float_field(path, line, "offset_s", obj["offset_s"]))
        else:
            stamps.append(math.nan)
        prompts.append(prompt)
        sid = obj.get("session_id")
        sessions.append(None if sid is None else str(sid))
        turns.append(_int_field(path, line, "turn", obj.get("turn", 0), minimum=0))
        thinks.append(_float_field(path, line, "think_time_s", obj.get("think_time_s", 0.0)))
        grp = obj.get("prefix_group")
        groups.append(None if grp is None else str(grp))
    if 0 < n_offsets < len(stamps):
        first_missing = next(i for i, s in enumerate(stamps) if math.isnan(s))
        raise WorkloadError(
            f"{path}:{lines[first_missing]}: field 'offset_s' is missing (give it on every line or none)"
        )
    return _finish(
        path,
        "bench",
        inputs,
        outputs,
        timestamps_s=stamps if n_offsets else None,
        prompts=tuple(prompts) if any(p is not None for p in prompts) else None,
        session_ids=tuple(sessions) if any(s is not None for s in sessions) else None,
        turns=tuple(turns),
        think_time_s=tuple(thinks),
        prefix_groups=tuple(groups) if any(g is not None for g in groups) else None,
    )


def read_dataset_table(path: Path, output_tokens: int | None = None) -> TraceTable:
    """A local prompt dataset (workloads/datasets.py) as a table without send times."""
    from bench_llm.workloads.datasets import read_dataset

    prompts, inputs, outputs = read_dataset(path, output_tokens)
    return _finish(path, "dataset", inputs, outputs, prompts=tuple(prompts))
