"""The simulated server's routes, as data: each flavour's route table and the handlers it names.

A handler parses and validates the request in its engine's words and hands it to
``SimServer.run_generation`` (``sim.serving``). ``ROUTES`` lists each flavour's (method, path,
handler); the routes every flavour shares and the OpenAI-compatible ones are listed once, and
``sim.server.create_app`` registers the table of the configured flavour.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from bench_llm.core.tokenizer import count_tokens, output_token, tokenize
from bench_llm.sim.options import describe
from bench_llm.sim.request_body import (
    chat_prompt,
    image_token_ids,
    message_images,
    read_json_body,
    tgi_invalid,
    tool_call,
    word_pieces,
)
from bench_llm.sim.sampling import openai_problem, sglang_problem
from bench_llm.sim.serving import VERSION, SimServer
from bench_llm.sim.structured import Unsupported, openai_constraint, sglang_constraint, tgi_constraint
from bench_llm.sim.wire import EmbeddingWire, OpenAIWire, SGLangWire, TGIWire

_now = time.perf_counter_ns


def health_response(srv: SimServer) -> web.Response:
    """200 once started; 503 during the slow-start fault (TGI: its JSON error body)."""
    if srv.starting:
        if srv.flavor == "tgi":
            return web.json_response({"error": "unhealthy", "error_type": "healthcheck"}, status=503)
        return web.Response(status=503, text="")
    return web.Response(text="")


class EngineRoutes:
    """The routes of the engine itself: health, metrics, models, version, tokenizer, prefix cache."""

    def __init__(self, srv: SimServer) -> None:
        self.srv = srv

    async def health(self, request: web.Request) -> web.Response:
        return health_response(self.srv)

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(text=self.srv.prometheus_text(), content_type="text/plain", charset="utf-8")

    async def models(self, request: web.Request) -> web.Response:
        srv = self.srv
        m = srv.config.model
        data = {"object": "list", "data": [{"id": m, "object": "model", "created": int(time.time()),
                                            "owned_by": "bench-sim", "root": m, "parent": None,
                                            "max_model_len": srv.max_model_len}]}
        return web.json_response(data)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await read_json_body(request)
        if self.srv.flavor == "tgi":
            text = str(body.get("inputs", ""))
            out = [{"id": i, "text": t, "start": 0, "stop": 0} for i, t in zip(tokenize(text), word_pieces(text))]
            return web.json_response(out)
        prompt = body.get("prompt")
        if prompt is None and "messages" in body:
            prompt = chat_prompt(body["messages"])
        tokens = tokenize(str(prompt or ""))
        return web.json_response({"count": len(tokens), "max_model_len": self.srv.max_model_len, "tokens": tokens,
                                  "token_strs": None})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await read_json_body(request)
        ids = body.get("tokens") or []
        return web.json_response({"prompt": "".join(output_token(int(i), 0) for i in ids)})

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        self.srv.reset_prefix_cache()
        return web.Response(text="")


# -- error bodies, in each flavour's words ---------------------------------------------------------
def _openai_error(status: int, message: str) -> web.Response:
    etype = {400: "BadRequestError", 404: "NotFoundError", 429: "TooManyRequestsError", 500: "InternalServerError",
             503: "ServiceUnavailableError"}.get(status, "Error")
    return web.json_response({"error": {"message": message, "type": etype, "param": None, "code": status}},
                             status=status)


def _tgi_error(status: int, message: str) -> web.Response:
    etype = {400: "validation", 422: "validation", 429: "overloaded", 503: "unhealthy"}.get(status, "generation")
    return web.json_response({"error": message, "error_type": etype}, status=status)


def _sglang_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


class OpenAIRoutes:
    def __init__(self, srv: SimServer) -> None:
        self.srv = srv

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = _now()
        srv = self.srv
        body = await read_json_body(request)
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return _openai_error(400, "messages must be a non-empty list")
            prompt = chat_prompt(messages)
        else:
            raw_prompt = body.get("prompt")
            if isinstance(raw_prompt, list) and raw_prompt and all(isinstance(p, int) for p in raw_prompt):
                raw_prompt = " ".join(f"t{p}" for p in raw_prompt)
            if not isinstance(raw_prompt, str):
                return _openai_error(400, "prompt must be a string")
            prompt = raw_prompt
        model = body.get("model", srv.config.model)
        if model != srv.config.model and model not in srv.config.lora_adapters:
            return _openai_error(404, f"The model `{model}` does not exist.")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            max_tokens = 16 if not chat else max(1, srv.max_model_len - count_tokens(prompt))
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return _openai_error(400, "max_tokens must be a positive integer")
        min_tokens = body.get("min_tokens", 0)
        if not isinstance(min_tokens, int) or min_tokens < 0 or min_tokens > max_tokens:
            return _openai_error(400, "min_tokens must be an integer between 0 and max_tokens")
        problem = openai_problem(body, chat)
        if problem:
            return _openai_error(400, problem)
        opts = body.get("stream_options") or {}
        stream = bool(body.get("stream"))
        if opts and not stream:
            return _openai_error(400, "Stream options can only be defined when `stream=True`.")
        rid = ("chatcmpl-" if chat else "cmpl-") + srv.next_id()
        try:
            image_ids = image_token_ids(message_images(body.get("messages"))) if chat else []
        except Unsupported as exc:
            return _openai_error(400, str(exc))
        wire = OpenAIWire(rid, chat, model, (count_tokens(prompt) or 1) + len(image_ids), bool(opts.get("include_usage")),
                          bool(opts.get("continuous_usage_stats")), cached_details=True)
        try:
            constraint = openai_constraint(body)
            call = tool_call(body, rid) if chat else None
        except Unsupported as exc:
            return _openai_error(400, str(exc))
        if call is not None:  # the answer is a call of one of the tools, its arguments fitting its parameters
            wire.tool, constraint = call[0], call[1]
        wire.n = body.get("n") or 1
        if wire.n > 1 and (constraint is not None or srv.flavor != "vllm"):
            # vLLM's stream of several sequences is modelled (HttpStream, OpenAIWire.choices_tokens); not
            # structured or tool answers of several, nor SGLang's OpenAI routes' own shape
            return _openai_error(400, "n > 1 is modelled by the simulated engine for vLLM text answers only")
        if chat and constraint is None:
            wire.reasoning = min(srv.config.reasoning_tokens, max_tokens - 1)
        return await srv.run_generation(request, "openai", wire, rid, prompt, max_tokens, stream, arrival, _openai_error,
                              forced=bool(body.get("ignore_eos")), min_tokens=min_tokens, constraint=constraint,
                              adapter=model if model != srv.config.model else None, image_ids=image_ids)


    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/embeddings``: one vector per input. The inputs are prefilled as one
        sequence of their summed length (the cost of that prefill step; the one token the
        scheduler samples with it is not sent), then the vectors come in one response."""
        arrival = _now()
        srv = self.srv
        body = await read_json_body(request)
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) for i in inputs):
            return _openai_error(400, "input must be a string or a non-empty list of strings")
        model = body.get("model", srv.config.model)
        if model != srv.config.model and model not in srv.config.lora_adapters:
            return _openai_error(404, f"The model `{model}` does not exist.")
        rid = "embd-" + srv.next_id()
        prompt = "\n".join(inputs)
        wire = EmbeddingWire(rid, model, [count_tokens(i) or 1 for i in inputs])
        return await srv.run_generation(request, "openai", wire, rid, prompt, 1, False, arrival, _openai_error,
                              adapter=model if model != srv.config.model else None)


