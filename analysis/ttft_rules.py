"""How each SGLang release times a request's queue and prefill, and the rule that reads a run.

SGLang (``--enable-metrics``) returns per-request timings in ``meta_info``; their names and
meanings changed between releases (docs/engines.md, "Per-request timings"), so the TTFT
split reads them by the release that sent them:

* **0.5.6–0.5.9** (``metrics/collector.py`` TimeStats): ``queue_time`` (waiting queue entry
  to forward entry), ``prefill_launch_delay`` (forward entry to the prefill batch's launch)
  and ``prefill_launch_latency`` (the launch itself). Prefill = delay + latency.
* **0.5.10–0.5.11** (``observability/req_time_stats.py``): ``queue_time``,
  ``prefill_waiting_latency`` (the same delay, renamed) and ``prefill_launch_latency``;
  prefill = waiting + launch. The wall-clock stamps below are there too.
* **0.5.12 on**: only ``queue_time`` and the wall-clock stamps ``forward_entry_time`` and
  ``prefill_finished_time`` (Unix seconds, one clock); prefill = finished − forward entry.
  Later releases add ``first_token_latency`` on the last event: the engine's own TTFT (from
  the request's arrival at its tokenizer manager to its first token there).

SGLang's request root span (0.5.10 on, ``--enable-trace``) carries ``gen_ai.request.id`` and
``gen_ai.latency.*`` attributes with SGLang's meanings, not vLLM's: ``time_to_first_token``
is the engine's TTFT, but ``time_in_model_prefill`` runs from the end of the dispatch to the
scheduler to the first token, so it **includes the scheduler queue**, and no attribute
times the queue. The split therefore takes the queue and prefill from the response when the
response has them, and otherwise labels the span's figure "queue + prefill".

Which rule reads a run: the engine's reported version when the run recorded one, else the
keys the responses carry (each generation's key set is its own); a version whose keys are not
in the payload is said so, and the payload's keys are read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TimingRule:
    """One generation's reading of ``meta_info`` timings."""

    name: str
    #: what it reads, for the split's statement
    reads: str

    def parts(self, timing: Mapping[str, Any]) -> dict[str, float]:
        """The parts this generation's keys give, in milliseconds (absent keys: no part).
        ``engine_ttft`` is the engine's own TTFT where the payload states it."""
        out: dict[str, float] = {}
        queue = _seconds(timing, "queue_time")
        if queue is not None:
            out["queue"] = 1000 * queue
        prefill = self._prefill(timing)
        if prefill is not None:
            out["prefill"] = 1000 * prefill
        kv = _seconds(timing, "kv_transfer_time")  # bench's simulated engine only (P/D)
        if kv is not None:
            out["kv_transfer"] = 1000 * kv
        ttft = _seconds(timing, "first_token_latency")
        if ttft is not None and self.name == RULE_STAMPS:
            out["engine_ttft"] = 1000 * ttft
        return out

    def _prefill(self, timing: Mapping[str, Any]) -> float | None:
        if self.name == RULE_058:
            pair = (_seconds(timing, "prefill_launch_delay"), _seconds(timing, "prefill_launch_latency"))
        elif self.name == RULE_0510:
            pair = (_seconds(timing, "prefill_waiting_latency"), _seconds(timing, "prefill_launch_latency"))
        else:
            entry, done = _seconds(timing, "forward_entry_time"), _seconds(timing, "prefill_finished_time")
            return done - entry if entry is not None and done is not None and entry > 0 and done >= entry else None
        known = [v for v in pair if v is not None]
        return sum(known) if known else None


