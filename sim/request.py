"""One request inside the simulated engine, and how its tokens leave it."""

from __future__ import annotations

from typing import Protocol


class TokenSink(Protocol):
    """Receives a request's tokens as the engine emits them (must return quickly)."""

    def emit(self, req: "SimRequest", n: int, intended_ns: tuple[int, ...], finished: bool) -> None:
        ...


class SimRequest:
    """Mutable engine-side state of one request (times in perf_counter ns)."""

    __slots__ = (
        "rid", "arrival_ns", "ready_ns", "prompt_len", "block_hashes", "max_tokens", "sink",
        "num_computed", "generated", "cached_tokens", "shared_blocks", "private_blocks", "admitted_ns",
        "first_token_ns", "last_token_ns", "finished", "aborted", "replica", "prefill_done_ns", "in_flight",
        "prefilled_remote", "preemptions", "finish_reason", "cache_checked", "tag", "prefill_target",
        "token_times", "seqs", "step_tokens",
    )

    def __init__(
        self,
        rid: str,
        arrival_ns: int,
        prompt_len: int,
        max_tokens: int,
        sink: TokenSink | None = None,
        block_hashes: tuple[int, ...] = (),
        ready_ns: int | None = None,
    ) -> None:
        self.rid = rid
        self.arrival_ns = arrival_ns
        #: when the engine may schedule it (arrival + HTTP/tokenizer overhead)
        self.ready_ns = arrival_ns if ready_ns is None else ready_ns
        self.prompt_len = max(1, prompt_len)
        self.block_hashes = block_hashes
        self.max_tokens = max(1, max_tokens)
        self.sink = sink
        self.num_computed = 0
        self.generated = 0
        self.cached_tokens = 0
        self.shared_blocks: list[int] = []
        self.private_blocks = 0
        self.admitted_ns: int | None = None
        self.first_token_ns: int | None = None
        self.last_token_ns: int | None = None
        self.prefill_done_ns: int | None = None
        self.finished = False
        self.aborted = False
        self.replica = -1
        self.in_flight = False
        self.prefilled_remote = False
        self.preemptions = 0
        self.finish_reason = "length"
        self.cache_checked = False
        self.tag: object = None
        #: tokens whose KV must be computed before the next token can be sampled
        self.prefill_target = self.prompt_len
        #: a sink that only records token times may hand its list here: the backend appends
        #: each token's time to it and calls the sink for the last token only (once per token
        #: in virtual time, so the call is worth saving)
        self.token_times: list[int] | None = None
        #: sequences generated (sampling ``n``): they share the prefill and are decoded in the same
        #: steps, each step charging ``seqs`` decode tokens (scheduler ``_launch``); ``generated``
        #: counts one sequence's tokens
        self.seqs = 1
        #: tokens the last step gave it (more than 1 only with speculative decoding: accepted drafts)
        self.step_tokens = 1

    @property
    def total_len(self) -> int:
        return self.prompt_len + self.generated

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prefill_target


def prefix_block_hashes(token_ids: list[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of the full blocks of a prompt (a block's hash covers everything before it)."""
    out = []
    h = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        h = hash((h, tuple(token_ids[start : start + block_size])))
        out.append(h)
    return tuple(out)
