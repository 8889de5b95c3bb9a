"""Each flavour's /metrics page, with that engine's own Prometheus names and label sets.

SGLang as 0.5.23 (observability/metrics_collector.py): the tokenizer's series carry
``model_name, engine_type``, the scheduler's ``model_name, engine_type, tp_rank, pp_rank,
moe_ep_rank``; retractions are a counter plus a gauge reset at each log point (here: each
scrape); ``cache_hit_rate`` is the recent prefill's rate, not a cumulative one. TGI as 3.3
(router/src/server.rs, backends/v3): no labels except ``method`` on batch series; time per
token is inference time (prefill included) over generated tokens. vLLM: docs/engines.md.
"""

from __future__ import annotations

from typing import Protocol

from bench_llm.sim.metrics import Histogram, Registry
from bench_llm.sim.spec_counts import SpecDecodeCounts

#: vLLM's token and request counters, created at 0 when the engine starts (vLLM 0.32
#: ``v1/metrics/loggers.py``), so a scrape before the first request already shows them
VLLM_PROMPT_TOKENS = ("vllm:prompt_tokens", "Prefill tokens processed.")
VLLM_GENERATION_TOKENS = ("vllm:generation_tokens", "Generation tokens processed.")
VLLM_CACHED_TOKENS = ("vllm:prompt_tokens_cached", "Prompt tokens served from the prefix cache.")
VLLM_SUCCESS = ("vllm:request_success", "Finished requests.")
#: the ``finished_reason`` values vLLM creates (its engine's ``FinishReason``; an OpenAI answer's
#: ``tool_calls`` is a ``stop`` to the engine)
VLLM_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")

TOKEN_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0)


class EngineState(Protocol):
    running: int
    waiting: int