RULE_058 = "sglang-0.5.6"
RULE_0510 = "sglang-0.5.10"
RULE_STAMPS = "sglang-0.5.12"
RULES = {
    RULE_058: TimingRule(RULE_058, "SGLang 0.5.6-0.5.9 meta_info: queue_time; prefill = prefill_launch_delay + "
                                   "prefill_launch_latency"),
    RULE_0510: TimingRule(RULE_0510, "SGLang 0.5.10-0.5.11 meta_info: queue_time; prefill = prefill_waiting_latency + "
                                     "prefill_launch_latency"),
    RULE_STAMPS: TimingRule(RULE_STAMPS, "SGLang 0.5.12+ meta_info: queue_time; prefill = prefill_finished_time - "
                                         "forward_entry_time; engine TTFT = first_token_latency"),
}  # fmt: skip
#: The first release of each rule, newest first.
_SINCE = ((RULE_STAMPS, (0, 5, 12)), (RULE_0510, (0, 5, 10)), (RULE_058, (0, 0)))


def _seconds(timing: Mapping[str, Any], key: str) -> float | None:
    v = timing.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        return None  # SGLang sends queue_time < 0 for a request aborted before the scheduler took it
    return float(v)


def release(version: str | None) -> tuple[int, ...] | None:
    """``"0.5.23"``, ``"v0.5.10.post1"``, ``"0.5.23 bench-sim 0.9"`` -> (0, 5, 23); None when unreadable."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def rule_of_version(version: str | None) -> str | None:
    """The rule an SGLang release reports by; None when the version is unknown or unreadable."""
    have = release(version)
    if have is None:
        return None
    return next(name for name, since in _SINCE if have >= since)


def rule_of_keys(keys: set[str]) -> str | None:
    """The rule a payload's keys belong to (each generation's key set is its own); None: none."""
    if "prefill_launch_delay" in keys:
        return RULE_058
    if "prefill_waiting_latency" in keys:
        return RULE_0510
    if "forward_entry_time" in keys or "prefill_finished_time" in keys or "first_token_latency" in keys:
        return RULE_STAMPS
    if "prefill_launch_latency" in keys:  # no delay key: still the older pair's meaning
        return RULE_058
    return None


@dataclass(frozen=True)
class RunEngine:
    """What a run recorded about the engine it measured (run.parquet): its family and version."""

    family: str | None = None  # "sglang", "vllm", "tgi", ... (None: not recorded)
    version: str | None = None

    @property
    def sglang(self) -> bool:
        return self.family == "sglang"


def run_engine(meta: Mapping[str, Any]) -> RunEngine:
    """The engine family and version from a run's metadata (``read_run_meta``): the adapter's
    recorded version, the launched engine's reported one, else the version the user gave."""
    adapter = meta.get("adapter") or {}
    config = meta.get("config") or {}
    launch = config.get("engine_launch") or {}
    name = str(adapter.get("adapter") or meta.get("engine") or "")
    sim = config.get("sim") or {}
    flavor = sim.get("flavor") if isinstance(sim, dict) else None
    family = "sglang" if name.startswith("sglang") or flavor == "sglang" else (name or None)
    version = adapter.get("engine_version") or launch.get("version") or config.get("engine_version")
    return RunEngine(family, str(version) if version else None)


def choose_rule(engine: RunEngine, keys: set[str]) -> tuple[TimingRule | None, str]:
    """The rule that reads a run's response timings, and the sentence that says why."""
    by_keys = rule_of_keys(keys)
    by_version = rule_of_version(engine.version) if engine.sglang or engine.family is None else None
    if by_version is not None and (by_keys is None or by_keys == by_version):
        rule = RULES[by_version]
        return rule, f"{rule.reads} (chosen by the engine's reported version {engine.version})"
    if by_keys is None:
        return None, "no per-request timings an SGLang release sends"
    rule = RULES[by_keys]
    if by_version is not None:
        return rule, (f"{rule.reads} (version {engine.version} reported, but the responses carry that rule's keys, "
                      "not the version's: read by the keys)")  # fmt: skip
    return rule, f"{rule.reads} (engine version not recorded: chosen by the keys the responses carry)"


def is_sglang_span(attributes_json: str | None, name: str | None) -> bool:
    """Whether a request span is SGLang's root span (``rid`` and ``module: sglang::...``
    attributes, name ``[role] Req <rid[:8]>``), whose latency attributes have SGLang's meaning."""
    text = attributes_json or ""
    return '"rid"' in text or '"sglang::' in text or " Req " in f" {name or ''}"
