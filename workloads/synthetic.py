"""A synthetic workload from settings: fixed lengths, Poisson/constant arrivals or closed loop."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench_llm.workloads.arrivals import offsets_s, parse_arrival
from bench_llm.workloads.errors import WorkloadError
from bench_llm.workloads.prompts import PromptSynth
from bench_llm.workloads.spec import MAX_REQUEST_TOKENS, LoadMode, Phase, RequestSpec, Schedule

__all__ = ["SyntheticWorkload", "WorkloadError"]


@dataclass(frozen=True, slots=True)
class SyntheticWorkload:
    requests: int = 100
    input_tokens: int = 256
    output_tokens: int = 128
    rate: float | None = None  # requests/s (open loop); None with concurrency: closed loop
    arrival: str = "poisson"  # poisson | constant
    concurrency: int | None = None
    warmup: int = 0
    seed: int = 0
    #: Mixed into the prompt text only (lengths and arrivals stay the seed's): two runs with
    #: different salts share no cached prefix. None: the text follows the seed alone.
    salt: int | None = None

    def validate(self) -> None:
        if self.requests < 1:
            raise WorkloadError("$requests must be at least 1")
        if self.input_tokens < 1 or self.output_tokens < 1:
            raise WorkloadError("$input_tokens and $output_tokens must be at least 1")
        for setting, n in (("$input_tokens", self.input_tokens), ("$output_tokens", self.output_tokens)):
            if n > MAX_REQUEST_TOKENS:
                raise WorkloadError(f"{setting} {n:,}: more than a request can hold (at most {MAX_REQUEST_TOKENS:,})")
        if self.rate is not None and self.concurrency is not None:
            raise WorkloadError("give either $rate (open loop) or $concurrency (closed loop), not both")
        if self.rate is None and self.concurrency is None:
            raise WorkloadError("give $rate (requests/s, open loop) or $concurrency (closed loop)")
        if self.rate is not None and not (self.rate > 0 and np.isfinite(self.rate)):
            raise WorkloadError("$rate must be a positive number of requests per second")
        if self.concurrency is not None and self.concurrency < 1:
            raise WorkloadError("$concurrency must be at least 1")
        if self.arrival not in ("poisson", "constant"):
            raise WorkloadError(f"$arrival {self.arrival!r}: use poisson or constant")
        if self.warmup < 0:
            raise WorkloadError("$warmup must be >= 0")

    def schedule(self, synth: PromptSynth | None = None) -> Schedule:
        """The requests; ``synth`` makes the prompt text (default: the word approximation)."""
        self.validate()
        synth = synth or PromptSynth()
        rng = np.random.default_rng(self.seed)
        offsets: np.ndarray | None = None
        if self.rate is not None:  # the one schedule builder of arrival times (workloads/arrivals.py)
            seconds = offsets_s(parse_arrival(self.arrival), self.requests, self.rate, rng)
            offsets = np.round(seconds * 1e9).astype(np.int64)
        text_rng = rng if self.salt is None else np.random.default_rng([self.seed, self.salt])
        # every prompt in one call, warm-up first (the order the requests below take them)
        prompts = iter(synth.texts(self.warmup + self.requests, self.input_tokens, text_rng))
        input_tokens, output_tokens, source = self.input_tokens, self.output_tokens, synth.source

        def spec(request_id: str, phase: Phase, offset_ns: int | None) -> RequestSpec:
            return RequestSpec(
                request_id=request_id,
                input_tokens=input_tokens,
                max_output_tokens=output_tokens,
                prompt=next(prompts),
                send_offset_ns=offset_ns,
                phase=phase,
                input_tokens_source=source,
            )

        specs = [spec(f"w{i:06d}", "warmup", None) for i in range(self.warmup)]
        # (``tolist``: the offsets as Python ints at once, not one numpy scalar per request)
        sends_ns = offsets.tolist() if offsets is not None else [None] * self.requests
        specs += [spec(f"r{i:06d}", "measure", sends_ns[i]) for i in range(self.requests)]
        mode: LoadMode = "open" if self.rate is not None else "closed"
        return Schedule(
            name="synthetic",
            seed=self.seed,
            mode=mode,
            requests=tuple(specs),
            concurrency=self.concurrency,
            rate=self.rate,
            arrival=self.arrival if mode == "open" else "closed",
            description={
                "kind": "synthetic",
                "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
                "requests": self.requests,
                "warmup": self.warmup,
                "prompt": synth.describe(),
                "prompt_salt": self.salt,
            },
        )
