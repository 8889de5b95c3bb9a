"""The simulated engine's outcomes, pinned: speed work on the scheduler must not move a token.

Each case drives a small schedule (warm-up, then open-loop sends) through ``sim.virtual.run``
and digests every request's state, token times, cached tokens, replica and queue time. The
expected digests were computed on the scheduler before its per-token path was made cheaper
(issue 18, speed targets); a change that alters any simulated outcome fails here by name. They were
re-pinned once on purpose, for issue 35's serial front end (``EngineProfile.frontend_serial_ms``: the
warm-up's four requests sent together now reach the scheduler 1 ms apart; start and end times moved
by at most 0.1 s, the preemptions are the same), and the KV-bound case once more when a waiting request
stopped holding the cached blocks of its prompt (``Instance._unadmit_prefix``, as vLLM's scheduler: 44 -> 7
preemptions, the end 40.35 -> 40.63 s).
The cases cover the default mixed policy over DP, pipeline parallelism, the prefill-first
policies of the SGLang and TGI flavours, prefill/decode disaggregation, and a KV-bound 70B
with jitter that preempts.
"""

from __future__ import annotations

import hashlib

import pytest

from bench_llm.bench.virtual import virtual_engine
from bench_llm.launch.config import ParallelConfig
from bench_llm.sim.backend import ModelBackend
from bench_llm.sim.virtual import Plan, Send, run

#: (model, parallel, engine args, flavour, requests, prompt, output, gap ns, shared prefixes)
#: -> (digest, measured start ns, end ns, preemptions)
CASES = {
    "dp2-vllm": (("llama-3.1-8b", {"tp": 1, "dp": 2}, ("--max-num-seqs=16",), "vllm", 200, 300, 40, 5_000_000, False),
                 ("89c7a9764b94888a", 416099958, 3594800577, 0)),
    "pp2-prefix": (("llama-3.1-8b", {"tp": 1, "pp": 2}, ("--max-num-seqs=8",), "vllm", 150, 500, 30, 3_000_000, True),
                   ("3f9efe0b796d42b8", 435112633, 7363765819, 0)),
    "sglang-tp2": (("llama-3.1-8b", {"tp": 2, "dp": 1}, ("--max-num-seqs=32",), "sglang", 150, 700, 30, 2_000_000, True),
                   ("89734ffbc939aacf", 271038077, 1891973532, 0)),
    "tgi": (("llama-3.1-8b", {"tp": 1, "dp": 1}, ("--max-num-seqs=16",), "tgi", 120, 400, 30, 4_000_000, False),
            ("78962599ee46a1a8", 398947516, 4487233748, 0)),
    "disagg-1-2": (("llama-3.1-8b", {"tp": 1, "dp": 1}, ("--max-num-seqs=16", "--disagg=1:2"), "vllm", 120, 600, 30,
                    3_000_000, True),
                   ("ba13410d2073fa39", 381831801, 1765702330, 0)),
    "70b-kv-bound": (("llama-3.1-70b", {"tp": 2, "dp": 1}, ("--max-num-seqs=256", "--jitter=0.05"), "vllm", 150, 2000,
                      200, 1_000_000, False),
                     ("98637e56aa75e2c1", 4401907231, 40626461571, 7)),
}  # fmt: skip


def _digest(
    model: str, parallel: dict[str, int], args: tuple[str, ...], flavor: str, n: int, prompt: int, output: int,
    gap_ns: int, shared: bool,
) -> tuple[str, int, int, int]:
    engine = virtual_engine(model, "h100", ParallelConfig(**parallel), args, flavor)
    backend = ModelBackend(engine.timing)
    sends = []
    for i in range(n):
        base = i % 3 * 1000 if shared else i * 10_000  # shared: three prompt families hit the prefix cache
        hashes = backend.hashes_for(list(range(base, base + prompt)))
        sends.append(Send(prompt + i % 7 * 13, output + i % 5 * 3, hashes, warmup=i < 4,
                          at_ns=(i - 4) * gap_ns if i >= 4 else None))  # fmt: skip
    result = run(backend, sends, Plan())
    h = hashlib.sha256()
    for o in result.outcomes:
        h.update(repr((o.state, o.intended_ns, o.token_ns, o.end_ns, o.cached_tokens, o.replica, o.queue_ns)).encode())
    return h.hexdigest()[:16], result.t0_ns, result.end_ns, backend.preemptions


@pytest.mark.parametrize("case", sorted(CASES))
def test_simulated_outcomes_are_pinned(case: str) -> None:
    inputs, expected = CASES[case]
    assert _digest(*inputs) == expected  # type: ignore[arg-type]
