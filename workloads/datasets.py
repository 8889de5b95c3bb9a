"""Local prompt datasets: ShareGPT-style JSON, JSONL of prompts, and Hugging Face ``datasets``
saved to Parquet or JSON (``Dataset.to_parquet`` / ``to_json``). Local files only: nothing is
fetched. A dataset has prompts, not send times; ``plan_workload`` draws a seeded sample of
its rows (the same seed, the same sample).

Each row gives a prompt and, where it can, an output length:

- ``conversations`` (ShareGPT: ``from``/``value``, or ``role``/``content``) or ``messages``:
  the first user turn is the prompt; the reply after it gives the output length.
- ``prompt``, ``text``, ``instruction`` or ``question``: the prompt; ``output_tokens`` (an
  integer), or the token count of ``completion``, ``response``, ``output`` or ``answer``,
  gives the output length.

Rows without an output length take ``output_tokens`` (``--output-tokens``); rows without a
prompt, or conversations with no reply, are errors naming the file and the line or row.
Token counts of text are the simulated engine's word count (an approximation; the prompt's
source is recorded as ``given``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from bench_llm.core.limits import MAX_JSON_FILE_BYTES, read_bounded
from bench_llm.workloads.errors import WorkloadError

PROMPT_FIELDS = ("prompt", "text", "instruction", "question")
ANSWER_FIELDS = ("completion", "response", "output", "answer")
CONVERSATION_FIELDS = ("conversations", "conversation", "messages")
_USER = ("human", "user")


def looks_like_dataset(first: dict[str, Any]) -> bool:
    """Whether a JSON object reads as a dataset row rather than a bench JSONL request."""
    if any(k in first for k in ("input_tokens", "output_tokens", "offset_s")):
        return False  # bench JSONL (which also takes a "prompt")
    return any(k in first for k in (*CONVERSATION_FIELDS, *PROMPT_FIELDS))


def dataset_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) of a local dataset file; ``where`` names the file and the line or row."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for a bad file
            raise WorkloadError(f"{path}: not a readable Parquet file ({type(exc).__name__})") from None
        yield from ((f"{path}: row {i}", row) for i, row in enumerate(rows))
        return
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    if head.startswith(b"["):  # one JSON array (ShareGPT dumps)
        try:
            items = orjson.loads(read_bounded(path, MAX_JSON_FILE_BYTES))
        except orjson.JSONDecodeError as exc:
            raise WorkloadError(f"{path}: not valid JSON ({exc})") from None
        except ValueError as exc:  # larger than the bound (core.limits)
            raise WorkloadError(str(exc)) from None
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise WorkloadError(f"{path}: item {i}: expected a JSON object, got {type(item).__name__}")
            yield f"{path}: item {i}", item
        return
    from bench_llm.workloads.jsonl import jsonl_rows

    yield from ((f"{path}:{line}", obj) for line, obj in jsonl_rows(path))


def row_request(where: str, row: dict[str, Any]) -> tuple[str, str | None]:
    """(prompt, reference answer or None) of one row; ``WorkloadError`` naming ``where``."""
    for name in CONVERSATION_FIELDS:
        if name in row:
            return _conversation(where, name, row[name])
    for name in PROMPT_FIELDS:
        if isinstance(row.get(name), str) and row[name]:
            answer = next((row[a] for a in ANSWER_FIELDS if isinstance(row.get(a), str) and row[a]), None)
            return row[name], answer
    known = ", ".join((*CONVERSATION_FIELDS, *PROMPT_FIELDS))
    raise WorkloadError(f"{where}: no prompt (expected a non-empty string field, one of: {known})")


def _conversation(where: str, name: str, turns: Any) -> tuple[str, str | None]:
    if not isinstance(turns, list):
        raise WorkloadError(f"{where}: field {name!r}: expected a list of turns")
    texts: list[tuple[str, str]] = []
    for t in turns:
        if not isinstance(t, dict):
            raise WorkloadError(f"{where}: field {name!r}: each turn must be an object")
        role = str(t.get("from", t.get("role", "")))
        text = t.get("value", t.get("content"))
        if not isinstance(text, str):
            raise WorkloadError(f"{where}: field {name!r}: a turn has no text ('value' or 'content')")
        texts.append((role, text))
    for i, (role, text) in enumerate(texts):
        if role in _USER and text:
            reply = texts[i + 1][1] if i + 1 < len(texts) else None
            return text, reply or None
    raise WorkloadError(f"{where}: field {name!r}: no user turn")


def read_dataset(path: Path, output_tokens: int | None = None) -> tuple[list[str], list[int], list[int]]:
    """(prompts, input token counts, output token counts) of every row, in file order."""
    from bench_llm.core.tokenizer import count_tokens

    prompts: list[str] = []
    inputs: list[int] = []
    outputs: list[int] = []
    for where, row in dataset_rows(path):
        prompt, answer = row_request(where, row)
        given = row.get("output_tokens")
        if given is not None:
            if isinstance(given, bool) or not isinstance(given, int) or given < 1:
                raise WorkloadError(f"{where}: field 'output_tokens': expected a positive integer, got {given!r}")
            n_out = given
        elif answer is not None:
            n_out = max(1, count_tokens(answer))
        elif output_tokens is not None:
            n_out = output_tokens
        else:
            raise WorkloadError(f"{where}: no output length (no reply, no 'output_tokens'): give $output_tokens")
        prompts.append(prompt)
        inputs.append(max(1, count_tokens(prompt)))
        outputs.append(n_out)
    return prompts, inputs, outputs
