"""Exact prompt lengths by default where the engine can say (``bench run``, ``bench sweep``).

A launched or ``--url`` engine whose profile has a tokenize route (vLLM, SGLang:
launch/profiles.py) is asked how many tokens a few of the word-approximated prompts hold.
Where it counts them at their requested lengths (the simulated engine, whose tokenizer counts
a word as a token) they are kept; where it does not, every prompt is made exact through its
/tokenize (workloads/prompts.py ``ServerTokenizeSynth``); where it cannot say, the word
prompts are kept and the run's and sweep's summaries say how far off they were.
``--tokenize-url off`` skips the check; ``--tokenizer DIR`` or a given URL decide instead.
"""

from __future__ import annotations

from pathlib import Path

from bench_llm.launch.profiles import profile
from bench_llm.workloads.prompts import CHECK_PROMPTS
from bench_llm.workloads.spec import Schedule

#: ``--tokenize-url`` values that keep the word approximation without asking the engine.
OFF = ("off", "none")


def exact_by_default(tokenize_url: str | None, tokenizer: str | Path | None, engine: str, measured_live: bool) -> bool:
    """Whether the engine is to be asked (nothing given, a live engine, a tokenize route).
    The simulated engine is not asked: its tokenizer and the word prompts count alike."""
    if tokenize_url is not None or tokenizer is not None or not measured_live or engine == "sim":
        return False
    return profile(engine).routes.tokenize is not None


def sample_prompts(schedule: Schedule, n: int = CHECK_PROMPTS) -> list[tuple[str, int]]:
    """(text, requested tokens) of the schedule's first few plain prompts (no session history)."""
    out: list[tuple[str, int]] = []
    for r in schedule.requests:
        if r.prompt and r.input_tokens > 0 and not r.session_id:
            out.append((r.prompt, int(r.input_tokens)))
            if len(out) >= n:
                break
    return out
