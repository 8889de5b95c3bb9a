"""Client CPU to parse one SGLang native stream whose events repeat every output id so far.

Usage: python benchmarks/sglang_output_ids.py [TOKENS ...]
SGLang 0.5.x without --incremental-streaming-output sends all ids on every event (O(n²) bytes
per request). Prints, per output length, the stream's bytes, the time to parse every event by
decoding the whole JSON (what the parser did) and with the parser, which skips the ids, the time
the compiled read path takes to frame, scan and hand back the same stream (loadgen/_fastpath.c,
one read per event, the record's columns included; "-" when it is not built), and the time the
simulated engine's SGLang flavour takes to write the stream (sim/wire.py).
Best of 5; run them side by side on the same host (timings on a shared host are noisy).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_llm.adapters.sglang import SGLangStreamParser  # noqa: E402
from bench_llm.loadgen.recorder import _FAST_KINDS, _NFIELDS, RequestRecorder  # noqa: E402
from bench_llm.sim.wire import SGLangWire  # noqa: E402


def events(n: int) -> list[bytes]:
    ids: list[int] = []
    out = []
    text = ""
    for i in range(n):
        ids.append(1000 + (i * 7919) % 30000)
        text += " tok"
        meta = {"id": "r", "finish_reason": None, "prompt_tokens": 128, "completion_tokens": i + 1, "cached_tokens": 0}
        out.append(orjson.dumps({"text": text, "output_ids": ids, "meta_info": meta}))
    return out


def compiled(chunks: list[bytes]) -> None:
    """The stream through ``FastStream.feed`` (one HTTP chunk per read), then its columns."""
    from bench_llm.loadgen import _fastpath
    from bench_llm.workloads.spec import RequestSpec

    rec = RequestRecorder(RequestSpec("r", 128, len(chunks), prompt="p"), SGLangStreamParser(), 0, 0)
    fast = _fastpath.FastStream(-1, False, 0, _fastpath.API_SGLANG, rec, lambda *a: None)
    rec.use_fast(fast)
    for i, c in enumerate(chunks):
        fast.feed(i, c)
    fast.flush(rec)
    fast.columns(_FAST_KINDS, _NFIELDS)


def best(fn: Callable[[], object], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [256, 1024, 4096]
    try:
        from bench_llm.loadgen import _fastpath  # noqa: F401
    except ImportError:
        built = False
    else:
        built = True
    print(f"{'tokens':>7} {'stream MB':>10} {'decode all ms':>14} {'parser ms':>10} {'C scan ms':>10} {'sim writes ms':>14}")
    for n in sizes:
        evs = events(n)
        full = best(lambda: [orjson.loads(e) for e in evs])
        parser = best(lambda: list(map(SGLangStreamParser().parse, evs)))  # one parser per stream
        mb = sum(map(len, evs)) / 1e6
        chunks = [b"%x\r\n%b\r\n" % (len(e) + 8, b"data: " + e + b"\n\n") for e in evs]
        scan = f"{1000 * best(lambda: compiled(chunks)):>10.1f}" if built else f"{'-':>10}"

        def write(n: int = n) -> None:
            wire = SGLangWire("r", 128, 0)
            for i in range(n):
                wire.tokens(" tok", i + 1, None)

        sim = best(write)
        print(f"{n:>7} {mb:>10.1f} {1000 * full:>14.1f} {1000 * parser:>10.1f} {scan} {1000 * sim:>14.1f}")


if __name__ == "__main__":
    main()
