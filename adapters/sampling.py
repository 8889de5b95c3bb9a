"""Sampling parameters in each engine's request body, refused by name where an engine lacks one.

One home for the field names: vLLM's OpenAI server (and SGLang's, and other OpenAI-compatible
servers), SGLang's native ``/generate`` and TGI's ``/generate_stream`` spell the same
parameters differently, and a few have no equivalent.
"""

from __future__ import annotations

from typing import Any

from bench_llm.core.errors import SettingError
from bench_llm.workloads.images import data_url
from bench_llm.workloads.spec import Constraint, RequestSpec, Sampling


class UnsupportedRequest(SettingError):
    """A request asks for something the engine's API cannot express (settings named as ``$name``)."""


def openai_fields(s: Sampling, chat: bool) -> dict[str, Any]:
    """Top-level fields of an OpenAI completions/chat body (``top_k`` is a vLLM/SGLang extension)."""
    out: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k", "seed", "n"):
        value = getattr(s, name)
        if value is not None:
            out[name] = value
    if s.stop:
        out["stop"] = list(s.stop)
    if s.logprobs is not None:
        if chat:
            out["logprobs"] = True
            out["top_logprobs"] = s.logprobs
        else:
            out["logprobs"] = s.logprobs
    return out


def sglang_fields(s: Sampling) -> tuple[dict[str, Any], dict[str, Any]]:
    """(``sampling_params`` fields, top-level fields) of SGLang's native ``/generate``."""
    if s.n is not None and s.n > 1:
        raise UnsupportedRequest("sglang (native /generate): n > 1 streams a batch bench does not parse; "
                                 "use $engine sglang-openai for n")
    params: dict[str, Any] = {}
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(s, name)
        if value is not None:
            params[name] = value
    if s.seed is not None:
        params["sampling_seed"] = s.seed
    if s.stop:
        params["stop"] = list(s.stop)
    top: dict[str, Any] = {}
    if s.logprobs is not None:
        top["return_logprob"] = True
        top["top_logprobs_num"] = s.logprobs
    return params, top


def tgi_fields(s: Sampling) -> dict[str, Any]:
    """``parameters`` fields of TGI's ``/generate_stream``.

    TGI samples only with ``do_sample`` (or a sampling field) and rejects temperature 0 and
    top_p 1: temperature 0 is its greedy default and top_p 1 its no-op, so both are left out.
    It returns each sampled token's log-probability always; ``top_n_tokens`` adds the top ones.
    """
    if s.n is not None and s.n > 1:
        raise UnsupportedRequest("tgi: /generate_stream has no n (several sequences per request)")
    params: dict[str, Any] = {}
    if s.temperature is not None and s.temperature > 0:
        params["temperature"] = s.temperature
        params["do_sample"] = True
    if s.top_p is not None and s.top_p < 1:
        params["top_p"] = s.top_p
    for name in ("top_k", "seed"):
        value = getattr(s, name)
        if value is not None:
            params[name] = value
    if s.stop:
        params["stop"] = list(s.stop)
    if s.logprobs:
        params["top_n_tokens"] = s.logprobs
    return params


# -- structured output ---------------------------------------------------------------------------
#: How an OpenAI-compatible server takes a constraint: vLLM's ``structured_outputs`` (json, regex,
#: choice; the ``guided_*`` fields it replaced were removed in vLLM 0.12), SGLang's OpenAI routes
#: (``response_format`` for a schema, a top-level ``regex``), or the OpenAI standard alone
#: (``response_format`` with a JSON schema; no regex or choice).
StructuredStyle = str


def openai_structured(c: Constraint, style: StructuredStyle, engine: str) -> dict[str, Any]:
    """Top-level fields of an OpenAI completions/chat body asking for ``c``."""
    if style == "vllm":
        if c.json_schema is not None:
            return {"structured_outputs": {"json": c.schema()}}
        if c.regex is not None:
            return {"structured_outputs": {"regex": c.regex}}
        return {"structured_outputs": {"choice": list(c.choice)}}
    if c.json_schema is not None:
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "bench", "schema": c.schema()}}}
    if style == "sglang":
        return {"regex": c.as_regex()}
    raise UnsupportedRequest(f"{engine}: the OpenAI API constrains output with a JSON schema only "
                             f"(response_format); {c.kind} is a vLLM/SGLang extension")


def sglang_structured(c: Constraint) -> dict[str, Any]:
    """``sampling_params`` fields of SGLang's native ``/generate`` (a choice becomes a regex)."""
    if c.json_schema is not None:
        return {"json_schema": c.json_schema}
    return {"regex": c.as_regex()}


def tgi_structured(c: Constraint) -> dict[str, Any]:
    """``parameters`` fields of TGI (``grammar``: json or regex; a choice becomes a regex)."""
    if c.json_schema is not None:
        return {"grammar": {"type": "json", "value": c.schema()}}
    return {"grammar": {"type": "regex", "value": c.as_regex()}}


def refuse_embeddings(spec: RequestSpec, engine: str, instead: str) -> None:
    """``UnsupportedRequest`` for an embeddings request to an API that has no such route."""
    if spec.kind == "embeddings":
        raise UnsupportedRequest(f"{engine}: no embeddings route; {instead}")


def refuse_tools(spec: RequestSpec, engine: str, instead: str, images: bool = False) -> None:
    """``UnsupportedRequest`` for a request with tools (or, with ``images``, images) to an API
    that cannot carry them."""
    if spec.tools:
        raise UnsupportedRequest(f"{engine}: no tool definitions; {instead}")
    if images and spec.images:
        raise UnsupportedRequest(f"{engine}: no images; {instead}")


def image_urls(spec: RequestSpec) -> list[str]:
    """The data URLs of a request's images (made locally, workloads/images.py)."""
    return [data_url(w, h, f"{spec.request_id}:{i}") for i, (w, h) in enumerate(spec.images)]
