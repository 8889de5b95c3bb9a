"""Engine Prometheus metric names → bench's common names.

Keys are metric *family* names as the Prometheus text parser reports them (counters
without their ``_total`` suffix; histograms without ``_bucket``/``_sum``/``_count``).
Versions targeted and the meaning of each common name: docs/engines.md.

Names are distinct across an engine's versions, so the union below is safe when the version
is unknown; :func:`metric_names` narrows it to the families a given version emits (the
ranges in :data:`SGLANG_VERSIONS`, read in each release's source), and :meth:`MetricNames.common`
leaves SGLang's per-priority breakdowns (``priority="<n>"``, 0.5.12+) without a common name:
the total is the ``priority=""`` series, and summing both would double it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from bench_llm.adapters.versions import in_range

#: common name → what it is (the unit is in the name).
COMMON_NAMES: dict[str, str] = {
    "waiting": "requests waiting to be scheduled (gauge)",
    "running": "requests being processed (gauge)",
    "kv_cache_usage": "fraction of the KV cache in use, 0..1 (gauge)",
    "prefix_cache_queries": "prompt tokens looked up in the prefix cache (counter)",
    "prefix_cache_hits": "prompt tokens found in the prefix cache (counter)",
    "prefix_cache_hit_rate_last_prefill": "prefix-cache hit rate of the engine's last prefill batch, 0..1 "
    "(gauge; not a run's rate: take cached_tokens / prompt_tokens)",
    "preemptions": "requests preempted / retracted, cumulative (counter, or a gauge that only grows)",
    "prompt_tokens": "prompt tokens processed (counter)",
    "generation_tokens": "tokens generated (counter)",
    "cached_tokens": "prompt tokens served from cache (counter)",
    "requests_finished": "requests finished (counter)",
    "ttft_seconds": "server-side time to first token (histogram)",
    "itl_seconds": "server-side inter-token latency (histogram)",
    "tpot_seconds": "server-side per-request time per output token (histogram)",
    "e2e_seconds": "server-side request latency (histogram)",
    "queue_seconds": "time waiting in the engine's queue (histogram)",
    "prefill_seconds": "time in prefill (histogram)",
    "decode_seconds": "time in decode (histogram)",
    "inference_seconds": "prefill + decode time (histogram)",
    "inference_per_token_seconds": "inference time (prefill included) / generated tokens, per request (histogram)",
    "spec_decode_drafts": "speculative decoding: verification steps with drafts, one per sequence per step (counter)",
    "spec_decode_draft_tokens": "speculative decoding: draft tokens verified (counter)",
    "spec_decode_accepted_tokens": "speculative decoding: draft tokens accepted (counter)",
    "spec_decode_accepted_tokens_per_pos": "speculative decoding: steps whose accepted drafts reached draft position "
    "``position`` (0-based) (counter)",
    "spec_accept_length_last_interval": "speculative decoding: mean tokens per verification step (the step's own "
    "included) over the engine's last log interval (gauge; not a run's figure: take the counters)",
    "spec_accept_rate_last_interval": "speculative decoding: accepted share of the draft tokens over the engine's "
    "last log interval (gauge; not a run's figure: take the counters)",
}

VLLM: dict[str, str] = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",  # deprecated name
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
    "vllm:gpu_prefix_cache_queries": "prefix_cache_queries",  # older name
    "vllm:gpu_prefix_cache_hits": "prefix_cache_hits",
    "vllm:num_preemptions": "preemptions",
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:prompt_tokens_cached": "cached_tokens",
    "vllm:request_success": "requests_finished",
    "vllm:time_to_first_token_seconds": "ttft_seconds",
    "vllm:inter_token_latency_seconds": "itl_seconds",
    "vllm:time_per_output_token_seconds": "itl_seconds",  # deprecated name of the same
    "vllm:request_time_per_output_token_seconds": "tpot_seconds",
    "vllm:e2e_request_latency_seconds": "e2e_seconds",
    "vllm:request_queue_time_seconds": "queue_seconds",
    "vllm:request_prefill_time_seconds": "prefill_seconds",
    "vllm:request_decode_time_seconds": "decode_seconds",
    "vllm:request_inference_time_seconds": "inference_seconds",
    # only with a speculative config (v1/spec_decode/metrics.py)
    "vllm:spec_decode_num_drafts": "spec_decode_drafts",
    "vllm:spec_decode_num_draft_tokens": "spec_decode_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "spec_decode_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "spec_decode_accepted_tokens_per_pos",
}

SGLANG: dict[str, str] = {
    "sglang:num_queue_reqs": "waiting",
    "sglang:num_running_reqs": "running",
    "sglang:token_usage": "kv_cache_usage",
    "sglang:cache_hit_rate": "prefix_cache_hit_rate_last_prefill",
    "sglang:num_retracted_requests": "preemptions",  # counter, 0.5.7+
    "sglang:total_retracted_reqs": "preemptions",  # gauge that only grows, up to 0.5.2
    "sglang:prompt_tokens": "prompt_tokens",
    "sglang:generation_tokens": "generation_tokens",
    "sglang:cached_tokens": "cached_tokens",
    "sglang:num_requests": "requests_finished",
    "sglang:time_to_first_token_seconds": "ttft_seconds",
    "sglang:inter_token_latency_seconds": "itl_seconds",
    "sglang:request_time_per_output_token_seconds": "tpot_seconds",  # 0.5.22+
    "sglang:e2e_request_latency_seconds": "e2e_seconds",
    "sglang:queue_time_seconds": "queue_seconds",  # 0.5.3+
    "sglang:spec_accept_length": "spec_accept_length_last_interval",  # 0 without speculative decoding
    "sglang:spec_accept_rate": "spec_accept_rate_last_interval",
}

#: SGLang families that exist only in some releases: family -> (first, last) release with it
#: (None: open). Read in the released packages' metrics collector (docs/engines.md).
#: ``sglang:num_retracted_reqs`` is deliberately unmapped: a gauge reset at each log point,
#: it cannot be summed from scrapes that do not fall on those points.
SGLANG_VERSIONS: dict[str, tuple[str | None, str | None]] = {
    "sglang:total_retracted_reqs": (None, "0.5.2"),
    "sglang:num_retracted_requests": ("0.5.7", None),
    "sglang:queue_time_seconds": ("0.5.3", None),
    "sglang:request_time_per_output_token_seconds": ("0.5.22", None),
}

#: Gauges that only ever grow (a total since start): the scraper gives them a ``delta`` like a counter.
CUMULATIVE_GAUGES = frozenset({"sglang:total_retracted_reqs"})

#: TGI has no TTFT or prefill histogram; queue + validation + prefill must be inferred.
TGI: dict[str, str] = {
    "tgi_queue_size": "waiting",
    "tgi_batch_current_size": "running",
    "tgi_request_success": "requests_finished",
    "tgi_request_duration": "e2e_seconds",
    "tgi_request_queue_duration": "queue_seconds",
    "tgi_request_inference_duration": "inference_seconds",
    # inference time / generated tokens: prefill included, so not a TPOT (router/src/server.rs)
    "tgi_request_mean_time_per_token_duration": "inference_per_token_seconds",
}

ALL: dict[str, str] = {**VLLM, **SGLANG, **TGI}

_BY_ENGINE: dict[str, dict[str, str]] = {"vllm": VLLM, "sglang": SGLANG, "tgi": TGI}


@dataclass(frozen=True)
class MetricNames:
    """The family -> common-name map for one engine version (the union when unknown)."""

    names: Mapping[str, str]

    def common(self, family: str, labels: Mapping[str, str] | None = None) -> str | None:
        name = self.names.get(family)
        if name is None and family.endswith("_total"):
            name = self.names.get(family[: -len("_total")])
        if name is not None and labels and labels.get("priority") and family.startswith("sglang:"):
            return None  # a per-priority breakdown beside the priority="" total
        return name


def metric_names(engine: str | None = None, version: str | None = None) -> MetricNames:
    """The names ``engine`` at ``version`` emits; every known name when either is unknown.

    A simulated engine speaks its flavour's names (pass the flavour as ``engine``)."""
    table = _BY_ENGINE.get(engine or "")
    if table is None:
        return MetricNames(ALL)
    if engine == "sglang" and version:
        table = {f: c for f, c in table.items() if in_range(version, SGLANG_VERSIONS.get(f, (None, None)))}
    return MetricNames(table)


_UNION = MetricNames(ALL)


def common_name(family: str, labels: Mapping[str, str] | None = None) -> str | None:
    """The common name of an engine metric family, or None when it has none."""
    return _UNION.common(family, labels)