class SGLangRoutes:
    def __init__(self, srv: SimServer) -> None:
        self.srv = srv

    async def generate(self, request: web.Request) -> web.StreamResponse:
        arrival = _now()
        srv = self.srv
        body = await read_json_body(request)
        text = body.get("text")
        if text is None and isinstance(body.get("input_ids"), list):
            text = " ".join(f"t{i}" for i in body["input_ids"])
        if not isinstance(text, str):
            return _sglang_error(400, "text (a string) or input_ids is required")
        sp = body.get("sampling_params") or {}
        unknown = srv.sglang_schema_error(sp)
        if unknown:  # 0.5.22 on: the schema's own 400 body, {"error": "<text>"} (entrypoints/api_contract.py)
            return web.json_response({"error": unknown}, status=400)
        max_tokens = sp.get("max_new_tokens", 128)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _sglang_error(400, "sampling_params.max_new_tokens must be a positive integer")
        problem = sglang_problem(sp)
        if problem:
            return _sglang_error(400, problem)
        lora = body.get("lora_path")
        if lora is not None and lora not in srv.config.lora_adapters:
            return _sglang_error(400, f"lora_path {lora!r} is not a loaded LoRA adapter")
        try:
            constraint = sglang_constraint(sp)
        except Unsupported as exc:
            return _sglang_error(400, str(exc))
        try:
            image_ids = image_token_ids(body.get("image_data") or [])
        except Unsupported as exc:
            return _sglang_error(400, str(exc))
        rid = str(body.get("rid") or srv.next_id())
        wire = SGLangWire(rid, (count_tokens(text) or 1) + len(image_ids), arrival,
                          engine_ttft=srv.sglang_generation == "0.5.23")
        min_new = sp.get("min_new_tokens", 0)
        return await srv.run_generation(request, "sglang", wire, rid, text, max_tokens, bool(body.get("stream")), arrival,
                              _sglang_error, forced=bool(sp.get("ignore_eos")),
                              min_tokens=min_new if isinstance(min_new, int) else 0, constraint=constraint, adapter=lora,
                              image_ids=image_ids)

    async def server_info(self, request: web.Request) -> web.Response:
        srv = self.srv
        mt = srv.config.model_timing
        info: dict[str, Any] = {
            "model_path": srv.config.model,
            "served_model_name": srv.config.model,
            "tp_size": mt.tp if mt else 1,
            "dp_size": mt.dp if mt else 1,
            "pp_size": mt.pp if mt else 1,
            "ep_size": mt.ep if mt else 1,
            "max_total_num_tokens": srv.kv_tokens,
            "chunked_prefill_size": mt.limits()[1] if mt else 8192,
            "max_running_requests": mt.limits()[0] if mt else 1024,
            "disaggregation_mode": "null" if not (mt and mt.disaggregated) else "prefill-decode",
            "version": srv.reported_version,
            "internal_states": [{"avg_spec_accept_length": None, "last_gen_throughput": srv.gen_throughput}],
        }
        if mt is not None:
            info["sim"] = describe(mt)
        return web.json_response(info)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.srv.config.model, "tokenizer_path": self.srv.config.model,
                                  "is_generation": True})

    async def health_generate(self, request: web.Request) -> web.Response:
        return health_response(self.srv)

    async def flush_cache(self, request: web.Request) -> web.Response:
        """GET or POST: refused while requests are pending, unless ``?timeout=S`` (0.5.10 on;
        ignored before) waits up to S seconds for the engine to go idle first."""
        srv = self.srv
        b = srv.backend
        try:
            wait_s = float(request.query.get("timeout", 0)) if srv.config.sglang_release >= (0, 5, 10) else 0.0
        except ValueError:
            return web.json_response({"error": {"message": "timeout must be a number of seconds", "code": 400}},
                                     status=400)  # fmt: skip
        deadline = _now() + int(max(0.0, wait_s) * 1e9)
        while (b.running or b.waiting) and _now() < deadline:
            await asyncio.sleep(0.01)
        if b.running or b.waiting:  # scheduler.py flush_cache: refused while requests are pending
            return web.Response(status=400, text="Cache not flushed because there are pending requests. "
                                f"#queue-req: {b.waiting}, #running-req: {b.running}\n")
        self.srv.reset_prefix_cache()
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. "
                                 "(When there are running or waiting requests, the operation will not be performed.)\n")


