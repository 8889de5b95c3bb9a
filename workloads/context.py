"""Fitting a schedule into the context length an engine serves, before anything is sent.

A request needs its prompt plus its output inside the context. Its prompt is estimated from
the requested length (``input_tokens``) plus, for a later turn of a session, every earlier
turn's prompt and answer (the history loadgen sends with it), plus ``MARGIN_TOKENS`` for what
the engine adds (BOS) and, with a chat API, ``CHAT_MESSAGE_TOKENS`` per message for its chat
template. A request whose output does not fit has its output
length cut to what does (``min_tokens`` follows, adapters send both from it); one whose
prompt alone does not fit is refused: not sent, recorded as a failed row saying why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from bench_llm.workloads.spec import RequestSpec, Schedule

#: Tokens kept free for what the engine adds around a prompt (BOS, special tokens).
MARGIN_TOKENS = 16
#: With a chat API, tokens kept free per message for the chat template's framing (the tiny
#: test Llama's template adds 17 around one message; later turns carry two messages per
#: earlier turn).
CHAT_MESSAGE_TOKENS = 32


@dataclass(frozen=True)
class ContextFit:
    schedule: Schedule
    context_tokens: int
    #: requests whose output length was cut to fit
    cut: int
    #: requests refused (not sent): their prompt alone does not fit
    refused: int
    #: later turns of sessions with a refused turn (not sent either; recorded as skipped)
    skipped: int
    #: requests whose prompt length is an approximation (word text), so the fit is too
    approximate: int

    def message(self, where: str) -> str | None:
        """One line for the user and the run's notes; None when every request fits as it is."""
        if not self.cut and not self.refused:
            return None
        parts = []
        if self.cut:
            parts.append(f"{self.cut} requests' output length cut to fit")
        if self.refused:
            parts.append(f"{self.refused} requests refused (prompt alone does not fit; recorded as failed, not sent)")
        if self.skipped:
            parts.append(f"{self.skipped} later turns of their sessions skipped (recorded, not sent)")
        text = f"served context {self.context_tokens} tokens ({where}): " + "; ".join(parts)
        if self.approximate:
            text += "; prompt lengths are word approximations (exact with --tokenizer or --tokenize-url auto)"
        return text


def fit_to_context(schedule: Schedule, context_tokens: int, chat: bool = False) -> ContextFit:
    """``schedule`` with every request fitted into ``context_tokens`` (see the module doc);
    ``chat``: the requests go to a chat API (``CHAT_MESSAGE_TOKENS`` per message kept free)."""
    history: dict[str, int] = {}  # session -> tokens of its earlier turns, as sent
    turns: dict[str, int] = {}  # session -> earlier turns
    ended: set[str] = set()  # sessions with a refused turn: loadgen skips their later turns
    cut = refused = skipped = approximate = 0
    out: list[RequestSpec] = []
    for spec in _in_turn_order(schedule.requests):
        if spec.session_id in ended:
            skipped += 1
            out.append(spec)
            continue
        before = history.get(spec.session_id, 0) if spec.session_id else 0
        messages = 1 + 2 * turns.get(spec.session_id, 0) if spec.session_id else 1
        margin = MARGIN_TOKENS + (CHAT_MESSAGE_TOKENS * messages if chat else 0)
        prompt = before + spec.input_tokens + margin
        room = context_tokens - prompt
        new = spec
        if room < 1:
            why = f"prompt ~{prompt - margin} tokens" + (" with its session's history" if before else "")
            new = dataclasses.replace(spec, refused=f"{why} does not fit the served context of {context_tokens} tokens")
            refused += 1
            if spec.session_id:
                ended.add(spec.session_id)
        elif spec.max_output_tokens > room:
            new = dataclasses.replace(spec, max_output_tokens=room)
            cut += 1
        if new is not spec and spec.input_tokens_source == "approx":
            approximate += 1
        if spec.session_id:
            history[spec.session_id] = before + spec.input_tokens + new.max_output_tokens
            turns[spec.session_id] = turns.get(spec.session_id, 0) + 1
        out.append(new)
    order = {s.request_id: i for i, s in enumerate(schedule.requests)}
    out.sort(key=lambda s: order[s.request_id])
    fitted = dataclasses.replace(schedule, requests=tuple(out)) if (cut or refused) else schedule
    return ContextFit(fitted, context_tokens, cut, refused, skipped, approximate)


def _in_turn_order(specs: Iterable[RequestSpec]) -> list[RequestSpec]:
    return sorted(specs, key=lambda s: (s.session_id or "", s.turn) if s.session_id else ("", 0))
