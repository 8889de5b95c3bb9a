"""``RequestRecorder.finish`` reads the events column-wise for speed. Here it is checked
against the plain per-event definition on many random streams (every field set or not,
every kind, counters that stall, go back or skip)."""

from __future__ import annotations

import random

from bench_llm.adapters.base import EventKind, StreamEvent
from bench_llm.adapters.openai import OpenAIStreamParser
from bench_llm.loadgen.recorder import SOURCE_CHUNKS, RequestRecorder, _token_counts
from bench_llm.workloads.spec import RequestSpec


def _reference(events: list[StreamEvent]) -> dict[str, object]:
    """The definition, one event at a time."""
    finish_reason = prompt_tokens = completion_tokens = cached_tokens = server_id = None
    for ev in events:
        if ev.finish_reason is not None:
            finish_reason = ev.finish_reason
        if ev.prompt_tokens is not None:
            prompt_tokens = ev.prompt_tokens
        if ev.completion_tokens is not None:
            completion_tokens = ev.completion_tokens
        if ev.cached_tokens is not None:
            cached_tokens = ev.cached_tokens
        if server_id is None and ev.server_request_id:
            server_id = ev.server_request_id
    if any(ev.cumulative is not None for ev in events):
        counts, last = [], 0
        for ev in events:
            c = ev.cumulative
            if c is not None and c > last:
                counts.append(c - last)
                last = c
            else:
                counts.append(0)
    else:
        counts, _, _ = _token_counts(
            [ev.kind for ev in events], [ev.text for ev in events], [ev.tokens for ev in events],
            completion_tokens, [None] * len(events),
        )
    return {
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": cached_tokens,
        "server_request_id": server_id,
        "chunk_tokens": counts,
    }


def _random_event(rng: random.Random, cum: int) -> StreamEvent:
    def maybe(value: object) -> object:
        return value if rng.random() < 0.3 else None

    kind = rng.choice([EventKind.CONTENT, EventKind.CONTENT, EventKind.REASONING, EventKind.EMPTY, EventKind.USAGE, EventKind.ROLE])
    return StreamEvent(
        kind,
        rng.choice(["", "a", "bc"]),
        maybe(rng.randint(0, 3)),
        cum if rng.random() < 0.7 else None,
        maybe(rng.choice(["stop", "length"])),
        maybe(rng.randint(1, 99)),
        maybe(rng.randint(1, 99)),
        maybe(rng.randint(0, 9)),
        maybe(rng.choice(["", "id-1", "id-2"])),
    )


def test_finish_matches_the_per_event_definition() -> None:
    rng = random.Random(7)
    spec = RequestSpec("r", 4, 64, prompt="p")
    for trial in range(400):
        rec = RequestRecorder(spec, OpenAIStreamParser(False), 0, 0)
        rec.sent(1)
        rec.headers(2, 200)
        events, cum = [], 0
        for _ in range(rng.randint(0, 40)):
            cum += rng.choice([0, 1, 1, 2, -1])  # stalls and steps back are possible
            events.append(_random_event(rng, max(cum, 0)))
        if trial % 3 == 0:  # streams without any cumulative counter
            events = [ev._replace(cumulative=None) for ev in events]
        rec._events = list(events)
        rec._ts = [10 + i for i in range(len(events))]
        rec._done = True
        record = rec.finish(1000)
        want = _reference(events)
        got = {name: getattr(record, name) for name in want}
        assert got == want, trial
        assert record.output_tokens == sum(want["chunk_tokens"])  # type: ignore[arg-type]
        if record.token_source != SOURCE_CHUNKS and record.first_token_ns is not None:
            i = record.chunk_ns.index(record.first_token_ns)
            assert record.chunk_tokens[i] > 0 and not any(record.chunk_tokens[:i])