class TGIRoutes:
    def __init__(self, srv: SimServer) -> None:
        self.srv = srv

    async def generate_stream(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, stream=True)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """``POST /generate`` never streams: its body has no ``stream`` field (router/src/lib.rs
        GenerateRequest; only the compat route ``/`` reads one), so a ``stream: true`` there is ignored."""
        return await self._generate(request, stream=False, body=await read_json_body(request))

    async def _generate(self, request: web.Request, stream: bool, body: dict[str, Any] | None = None) -> web.StreamResponse:
        arrival = _now()
        srv = self.srv
        if body is None:
            body = await read_json_body(request)
        text = body.get("inputs")
        params = body.get("parameters") or {}
        m = params.get("max_new_tokens")
        if not isinstance(text, str) or (m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 0)):
            # axum's Json extractor, before TGI's own validation (`inputs`: String, max_new_tokens: u32)
            return _tgi_error(422, "Failed to deserialize the JSON body into the target type")
        wire = TGIWire(count_tokens(text) or 1, bool(params.get("details")), params.get("seed"))
        limit = srv.config.max_concurrent_requests
        if limit > 0 and srv.tgi_admitted >= limit:
            # the permit is taken before validation (router/src/infer/mod.rs generate_stream)
            srv.metrics.failed("overloaded")
            return await srv.refuse(request, wire, "tgi", stream, 429, "Model is overloaded", "overloaded", _tgi_error)
        srv.tgi_admitted += 1
        try:
            invalid = tgi_invalid(text, params, stream)
            if invalid is not None:
                srv.metrics.failed("validation")
                return await srv.refuse(request, wire, "tgi", stream, 422, f"Input validation error: {invalid}",
                                        "validation", _tgi_error)
            lora = params.get("adapter_id")
            if lora is not None and lora not in srv.config.lora_adapters:
                return await srv.refuse(request, wire, "tgi", stream, 422, f"Input validation error: adapter {lora!r} "
                                        "is not loaded", "validation", _tgi_error)
            try:
                constraint = tgi_constraint(params)
            except (Unsupported, ValueError) as exc:
                return await srv.refuse(request, wire, "tgi", stream, 422, f"Input validation error: {exc}",
                                        "validation", _tgi_error)
            # no max_new_tokens: all that fits, in segments (validation.rs)
            max_tokens = params.get("max_new_tokens") or max(1, srv.max_model_len - (count_tokens(text) or 1))
            return await srv.run_generation(request, "tgi", wire, srv.next_id(), text, max_tokens, stream, arrival, _tgi_error,
                                  forced=False, stop_sequences=bool(params.get("stop")), constraint=constraint,
                                  adapter=lora)
        finally:
            srv.tgi_admitted -= 1

    async def info(self, request: web.Request) -> web.Response:
        srv = self.srv
        return web.json_response({  # router/src/lib.rs Info: no shard count
            "model_id": srv.config.model,
            "model_sha": None,
            "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": srv.config.max_concurrent_requests,
            "max_best_of": 2,
            "max_stop_sequences": 4,
            "max_input_tokens": srv.max_model_len - 1,
            "max_total_tokens": srv.max_model_len,
            "validation_workers": 2,
            "max_client_batch_size": 4,
            "router": "text-generation-router",
            "version": VERSION,
            "sha": None,
            "docker_label": None,
        })