class FlavorMetrics:
    """Records request events; renders the page of the engine being imitated."""

    # None where the imitated engine has no such histogram (``inference`` and ``tpot`` are
    # not set at all for tgi, whose paths never read them).
    ttft: Histogram | None
    itl: Histogram
    e2e: Histogram
    queue: Histogram
    inference: Histogram | None
    tpot: Histogram
    prefill: Histogram | None
    decode: Histogram | None
    gen_tokens: Histogram | None
    in_tokens: Histogram | None
    iter_tokens: Histogram | None

    def __init__(self, flavor: str, model: str) -> None:
        self.flavor = flavor
        if flavor == "tgi":
            self.reg = Registry({}, counter_suffix="")
        elif flavor == "sglang":
            self.reg = Registry({"model_name": model, "engine_type": "unified"})
        else:
            self.reg = Registry({"model_name": model, "engine": "0"})
        #: the scheduler's series (SGLang labels them per rank; the others have one registry)
        self.sched = (Registry({"model_name": model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                                "moe_ep_rank": "0"}) if flavor == "sglang" else self.reg)
        self._last = (0, 0, 0)  # SGLang: prefix queries, hits and retractions at the last page
        #: SGLang: drafts and accepted drafts at the last page, and the acceptance gauges then
        self._last_spec = (0, 0)
        self._spec_gauges = (0.0, 0.0)
        p = {"vllm": "vllm:", "sglang": "sglang:", "tgi": "tgi_"}[flavor]
        self.p = p
        r = self.reg
        if flavor == "tgi":
            self.ttft = None
            self.itl = r.histogram("tgi_request_mean_time_per_token_duration", "Mean time per token.")
            self.e2e = r.histogram("tgi_request_duration", "Request duration.")
            self.queue = r.histogram("tgi_request_queue_duration", "Queue time.")
            self.prefill = r.histogram("tgi_batch_forward_duration", "Batch forward duration.", extra='method="prefill"')
            self.decode = r.histogram("tgi_request_inference_duration", "Inference duration.")
            self.gen_tokens = r.histogram("tgi_request_generated_tokens", "Generated tokens.", TOKEN_BUCKETS)
            self.in_tokens = r.histogram("tgi_request_input_length", "Input length.", TOKEN_BUCKETS)
        else:
            self.ttft = r.histogram(f"{p}time_to_first_token_seconds", "Time to first token.")
            self.itl = r.histogram(f"{p}inter_token_latency_seconds", "Inter-token latency.")
            self.e2e = r.histogram(f"{p}e2e_request_latency_seconds", "End-to-end request latency.")
            self.queue = (r.histogram(f"{p}request_queue_time_seconds", "Queue time.") if flavor == "vllm"
                          else self.sched.histogram(f"{p}queue_time_seconds", "Histogram of queueing time in seconds."))
            self.inference = (r.histogram(f"{p}request_inference_time_seconds", "Prefill + decode time.")
                              if flavor == "vllm" else None)
            self.tpot = r.histogram(f"{p}request_time_per_output_token_seconds", "Per-request time per output token.")
            self.prefill = r.histogram(f"{p}request_prefill_time_seconds", "Prefill time.") if flavor == "vllm" else None
            self.decode = r.histogram(f"{p}request_decode_time_seconds", "Decode time.") if flavor == "vllm" else None
            self.gen_tokens = (
                r.histogram(f"{p}request_generation_tokens", "Generation tokens per request.", TOKEN_BUCKETS)
                if flavor == "vllm" else None
            )
            self.in_tokens = (
                r.histogram(f"{p}request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS)
                if flavor == "vllm" else None
            )
        if flavor == "vllm":
            self.iter_tokens = r.histogram("vllm:iteration_tokens_total", "Tokens per engine step.", TOKEN_BUCKETS)
            for name, help in (VLLM_PROMPT_TOKENS, VLLM_GENERATION_TOKENS, VLLM_CACHED_TOKENS):
                r.inc(name, help, 0.0)
            for reason in VLLM_FINISH_REASONS:
                r.inc_labelled(*VLLM_SUCCESS, "finished_reason", reason, 0.0)
        else:
            self.iter_tokens = None

    # -- events ------------------------------------------------------------------------
    def request(self, prompt_tokens: int) -> None:
        if self.flavor == "tgi":
            self.reg.inc("tgi_request_count", "Requests received.")
            if self.in_tokens is not None:
                self.in_tokens.observe(prompt_tokens)
        elif self.flavor == "sglang":
            self.reg.inc("sglang:prompt_tokens", "Prompt tokens.", prompt_tokens)
        else:
            self.reg.inc(*VLLM_PROMPT_TOKENS, prompt_tokens)
            if self.in_tokens is not None:
                self.in_tokens.observe(prompt_tokens)

    def first_token(self, ttft_s: float) -> None:
        if self.ttft is not None:
            self.ttft.observe(ttft_s)

    def inter_token(self, itl_s: float) -> None:
        if self.flavor != "tgi":
            self.itl.observe(itl_s)

    def finished(
        self, e2e_s: float, tokens: int, cached: int, queue_s: float | None, prefill_s: float | None,
        decode_s: float | None, reason: str,
    ) -> None:
        r = self.reg
        if self.flavor == "tgi":
            r.inc("tgi_request_success", "Successful requests.")
            self.e2e.observe(e2e_s)
            if queue_s is not None:
                self.queue.observe(queue_s)
            if queue_s is not None and self.decode is not None:
                self.decode.observe(max(0.0, e2e_s - queue_s))
            if prefill_s is not None and self.prefill is not None:
                self.prefill.observe(prefill_s)
            if tokens > 0:  # inference time / tokens, prefill included (server.rs time_per_token)
                self.itl.observe((e2e_s - (queue_s or 0.0)) / tokens)
            if self.gen_tokens is not None:
                self.gen_tokens.observe(tokens)
            return
        if decode_s is not None and tokens > 1:
            self.tpot.observe(decode_s / (tokens - 1))
        if queue_s is not None and self.queue is not None:
            self.queue.observe(queue_s)
        if self.flavor == "sglang":
            r.inc("sglang:generation_tokens", "Generation tokens.", tokens)
            r.inc("sglang:cached_tokens", "Prefix-cache hit tokens.", cached)
            r.inc("sglang:num_requests", "Finished requests.")
            self.e2e.observe(e2e_s)
            return
        r.inc(*VLLM_GENERATION_TOKENS, tokens)
        r.inc(*VLLM_CACHED_TOKENS, cached)
        if queue_s is not None and self.inference is not None:
            self.inference.observe(max(0.0, e2e_s - queue_s))
        r.inc_labelled(*VLLM_SUCCESS, "finished_reason", reason if reason in VLLM_FINISH_REASONS else "stop")
        self.e2e.observe(e2e_s)
        if prefill_s is not None and self.prefill is not None:
            self.prefill.observe(prefill_s)
        if decode_s is not None and self.decode is not None:
            self.decode.observe(decode_s)
        if self.gen_tokens is not None:
            self.gen_tokens.observe(tokens)

    def failed(self, err: str) -> None:
        if self.flavor == "tgi":
            self.reg.inc_labelled("tgi_request_failure", "Failed requests.", "err", err)
        elif self.flavor == "vllm":
            self.reg.inc_labelled(*VLLM_SUCCESS, "finished_reason", "abort")

    # -- page ------------------------------------------------------------------------------
    def render(
        self, running: int, waiting: int, kv_usage: float, queries: int, hits: int, preemptions: int,
        kv_tokens: int, batch_tokens: int, iteration_tokens: list[int], gen_throughput: float,
        spec: SpecDecodeCounts | None = None,
    ) -> str:
        """The page; ``spec``: speculative decoding's counts, None when it is off."""
        r = self.reg
        if self.iter_tokens is not None:
            for n in iteration_tokens:
                self.iter_tokens.observe(n)
            iteration_tokens.clear()
        if self.flavor == "tgi":
            r.gauge("tgi_queue_size", "Requests waiting.", waiting)
            r.gauge("tgi_batch_current_size", "Requests in the current batch.", running)
            r.gauge("tgi_batch_current_max_tokens", "Tokens the current batch may hold.", batch_tokens)
            r.gauge("tgi_batch_max_total_tokens", "Max tokens in a batch.", kv_tokens)
            # no tgi_batch_total_tokens: TGI registers it but never sets it (router/src/infer/v3)
        elif self.flavor == "sglang":
            s = self.sched
            q0, h0, p0 = self._last
            self._last = (queries, hits, preemptions)
            s.gauge("sglang:num_running_reqs", "The number of running requests.", running)
            s.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", waiting)
            s.gauge("sglang:token_usage", "The token usage.", round(kv_usage, 6))
            s.gauge("sglang:num_used_tokens", "The number of used tokens.", int(kv_usage * kv_tokens))
            s.gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", kv_tokens)
            s.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", (hits - h0) / (queries - q0) if queries > q0 else 0.0)
            s.gauge("sglang:gen_throughput", "The generation throughput (token/s).", round(gen_throughput, 3))
            s.gauge("sglang:num_retracted_reqs", "The number of retracted requests.", preemptions - p0)
            s.counters["sglang:num_retracted_requests"] = ("Total number of retracted requests.", float(preemptions))
            self._sglang_spec(spec)
            return s.render() + r.render()
        else:
            r.gauge("vllm:num_requests_running", "Requests in model execution batches.", running)
            r.gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", waiting)
            r.gauge("vllm:kv_cache_usage_perc", "KV-cache usage (0-1).", round(kv_usage, 6))
            r.counters["vllm:prefix_cache_queries"] = ("Prefix cache queries (tokens).", float(queries))
            r.counters["vllm:prefix_cache_hits"] = ("Prefix cache hits (tokens).", float(hits))
            r.counters["vllm:num_preemptions"] = ("Preemptions.", float(preemptions))
            if spec is not None:
                self._vllm_spec(spec)
        return r.render()

    def _vllm_spec(self, spec: SpecDecodeCounts) -> None:
        """vLLM's four counters, registered only with a speculative config (then from 0, every
        position of the k; v1/spec_decode/metrics.py ``SpecDecodingProm``)."""
        r = self.reg
        r.counters["vllm:spec_decode_num_drafts"] = ("Number of spec decoding drafts.", float(spec.drafts))
        r.counters["vllm:spec_decode_num_draft_tokens"] = ("Number of draft tokens.", float(spec.draft_tokens))
        r.counters["vllm:spec_decode_num_accepted_tokens"] = ("Number of accepted tokens.", float(spec.accepted))
        r.labelled["vllm:spec_decode_num_accepted_tokens_per_pos"] = (
            "Accepted tokens per draft position.", "position",
            {str(i): float(n) for i, n in enumerate(spec.accepted_per_pos)},
        )

    def _sglang_spec(self, spec: SpecDecodeCounts | None) -> None:
        """SGLang's two gauges (0 without speculative decoding, as SGLang sets them): the mean
        acceptance length (the step's own token included) and the accepted share of the drafts,
        over the decode steps since the last log point (here: since the last page; a page with no
        verification since keeps the last values, as SGLang logs only after decode steps)."""
        if spec is not None:
            d0, a0 = self._last_spec
            if spec.drafts > d0:
                drafts, accepted = spec.drafts - d0, spec.accepted - a0
                self._spec_gauges = (1.0 + accepted / drafts, accepted / (drafts * spec.k))
            self._last_spec = (spec.drafts, spec.accepted)
        length, rate = self._spec_gauges
        s = self.sched
        s.gauge("sglang:spec_accept_length", "The average acceptance length of speculative decoding.", length)
        s.gauge("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding "
                "(`accepted tokens / total draft tokens` in batch).", rate)
