"""Sampling fields as the simulated engine checks them, per flavour.

The simulated engine does not sample (its tokens are seeded), but it refuses what the real
engine refuses, so a workload that a real engine would reject fails on the simulated one too.
Stop sequences need no model of their own: a request with one is not forced to its length,
and unforced requests end at the simulated end of sequence (``--natural-stop``).
"""

from __future__ import annotations

from typing import Any

#: vLLM's default --max-logprobs
MAX_LOGPROBS = 20


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def openai_problem(body: dict[str, Any], chat: bool) -> str | None:
    """Why vLLM's OpenAI server would refuse ``body``'s sampling fields, or ``None``."""
    t, p, k, n = body.get("temperature"), body.get("top_p"), body.get("top_k"), body.get("n", 1)
    if t is not None and (not _number(t) or t < 0):
        return f"temperature must be non-negative, got {t}."
    if p is not None and (not _number(p) or not 0 < p <= 1):
        return f"top_p must be in (0, 1], got {p}."
    if k is not None and (not isinstance(k, int) or (k < 1 and k not in (-1, 0))):
        return f"top_k must be 0 (disable), or at least 1, got {k}."
    if not isinstance(n, int) or n < 1:
        return f"n must be at least 1, got {n}."
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, (str, list)):
        return "stop must be a string or a list of strings"
    top = body.get("top_logprobs") if chat else body.get("logprobs")
    if chat and body.get("logprobs") not in (None, True, False):
        return "logprobs must be a boolean in chat completions"
    if top is not None and not isinstance(top, bool) and (not isinstance(top, int) or not 0 <= top <= MAX_LOGPROBS):
        return f"Requested sample logprobs of {top}, which is greater than max allowed: {MAX_LOGPROBS}"
    return None


def sglang_problem(sp: dict[str, Any]) -> str | None:
    t, p, k, n = sp.get("temperature"), sp.get("top_p"), sp.get("top_k"), sp.get("n", 1)
    if t is not None and (not _number(t) or t < 0):
        return f"temperature must be non-negative, got {t}."
    if p is not None and (not _number(p) or not 0 < p <= 1):
        return f"top_p must be in (0, 1], got {p}."
    if k is not None and (not isinstance(k, int) or (k < 1 and k != -1)):
        return f"top_k must be -1 (disable), or at least 1, got {k}."
    if n != 1:
        return "n != 1 is not modelled by the simulated engine"
    return None


def tgi_problem(params: dict[str, Any]) -> str | None:
    t, p, k = params.get("temperature"), params.get("top_p"), params.get("top_k")
    if t is not None and (not isinstance(t, (int, float)) or t <= 0):
        return "`temperature` must be strictly positive"
    if p is not None and (not _number(p) or not 0 < p < 1):
        return "`top_p` must be > 0.0 and < 1.0"
    if k is not None and (not isinstance(k, int) or k <= 0):
        return "`top_k` must be strictly positive"
    stop = params.get("stop") or []
    if not isinstance(stop, list) or len(stop) > 4:
        return "`stop` supports up to 4 stop sequences"
    return None


#: The ``sampling_params`` fields SGLang 0.5.22 on accepts (sglang.api.v1 SamplingParams, 0.5.23);
#: any other key is refused with HTTP 400 (SimServer.sglang_schema_error).
SGLANG_SAMPLING_FIELDS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
    "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)  # fmt: skip
