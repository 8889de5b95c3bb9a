"""Engine Prometheus metric names → bench's common names.

Keys are metric *family* names as the Prometheus text parser reports them (counters
without their ``_total`` suffix; histograms without ``_bucket``/``_sum``/``_count``).
Versions targeted and the meaning of each common name: docs/engines.md.
"""

from __future__ import annotations

#: common name → what it is (the unit is in the name).
COMMON_NAMES: dict[str, str] = {
    "waiting": "requests waiting to be scheduled (gauge)",
    "running": "requests being processed (gauge)",
    "kv_cache_usage": "fraction of the KV cache in use, 0..1 (gauge)",
    "prefix_cache_queries": "prompt tokens looked up in the prefix cache (counter)",
    "prefix_cache_hits": "prompt tokens found in the prefix cache (counter)",
    "prefix_cache_hit_rate": "prefix-cache hit rate reported by the engine, 0..1 (gauge)",
    "preemptions": "requests preempted / retracted (vLLM: counter; SGLang: gauge of retracted requests)",
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
}

SGLANG: dict[str, str] = {
    "sglang:num_queue_reqs": "waiting",
    "sglang:num_running_reqs": "running",
    "sglang:token_usage": "kv_cache_usage",
    "sglang:cache_hit_rate": "prefix_cache_hit_rate",
    "sglang:num_retracted_reqs": "preemptions",
    "sglang:prompt_tokens": "prompt_tokens",
    "sglang:generation_tokens": "generation_tokens",
    "sglang:cached_tokens": "cached_tokens",
    "sglang:num_requests": "requests_finished",
    "sglang:time_to_first_token_seconds": "ttft_seconds",
    "sglang:inter_token_latency_seconds": "itl_seconds",
    "sglang:time_per_output_token_seconds": "tpot_seconds",
    "sglang:e2e_request_latency_seconds": "e2e_seconds",
    "sglang:queue_time_seconds": "queue_seconds",
}

#: TGI has no TTFT or prefill histogram; queue + validation + prefill must be inferred.
TGI: dict[str, str] = {
    "tgi_queue_size": "waiting",
    "tgi_batch_current_size": "running",
    "tgi_request_success": "requests_finished",
    "tgi_request_duration": "e2e_seconds",
    "tgi_request_queue_duration": "queue_seconds",
    "tgi_request_inference_duration": "inference_seconds",
    "tgi_request_mean_time_per_token_duration": "tpot_seconds",
}

ALL: dict[str, str] = {**VLLM, **SGLANG, **TGI}


def common_name(family: str) -> str | None:
    """The common name of an engine metric family, or None when it has none."""
    name = ALL.get(family)
    if name is None and family.endswith("_total"):
        name = ALL.get(family[: -len("_total")])
    return name
