"""What a request's body says, as the simulated engine reads it: the JSON object, a chat's prompt
text and images (as prompt token ids), the tool a call goes to, and TGI's own validation."""

from __future__ import annotations

import base64
import re
import struct
import zlib
from typing import Any

import orjson
from aiohttp import web

from bench_llm.sim.sampling import tgi_problem
from bench_llm.sim.structured import Unsupported


async def read_json_body(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or HTTP 400."""
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise web.HTTPBadRequest(text='{"object":"error","message":"invalid JSON body"}', content_type="application/json")
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text='{"object":"error","message":"body must be an object"}', content_type="application/json")
    return body


def word_pieces(text: str) -> list[str]:
    """The text's words, each with the whitespace before it (TGI's /tokenize pieces)."""
    return re.findall(r"\s*\S+", text)


#: pixels per side of one image token (Qwen2-VL-style 28x28 merged patches)
IMAGE_PATCH = 28


def image_token_ids(urls: list[Any]) -> list[int]:
    """The prompt token ids the images stand for: ceil(w/28) x ceil(h/28) per image, read from
    each PNG's header, ids derived from the image's bytes (the same image, the same prefix).
    ``Unsupported`` for anything but a PNG data URL: the simulated engine fetches nothing."""
    ids: list[int] = []
    for url in urls:
        head, _, data = str(url).partition(",")
        if not head.startswith("data:image/png;base64"):
            raise Unsupported("images must be PNG data URLs (the simulated engine fetches nothing)")
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            raise Unsupported("an image's base64 data is invalid") from None
        if raw[:8] != b"\x89PNG\r\n\x1a\n" or raw[12:16] != b"IHDR":
            raise Unsupported("an image is not a PNG")
        w, h = struct.unpack(">II", raw[16:24])
        n = -(-w // IMAGE_PATCH) * -(-h // IMAGE_PATCH)
        c = zlib.crc32(raw)
        ids.extend(1000 + (c + k * 7919) % 30000 for k in range(n))
    return ids


def message_images(messages: Any) -> list[Any]:
    """The image URLs of a chat request's content parts."""
    urls = []
    for m in messages if isinstance(messages, list) else ():
        c = m.get("content") if isinstance(m, dict) else None
        for p in c if isinstance(c, list) else ():
            if isinstance(p, dict) and p.get("type") == "image_url":
                urls.append((p.get("image_url") or {}).get("url"))
    return urls


def chat_prompt(messages: Any) -> str:
    if not isinstance(messages, list):
        return ""
    parts = []
    for m in messages:
        if isinstance(m, dict):
            c = m.get("content", "")
            if isinstance(c, list):
                c = " ".join(str(p.get("text", "")) for p in c if isinstance(p, dict))
            parts.append(str(c))
    return "\n".join(parts)


def tool_call(body: dict[str, Any], rid: str) -> tuple[tuple[str, str], tuple[str, Any]] | None:
    """With ``tools`` (and a ``tool_choice`` other than "none"): ((call id, function name), the
    constraint its arguments fit). The named tool, or one chosen by the request id."""
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools):
        raise Unsupported("tools must be a list of {type: function, function: {...}} objects")
    choice = body.get("tool_choice", "auto")
    if choice == "none":
        return None
    functions = [t["function"] for t in tools]
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        named = [f for f in functions if f.get("name") == name]
        if not named:
            raise Unsupported(f"tool_choice names {name!r}, which is not among the tools")
        fn = named[0]
    else:
        fn = functions[zlib.crc32(rid.encode()) % len(functions)]
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return ("chatcmpl-tool-" + rid.rsplit("-", 1)[-1], str(fn.get("name", ""))), ("json", params)


def tgi_invalid(text: str, params: dict[str, Any], stream: bool = False) -> str | None:
    """TGI's validation message for what the sim checks (router/src/validation.rs), or None.
    A stream takes neither ``decoder_input_details`` nor ``best_of`` > 1 (ValidationError
    PrefillDetailsStream, BestOfStream)."""
    if not text:
        return "`inputs` cannot be empty"
    if stream and params.get("decoder_input_details") is True:
        return "`decoder_input_details` == true is not supported when streaming tokens"
    best_of = params.get("best_of")
    if stream and best_of is not None and best_of != 1:
        return "`best_of` != 1 is not supported when streaming tokens"
    if params.get("max_new_tokens") == 0:
        return "`max_new_tokens` must be strictly positive"
    return tgi_problem(params)  # the sampling fields
