"""The request options of ``bench run`` (sampling, natural stops, streaming, extra body), as one decorator.

They fill a ``RequestOptions`` (workloads/spec.py), the same object a workload file's
``[request]`` table becomes; options given here win over the file's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from bench.run_options import option_group
from core.errors import BenchError
from workloads.spec import RequestOptions

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
)


def _request(values: dict[str, Any]) -> RequestOptions:
    return parse_request_options(
        temperature=values.pop("temperature"), top_p=values.pop("top_p"), top_k=values.pop("top_k"),
        seed=values.pop("sampling_seed"), n=values.pop("n_choices"), stop=values.pop("stop"),
        logprobs=values.pop("logprobs"), natural_stop=values.pop("natural_stop"), stream=values.pop("stream"),
        extra_body=values.pop("extra_body"),
    )


#: Adds the options to a click command; it receives them as ``request: RequestOptions``.
request_options = option_group("request", _OPTIONS, _request)


def parse_request_options(*, extra_body: str | None, stop: tuple[str, ...], **values: Any) -> RequestOptions:
    """``RequestOptions`` from the option values; ``BenchError`` (one line) for a bad one."""
    try:
        return RequestOptions(stop=tuple(stop), extra_body=_extra_body(extra_body), **values)
    except ValueError as exc:
        raise BenchError(str(exc)) from None


def _extra_body(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    where = "--extra-body"
    if text.startswith("@"):
        path = Path(text[1:])
        where = f"--extra-body {path}"
        try:
            text = path.read_text()
        except OSError as exc:
            raise BenchError(f"{where}: {exc.strerror or exc}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchError(f"{where}: not JSON ({exc.msg}, line {exc.lineno} column {exc.colno})") from None
    if not isinstance(value, dict):
        raise BenchError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value
