"""Prompt synthesis to a target token count.

Three ways, in order of preference (``PromptSynth.source`` is recorded per request as
``RequestSpec.input_tokens_source``):

``tokenizer``
    A local Hugging Face tokenizer folder (``tokenizer.json``; the ``tokenizers`` or
    ``transformers`` package must be installed). Word text is encoded, cut to the exact
    number of token ids and decoded, then checked by re-encoding.
``server_tokenize``
    The engine's ``POST /tokenize`` endpoint (vLLM, SGLang, the simulated engine).
    Words are added or removed until the server counts exactly the target.
``approx``
    No tokenizer: prompts are made of short common English words, each written with
    its leading space (``" the"``). The simulated engine counts each as exactly one
    token, so lengths are exact there; BPE tokenizers of real models also give about
    one token per such word, but the count is an approximation. The engine's own
    ``prompt_tokens`` is recorded with every request, so the achieved length is known.

Chat APIs add the model's chat template around the messages; those tokens are not
part of the target (they are in the engine-reported ``prompt_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench_llm.core.control import ControlError, EngineClient
from bench_llm.core.memo import SizedMemo
from bench_llm.core.tokenizer import VOCAB
from bench_llm.workloads.errors import WorkloadError

_VOCAB_ARRAY = np.asarray(VOCAB, dtype=object)


def synth_prompt(n_tokens: int, rng: np.random.Generator, prefix: str = "") -> str:
    """A prompt of ``n_tokens`` one-token words (after an optional shared ``prefix``)."""
    if n_tokens <= 0:
        return prefix
    idx = rng.integers(0, len(VOCAB), size=n_tokens)
    body = "".join(_VOCAB_ARRAY[idx])
    return (prefix + body) if prefix else body.lstrip()


def words(n: int, rng: np.random.Generator) -> list[str]:
    return list(_VOCAB_ARRAY[rng.integers(0, len(VOCAB), size=max(0, n))])


class PromptSynth:
    """Builds prompt text of an exact token count with one of the three methods above."""

    source = "approx"

    def count(self, text: str) -> int:
        from bench_llm.core.tokenizer import count_tokens

        return count_tokens(text)

    def text(self, n_tokens: int, rng: np.random.Generator, prefix: str = "") -> str:
        """``prefix`` followed by new text, ``n_tokens`` in total after the prefix."""
        return synth_prompt(n_tokens, rng, prefix)

    def texts(self, count: int, n_tokens: int, rng: np.random.Generator) -> list[str]:
        """``count`` prompts of ``text(n_tokens, rng)``, the very strings ``count`` calls in a
        row would give. The word approximation draws every word in one call: a Generator's
        integers come as one stream however the draws are split (tests/workloads pin it), and
        one draw of 128,000 costs what a handful of draws of 128 do."""
        if type(self).text is not PromptSynth.text or n_tokens <= 0:
            return [self.text(n_tokens, rng) for _ in range(count)]
        key = _texts_key(count, n_tokens, rng)
        hit = _TEXTS.get(key) if key is not None else None
        if hit is not None:  # the same draw as before (a sweep's cells share their loads' prompts)
            rng.bit_generator.state = hit[1]
            return list(hit[0])
        words = _VOCAB_ARRAY[rng.integers(0, len(VOCAB), size=count * n_tokens)].tolist()  # (indexed in C)
        out = ["".join(words[k : k + n_tokens]).lstrip() for k in range(0, count * n_tokens, n_tokens)]
        if key is not None:
            _TEXTS.put(key, (tuple(out), rng.bit_generator.state), count * n_tokens)
        return out

    def describe(self) -> dict[str, object]:
        return {"method": self.source}


_DrawKey = tuple[int, int, int, int, int, int]


#: ``PromptSynth.texts`` answers by (count, tokens, generator state before the draw): the
#: prompts and the generator's state after it. The cells of a sweep draw the same prompts for
#: their n-th loads. At most 2**21 words are kept (~12 MB): the oldest draws go first.
_TEXTS: SizedMemo[_DrawKey, tuple[tuple[str, ...], Mapping[str, Any]]] = SizedMemo(1 << 21)


def _texts_key(count: int, n_tokens: int, rng: np.random.Generator) -> _DrawKey | None:
    """``_TEXTS``'s key for a draw from ``rng`` (PCG64, numpy's default; None otherwise or too large)."""
    if count * n_tokens > _TEXTS.limit:
        return None
    st = rng.bit_generator.state
    if st.get("bit_generator") != "PCG64":
        return None
    inner = st["state"]
    return (count, n_tokens, int(inner["state"]), int(inner["inc"]), int(st["has_uint32"]), int(st["uinteger"]))


class _CountingSynth(PromptSynth):
    """Adjusts a word list until ``count(prefix + text) == count(prefix) + n``."""

    def __init__(self, count: Callable[[str], int]) -> None:
        self._count = count
        self.misses = 0

    def count(self, text: str) -> int:
        return self._count(text)

    def text(self, n_tokens: int, rng: np.random.Generator, prefix: str = "") -> str:
        base = self._count(prefix) if prefix else 0
        target = base + n_tokens
        pool = words(max(8, int(n_tokens * 1.25) + 8), rng)

        def join(m: int) -> str:
            body = "".join(pool[:m])
            return prefix + body if prefix else body.lstrip()

        tries: dict[int, int] = {}  # words used -> tokens counted
        m = n_tokens
        for _ in range(8):
            m = max(0, min(m, len(pool)))
            if m in tries:  # the count steps over the target: nothing new to learn this way
                break
            got = tries[m] = self._count(join(m))
            if got == target:
                return join(m)
            # scale by the tokens per word seen so far (words of several tokens overshoot a
            # one-word-per-token step), at least one word towards the target
            nxt = round(m * n_tokens / (got - base)) if got > base and m > 0 else m + target - got
            m = nxt if nxt != m else m + (1 if got < target else -1)
            if m > len(pool):
                pool += words(m - len(pool) + 8, rng)
        below = max((k for k, c in tries.items() if c < target), default=None)
        if below is not None:
            filled = self._fill(join(below), target, target - tries[below], bool(prefix) or below > 0)
            if filled is not None:
                return filled
        self.misses += 1
        return join(min(tries, key=lambda k: (abs(tries[k] - target), k)))  # the closest try, not the last

    def _fill(self, text: str, target: int, missing: int, keep_space: bool) -> str | None:
        """``text`` plus ``missing`` one-token words, where one of the fillers makes it exact
        (a word with its leading space is one token in most tokenizers, and pre-tokenizers
        split at spaces, so counts add up)."""
        for word in _FILLERS:
            tail = word * missing
            candidate = text + (tail if keep_space else tail.lstrip())
            if self._count(candidate) == target:
                return candidate
        return None


#: Words tried, repeated, to close the last few tokens of a prompt (``_CountingSynth._fill``).
_FILLERS = (" the", " a", " of")


class TokenizerSynth(_CountingSynth):
    """A local Hugging Face tokenizer folder (or ``tokenizer.json`` file)."""

    source = "tokenizer"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        encode, decode = _load_hf_tokenizer(self.path)
        self._encode = encode
        self._decode = decode
        super().__init__(lambda t: len(encode(t)))

    def text(self, n_tokens: int, rng: np.random.Generator, prefix: str = "") -> str:
        pool = "".join(words(int(n_tokens * 1.3) + 16, rng))
        ids = self._encode(pool)
        while len(ids) < n_tokens:
            pool += "".join(words(n_tokens, rng))
            ids = self._encode(pool)
        body = self._decode(ids[:n_tokens])
        candidate = prefix + body if prefix else body
        if self._count(candidate) == (self._count(prefix) if prefix else 0) + n_tokens:
            return candidate
        return super().text(n_tokens, rng, prefix)  # fall back to word adjustment

    def describe(self) -> dict[str, object]:
        return {"method": self.source, "tokenizer": str(self.path)}


def _load_hf_tokenizer(path: Path) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    file = path / "tokenizer.json" if path.is_dir() else path
    if not path.exists():
        raise WorkloadError(f"tokenizer {path}: no such folder or file")
    try:
        from tokenizers import Tokenizer  # type: ignore[import-not-found]
    except ImportError:
        Tokenizer = None
    if Tokenizer is not None and file.is_file():
        tok = Tokenizer.from_file(str(file))
        return (lambda t: tok.encode(t, add_special_tokens=False).ids), (lambda ids: tok.decode(ids))
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found]
    except ImportError:
        raise WorkloadError(
            f"tokenizer {path}: needs the 'tokenizers' or 'transformers' package (pip install tokenizers); "
            "without it, omit the tokenizer to use the engine's /tokenize or the word approximation"
        ) from None
    try:
        hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # transformers raises many types
        raise WorkloadError(f"tokenizer {path}: cannot load ({type(exc).__name__}: {str(exc)[:120]})") from None
    return (lambda t: hf.encode(t, add_special_tokens=False)), (lambda ids: hf.decode(ids))


class ServerTokenizeSynth(_CountingSynth):
    """The engine's ``/tokenize`` endpoint counts the tokens."""

    source = "server_tokenize"

    def __init__(self, url: str, model: str | None = None, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self._client = EngineClient(self.url, timeout_s)
        self._overhead = 0
        super().__init__(self._server_count)
        # calibrate: tokens the server adds to any prompt (BOS and the like)
        self._overhead = self._raw_count("")
        if self._raw_count(" the of and") - self._overhead <= 0:
            raise WorkloadError(f"{self.url}/tokenize: counts no tokens for plain words")

    def _raw_count(self, text: str) -> int:
        try:
            return self._client.count_tokens(text, self.model)
        except ControlError as exc:
            raise WorkloadError(str(exc)) from None

    def _server_count(self, text: str) -> int:
        return self._raw_count(text) - self._overhead

    def describe(self) -> dict[str, object]:
        return {"method": self.source, "url": self.url, "overhead_tokens": self._overhead}


def make_synth(tokenizer: str | None = None, tokenize_url: str | None = None, model: str | None = None) -> PromptSynth:
    if tokenizer:
        return TokenizerSynth(tokenizer)
    if tokenize_url:
        return ServerTokenizeSynth(tokenize_url, model)
    return PromptSynth()


class BlockTexts:
    """Deterministic text blocks keyed by an id: the same id always gives the same words.

    Used for shared prefixes and Mooncake ``hash_ids``: two requests that share a block
    id share its exact text, so a prefix cache sees the reuse the trace recorded.
    """

    def __init__(self, seed: int, block_tokens: int, salt: int = 0) -> None:
        self.seed = seed
        self.block_tokens = block_tokens
        self.salt = salt
        self._cache: dict[int, str] = {}

    def block(self, key: int) -> list[str]:
        rng = np.random.default_rng([self.seed, self.salt, key])
        return words(self.block_tokens, rng)

    def text(self, keys: tuple[int, ...], n_tokens: int) -> str:
        """The blocks' words concatenated, cut to ``n_tokens`` words."""
        parts: list[str] = []
        left = n_tokens
        for key in keys:
            if left <= 0:
                break
            s = self._cache.get(key)
            if s is None:
                s = "".join(self.block(key))
                if len(self._cache) < 20_000:
                    self._cache[key] = s
            if left >= self.block_tokens:
                parts.append(s)
            else:
                parts.append("".join(self.block(key)[:left]))
            left -= self.block_tokens
        return "".join(parts)


#: Prompts a default check sends to the engine's /tokenize (``word_prompts_exact``).
CHECK_PROMPTS = 3


def word_prompts_exact(url: str, model: str | None, prompts: Sequence[tuple[str, int]],
                       timeout_s: float = 5.0) -> tuple[bool | None, str]:  # fmt: skip
    """Does the engine at ``url`` count these word-approximated prompts ((text, requested
    tokens), a few) at their requested length, beyond the tokens it adds to every prompt?
    (True, why): they are exact already (the simulated engine counts a word as a token);
    (False, why): they are not, and exact prompts need its /tokenize; (None, why): the engine
    cannot say (no /tokenize, an error). ``why`` says by how much, or what failed."""
    client = EngineClient(url.rstrip("/"), timeout_s)
    shown = without_credentials(url)
    try:
        overhead = client.count_tokens("", model)
        got = [(client.count_tokens(text, model) - overhead, want) for text, want in prompts[:CHECK_PROMPTS]]
    except ControlError as exc:
        return None, str(exc).replace(url.rstrip("/"), shown.rstrip("/"))
    if not got:
        return None, "no prompt to check"
    if all(g == w for g, w in got):
        return True, f"{shown}/tokenize counts the word prompts at their requested lengths"
    ratio = sum(g for g, _ in got) / max(1, sum(w for _, w in got))
    return False, f"{shown}/tokenize counts the word prompts at {ratio:.2f}x their requested lengths"


def without_credentials(url: str) -> str:
    """``url`` without a ``user:password@`` part (for messages)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))
