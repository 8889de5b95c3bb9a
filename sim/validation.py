"""Predicted vs published figures for the reference's validation rows (simulator-model.md §3.4/§4).

Each row is run through the modelled engine in virtual time (the same scheduler and cost
model the server uses). ``rows()`` returns (name, metric, published, predicted).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.backend import Arrival, ModelBackend, Outcome, _Collect, simulate
from sim.options import ModelTiming
from sim.request import SimRequest


@dataclass(frozen=True)
class Row:
    name: str
    metric: str
    published: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1.0


def _batch(timing: ModelTiming, n: int, prompt: int, output: int) -> float:
    """e2e (ms) of a fixed batch of ``n`` requests submitted together (vLLM's latency benchmark)."""
    outs = simulate(ModelBackend(timing), [Arrival(0.0, prompt, output) for _ in range(n)])
    return max(o.e2e_s for o in outs) * 1e3


def _single(timing: ModelTiming, prompt: int, output: int) -> tuple[float, float]:
    """(TTFT ms, mean ITL ms) of one request alone."""
    (o,) = simulate(ModelBackend(timing), [Arrival(0.0, prompt, output)])
    return o.ttft_s * 1e3, o.tpot_s * 1e3


def closed_loop(timing: ModelTiming, concurrency: int, requests: int, prompt: int, output: int) -> list[Outcome]:
    """``concurrency`` requests kept in flight (a finished request is replaced at once), virtual time."""
    backend = ModelBackend(timing)
    outs: list[Outcome] = []
    due: list[int] = []

    class Replace(_Collect):
        def emit(self, req: SimRequest, n: int, intended_ns: tuple[int, ...], finished: bool) -> None:
            super().emit(req, n, intended_ns, finished)
            if finished and len(outs) + len(due) < requests:
                due.append(intended_ns[-1])

    def submit(at: int) -> None:
        out = Outcome(at, prompt)
        outs.append(out)
        backend.submit(SimRequest(f"r{len(outs)}", at, prompt, output, Replace(out)))

    for _ in range(concurrency):
        submit(0)
    while (ev := backend.next_event_ns()) is not None:
        backend.advance(ev)
        while due:
            submit(due.pop())
    return outs


def load_rows() -> list[Row]:
    """NIM row 5 under closed-loop load (FP8 weights and KV cache, as NIM serves it). Informational:
    ITL tracks the published figures; TTFT under load is higher (vLLM-style FCFS chunked prefill
    of synchronised arrivals vs NIM's scheduler)."""
    t = ModelTiming("llama-3.1-70b", "h100", "fp8", kv_dtype="fp8", tp=2)
    out = []
    for c, ttft, itl in ((5, 546.7, 21.83), (25, 688.7, 38.75), (50, 834.5, 59.73), (100, 7996.0, 92.9)):
        o = closed_loop(t, c, 3 * c, 5000, 500)[c:]
        out.append(Row(f"NIM 70B FP8 TP2 5000/500 concurrency {c}", "ITL ms", itl,
                       sum(x.tpot_s for x in o) / len(o) * 1e3))
        out.append(Row(f"NIM 70B FP8 TP2 5000/500 concurrency {c}", "TTFT ms", ttft,
                       sum(x.ttft_s for x in o) / len(o) * 1e3))
    return out


def rows() -> list[Row]:
    out: list[Row] = []
    for gpu, e2e_8b, e2e_70b, src in (("h200", 833.4, 2077.5, "vLLM CI H200"), ("h100", 997.5, 2444.5, "vLLM CI H100")):
        t8 = ModelTiming("llama-3.1-8b", gpu, "bf16", tp=1)
        p = _batch(t8, 8, 32, 128)
        out.append(Row(f"{src} Llama-3.1-8B TP1 bs8 32/128", "e2e ms", e2e_8b, p))
        t70 = ModelTiming("llama-3.1-70b", gpu, "bf16", tp=4)
        p = _batch(t70, 8, 32, 128)
        out.append(Row(f"{src} Llama-3-70B TP4 bs8 32/128", "e2e ms", e2e_70b, p))
    nim = ModelTiming("llama-3.1-70b", "h100", "fp8", tp=2)
    ttft, itl = _single(nim, 5000, 500)
    out.append(Row("NIM 2xH100 70B FP8 TP2 c1 5000/500", "TTFT ms", 406.8, ttft))
    out.append(Row("NIM 2xH100 70B FP8 TP2 c1 5000/500", "ITL ms", 18.58, itl))
    ttft, itl = _single(nim, 500, 2000)
    out.append(Row("NIM 2xH100 70B FP8 TP2 c1 500/2000", "TTFT ms", 47.77, ttft))
    out.append(Row("NIM 2xH100 70B FP8 TP2 c1 500/2000", "ITL ms", 18.91, itl))
    for tp, published in ((4, 29.7), (8, 29.8)):
        legacy = ModelTiming("llama-3.1-70b", "h100", "bf16", tp=tp, profile="legacy-2023")
        _, itl = _single(legacy, 128, 64)
        out.append(Row(f"Splitwise 2023 vLLM H100 70B TP{tp} bs1 (legacy)", "token ms", published, itl))
    return out


def table(which: list[Row] | None = None) -> str:
    lines = [f"{'row':<46} {'metric':<8} {'published':>10} {'predicted':>10} {'error':>7}"]
    for r in rows() if which is None else which:
        lines.append(f"{r.name:<46} {r.metric:<8} {r.published:>10.1f} {r.predicted:>10.1f} {r.error:>+7.1%}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
    print("\nunder load (informational):")
    print(table(load_rows()))
