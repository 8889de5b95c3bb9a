"""Any other OpenAI-compatible server (llama.cpp, TensorRT-LLM, Ollama, transformers serve, ...).

Sends only standard OpenAI fields: no ``ignore_eos``/``min_tokens`` and no
``continuous_usage_stats`` (vLLM extensions some servers reject). ``stream_options.
include_usage`` is standard and asked for unless ``usage=False``. Without per-chunk usage
the per-chunk token counts are approximate (the recorder spreads the final usage over the
text chunks, or counts one token per chunk when there is no usage at all) and the record's
``token_source`` says which. Many such servers omit ``[DONE]``: a stream that ended with a
finish reason is complete.
"""

from __future__ import annotations

from typing import Any

from bench_llm.adapters.base import register
from bench_llm.adapters.openai import Api, OpenAIAdapter


class GenericOpenAIAdapter(OpenAIAdapter):
    name = "generic"
    forces_output_length = False
    exact_chunk_counts = False
    requires_done = False
    structured_style = "openai"  # response_format with a JSON schema only

    def __init__(
        self,
        model: str = "default",
        api: Api = "completions",
        base_path: str = "/v1",
        api_key: str | None = None,
        usage: bool = True,
        extra_body: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        super().__init__(model, api, base_path, api_key, continuous_usage=False, force_length_fields=False,
                         extra_body=extra_body)  # fmt: skip
        self.usage = usage
        self.exact_chunk_counts = False

    def body(self, spec, history=()):  # type: ignore[no-untyped-def]
        body = super().body(spec, history)
        if not self.usage:
            body.pop("stream_options", None)
        return body

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "adapter": self.name,
            "forces_output_length": False,
            "include_usage": self.usage,
            "token_counts": "approximate unless the server sends usage on every chunk (see token_source)",
        }


register("generic", "bench_llm.adapters.generic:GenericOpenAIAdapter")
for _alias in ("llamacpp", "llama.cpp", "ollama", "trtllm", "tensorrt-llm"):
    register(_alias, "bench_llm.adapters.generic:GenericOpenAIAdapter")
