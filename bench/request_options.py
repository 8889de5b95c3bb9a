"""The request options of ``bench run`` (sampling, natural stops, streaming, extra body), as one decorator.

They fill a ``RequestOptions`` (workloads/spec.py), the same object a workload file's
``[request]`` table becomes; options given here win over the file's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from bench_llm.bench.run_options import option_group
from bench_llm.core.errors import BenchError
from bench_llm.core.limits import MAX_JSON_ARG_BYTES, read_bounded
from bench_llm.core.pairs import split_pairs
from bench_llm.workloads.spec import RequestOptions

_OPTIONS = (
    click.option("--temperature", type=float, help="Sampling temperature sent with every request (0: greedy)."),
    click.option("--top-p", type=float, help="Nucleus sampling: keep the smallest token set with this probability."),
    click.option("--top-k", type=int, help="Sample from the k most likely tokens."),
    click.option("--sampling-seed", type=int, help="Per-request sampling seed (the engine's `seed`)."),
    click.option("--n", "n_choices", type=int, help="Sequences generated per request (OpenAI APIs)."),
    click.option("--stop", "stop", multiple=True, help="Stop sequence (repeatable); requests may then end early."),
    click.option("--logprobs", type=int, help="Return this many top log-probabilities per output token."),
    click.option("--natural-stop", is_flag=True, default=None,
                 help="Let requests end at the model's end-of-sequence token instead of forcing the full length."),
    click.option("--stream/--no-stream", "stream", default=None,
                 help="--no-stream: ask for each answer in one response (E2E only: no TTFT, TPOT or ITL)."),
    click.option("--extra-body", "extra_body", metavar="JSON|@FILE",
                 help="JSON object merged into every request body last (nested objects key by key)."),
    click.option("--json-schema", "json_schema", metavar="JSON|@FILE",
                 help="Structured output: every answer must be JSON fitting this schema."),
    click.option("--regex", help="Structured output: every answer must match this regular expression."),
    click.option("--choice", "choice", multiple=True, help="Structured output: the answer is one of these (repeatable)."),
    click.option("--embeddings", "batch", metavar="N[,N...]",
                 help="Ask for embeddings (POST /v1/embeddings) of N inputs per request; several sizes: each "
                      "request draws one."),
    click.option("--tools", "tools", type=int, metavar="N",
                 help="Chat requests carry N tool definitions; tool calls are counted and timed."),
    click.option("--tool-choice", help="auto, required, none, or a tool's name (tool_0 ...)."),
    click.option("--images", type=int, metavar="N", help="Chat requests carry N locally made PNG images."),
    click.option("--image-size", metavar="WxH", help="Size of each image (default 512x512)."),
    click.option("--model-mix", "models", metavar="NAME=WEIGHT,...",
                 help="Many models / LoRA adapters: each request asks for one, drawn from this weighted mix."),
)


def _request(values: dict[str, Any]) -> RequestOptions:
    return parse_request_options(
        temperature=values.pop("temperature"), top_p=values.pop("top_p"), top_k=values.pop("top_k"),
        seed=values.pop("sampling_seed"), n=values.pop("n_choices"), stop=values.pop("stop"),
        logprobs=values.pop("logprobs"), natural_stop=values.pop("natural_stop"), stream=values.pop("stream"),
        extra_body=values.pop("extra_body"), json_schema=values.pop("json_schema"), regex=values.pop("regex"),
        choice=values.pop("choice"), batch=values.pop("batch"), models=values.pop("models"),
        tools=values.pop("tools"), tool_choice=values.pop("tool_choice"), images=values.pop("images"),
        image_size=values.pop("image_size"),
    )


#: Adds the options to a click command; it receives them as ``request: RequestOptions``.
request_options = option_group("request", _OPTIONS, _request)


def parse_request_options(
    *, extra_body: str | None, stop: tuple[str, ...], json_schema: str | None = None, choice: tuple[str, ...] = (),
    batch: str | None = None, models: str | None = None, **values: Any,
) -> RequestOptions:
    """``RequestOptions`` from the option values; ``BenchError`` (one line) for a bad one."""
    schema = _json_object(json_schema, "--json-schema") if json_schema else None
    try:
        sizes = tuple(int(b) for b in batch.split(",")) if batch else ()
        mix = {p.key: float(p.value or "") for p in split_pairs(models)} if models else {}
    except ValueError as exc:
        raise BenchError(f"--embeddings/--model-mix: {exc}") from None
    try:
        return RequestOptions(stop=tuple(stop), extra_body=_json_object(extra_body, "--extra-body"),
                              json_schema=schema, choice=tuple(choice), batch=sizes,
                              kind="embeddings" if sizes else None, models=mix, **values)
    except ValueError as exc:
        raise BenchError(str(exc)) from None


def _json_object(text: str | None, where: str) -> dict[str, Any]:
    """A JSON object given inline or as ``@file`` (``{}`` for nothing)."""
    if not text:
        return {}
    if text.startswith("@"):
        path = Path(text[1:])
        where = f"{where} {path}"
        try:
            text = read_bounded(path, MAX_JSON_ARG_BYTES).decode("utf-8", "replace")
        except OSError as exc:
            raise BenchError(f"{where}: {exc.strerror or exc}") from None
        except ValueError as exc:  # larger than the bound (/dev/zero)
            raise BenchError(f"{where.split(' ')[0]} {exc}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchError(f"{where}: not JSON ({exc.msg}, line {exc.lineno} column {exc.colno})") from None
    if not isinstance(value, dict):
        raise BenchError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value