# -- the route tables -------------------------------------------------------------------------------
#: A handler named as its class's function; ``create_app`` binds it to the app's instance of that class.
Handler = Callable[[Any, web.Request], Awaitable[web.StreamResponse]]
Route = tuple[str, str, Handler]
ROUTE_CLASSES: tuple[type, ...] = (EngineRoutes, OpenAIRoutes, SGLangRoutes, TGIRoutes)

_EVERY_FLAVOUR: tuple[Route, ...] = (
    ("GET", "/health", EngineRoutes.health),
    ("GET", "/metrics", EngineRoutes.metrics_page),
    ("GET", "/v1/models", EngineRoutes.models),
)
_OPENAI_GENERATION: tuple[Route, ...] = (
    ("POST", "/v1/completions", OpenAIRoutes.completions),
    ("POST", "/v1/chat/completions", OpenAIRoutes.chat),
)
_EMBEDDINGS: Route = ("POST", "/v1/embeddings", OpenAIRoutes.embeddings)

#: Each flavour's routes: (method, path, handler).
ROUTES: dict[str, tuple[Route, ...]] = {
    "vllm": (
        *_EVERY_FLAVOUR,
        ("GET", "/version", EngineRoutes.version),
        ("GET", "/ping", EngineRoutes.health),
        ("POST", "/tokenize", EngineRoutes.tokenize),
        ("POST", "/detokenize", EngineRoutes.detokenize),
        ("POST", "/reset_prefix_cache", EngineRoutes.reset_prefix_cache),  # vLLM dev-mode route
        *_OPENAI_GENERATION,
        _EMBEDDINGS,
    ),
    "sglang": (
        *_EVERY_FLAVOUR,
        ("POST", "/generate", SGLangRoutes.generate),
        ("GET", "/health_generate", SGLangRoutes.health_generate),
        ("GET", "/get_server_info", SGLangRoutes.server_info),
        ("GET", "/server_info", SGLangRoutes.server_info),
        ("GET", "/get_model_info", SGLangRoutes.model_info),
        ("GET", "/model_info", SGLangRoutes.model_info),
        ("POST", "/flush_cache", SGLangRoutes.flush_cache),
        ("GET", "/flush_cache", SGLangRoutes.flush_cache),  # GET and POST (http_server.py, 0.5.8 on)
        *_OPENAI_GENERATION,
        _EMBEDDINGS,
    ),
    "tgi": (
        *_EVERY_FLAVOUR,
        ("POST", "/generate_stream", TGIRoutes.generate_stream),
        ("POST", "/generate", TGIRoutes.generate),
        ("GET", "/info", TGIRoutes.info),
        ("GET", "/ping", EngineRoutes.health),
        ("POST", "/tokenize", EngineRoutes.tokenize),
        *_OPENAI_GENERATION,
    ),
}
