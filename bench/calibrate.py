"""``bench sim calibrate``: measured run folders in, a calibrated simulated-engine profile out.

Reads each run's requests (send, first-token and end times, prompt and output lengths) and the
configuration it ran at, turns them into ``sim.calibrate.MeasuredLoad`` objects, holds some out,
fits the simulator's constants on the rest (``sim.calibrate.fit``) and scores both the shipped
and the calibrated constants on the held-out loads. The profile is a ``bench sim serve --config``
file ([gpu], [profile] and, for a model without a preset, [model] overrides), so it loads
wherever the simulated engine runs: ``bench sim serve --config``, ``bench sim describe --config``,
and virtual-time runs and sweeps with ``--engine-arg=--config=FILE``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bench_llm.analysis.client_health import client_health
from bench_llm.analysis.invariants import check_records
from bench_llm.analysis.metrics import request_metrics
from bench_llm.core.errors import BenchError
from bench_llm.results.reader import find_runs, read_monitor, read_requests, read_run_meta
from bench_llm.sim.calibrate import MeasuredLoad
from bench_llm.sim.options import ModelTiming, apply_toml
from bench_llm.sim.presets import ModelSpec
from bench_llm.sim.virtual import Send

#: Above this many requests a run's replay would cost more than it teaches: the first ones are used.
MAX_REQUESTS_PER_LOAD = 2000

#: Why a measured load is left out of calibration (codes, never matched by text). A load whose
#: client was saturated measured the client, not the engine (``analysis.client_health``, the
#: flag a sweep's points carry as ``client_saturated``); a load with anomalous records
#: (``analysis.invariants``) has streams that broke their protocol, so its timings are suspect.
CLIENT_SATURATED = "client_saturated"
ANOMALIES = "anomalies"


@dataclass(frozen=True)
class Excluded:
    """A run left out of calibration: its folder, the reason's code and what was seen."""

    name: str
    reason: str
    detail: str


@dataclass(frozen=True)
class Screened:
    """The runs calibration may fit on, and those it left out (``Excluded``), in path order."""

    loads: tuple[MeasuredLoad, ...]
    excluded: tuple[Excluded, ...]


@dataclass(frozen=True)
class BaseConfig:
    """What the simulator should assume for runs of an engine that is not the simulated one."""

    preset: str = "llama-3.1-8b"
    gpu: str = "h100"
    profile: str = "vllm"
    tp: int = 1
    config: Path | None = None
    model_spec: ModelSpec | None = None


#: Reads ``bench sim serve`` arguments into the modelled engine's configuration (the sim command's
#: own parser, passed in by the command so that this module does not import a CLI command).
SimArgs = Callable[[list[str]], ModelTiming | None]


def load_measured(paths: Sequence[Path], base: BaseConfig, sim_args: SimArgs | None = None) -> list[MeasuredLoad]:
    """Every run under ``paths`` fit to calibrate on, as a measured load (``screened_loads``)."""
    return list(screened_loads(paths, base, sim_args).loads)


def screened_loads(paths: Sequence[Path], base: BaseConfig, sim_args: SimArgs | None = None) -> Screened:
    """Every run under ``paths`` (run folders or sweeps) as a measured load, in path order, less
    the runs whose client was saturated or that hold anomalous records (``Excluded``, named);
    refused when none is left."""
    runs = sorted({r for p in paths for r in find_runs(Path(p))})
    if not runs:
        raise BenchError(f"no bench run under {', '.join(map(str, paths))}")
    loads, excluded = [], []
    for r in runs:
        load, problems = _screened_load(r, base, sim_args)
        if problems:
            excluded.extend(problems)
        else:
            loads.append(load)
    if not loads:
        raise BenchError("no run to calibrate on: every one was left out ("
                         + "; ".join(f"{e.name}: {e.reason} ({e.detail})" for e in excluded) + ")")
    empty = [ld.name for ld in loads if not ld.measured]
    if empty:
        raise BenchError(f"{empty[0]}: no successful measured request with two or more tokens to calibrate on")
    return Screened(tuple(loads), tuple(excluded))


def measured_load(run_dir: Path, base: BaseConfig, sim_args: SimArgs | None = None) -> MeasuredLoad:
    """A run folder as a measured load, whatever its client's health (``screened_loads`` screens)."""
    return _screened_load(run_dir, base, sim_args)[0]


def _screened_load(run_dir: Path, base: BaseConfig, sim_args: SimArgs | None) -> tuple[MeasuredLoad, list[Excluded]]:
    """A run folder as a measured load, and why it should not be calibrated on (empty: it may).
    TTFT, TPOT and E2E are ``analysis.metrics.request_metrics``' (docs/metrics.md: TPOT per
    sequence); a record that breaks the invariants (``analysis.invariants``) is never compared."""
    meta = read_run_meta(run_dir)
    table = read_requests(run_dir)
    frame = request_metrics(table)
    frame["anomaly"] = check_records(table).anomaly
    problems = _problems(run_dir, frame)
    frame = frame[frame["send_ns"].notna()].sort_values("send_ns", kind="stable").head(MAX_REQUESTS_PER_LOAD)
    if frame.empty:
        raise BenchError(f"{run_dir}: no request was sent")
    t0 = int(frame["send_ns"].iloc[0])
    sends, measured, ttft, tpot, e2e, starts, ends = [], [], [], [], [], [], []
    for r in frame.itertuples(index=False):
        prompt = _count(r.prompt_tokens) or _count(r.input_tokens_target) or 1
        out = _count(r.output_tokens) or _count(r.max_output_tokens) or 1
        sends.append(Send(prompt_len=prompt, max_tokens=out, at_ns=int(r.send_ns) - t0))
        if r.phase == "measure" and r.ok and r.anomaly == 0 and math.isfinite(r.tpot_ms) and math.isfinite(r.ttft_ms):
            measured.append(len(sends) - 1)
            ttft.append(float(r.ttft_ms))
            tpot.append(float(r.tpot_ms))
            e2e.append(float(r.e2e_ms))
            starts.append(int(r.send_ns))
            ends.append(int(r.end_ns))
    duration = (max(ends) - min(starts)) / 1e9 if measured else 0.0
    return MeasuredLoad(str(run_dir), timing_of(meta, base, run_dir, sim_args), tuple(sends), tuple(measured), tuple(ttft),
                        tuple(tpot), tuple(e2e), duration), problems


def _problems(run_dir: Path, frame: pd.DataFrame) -> list[Excluded]:
    """Why this run's measured requests do not show the engine: anomalous records, a saturated client."""
    out = []
    measure = frame[frame["phase"] == "measure"]
    anomalies = int((measure["anomaly"] != 0).sum())
    if anomalies:
        out.append(Excluded(str(run_dir), ANOMALIES, f"{anomalies} anomalous record(s)"))
    if len(measure) and measure["send_ns"].notna().any():
        health = client_health(measure, read_monitor(run_dir))
        if health.saturated:
            out.append(Excluded(str(run_dir), CLIENT_SATURATED, "; ".join(health.warnings) or "the client was saturated"))
    return out


def _count(value: Any) -> int:
    """A token count from a frame cell (None or NaN: 0)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return 0
    return int(f) if math.isfinite(f) else 0


def timing_of(meta: dict[str, Any], base: BaseConfig, where: Path, sim_args: SimArgs | None = None) -> ModelTiming:
    """The modelled engine's configuration a run stands for: a simulated engine's own recorded
    arguments, or, for a real engine, ``base`` with the run's recorded tp and max-num-seqs."""
    config = _json(meta.get("config_json"))
    argv = [str(a) for a in (config.get("engine_launch") or {}).get("argv") or []]
    if meta.get("engine") == "sim" and "--timing" in argv:
        # the layout and limits it ran at, from the shipped constants: a --config or --slowdown
        # it ran with is what calibration is to find, not to start from
        args = _without_constants(argv[argv.index("serve") + 1:] if "serve" in argv else argv)
        timing = _sim_timing(args, where, sim_args)
        if base.config is not None:
            timing = apply_toml(timing, base.config, {})
    else:
        # what the run recorded wins over the base file's [engine] table
        recorded = {k: v for k, v in (("tp", _flag(argv, "--tensor-parallel-size", None)),
                                      ("max_num_seqs", _flag(argv, "--max-num-seqs", None)),
                                      ("max_num_batched_tokens", _flag(argv, "--max-num-batched-tokens", None)))
                    if v is not None}
        timing = ModelTiming(preset=base.preset, gpu=base.gpu, profile=base.profile, tp=base.tp,
                             model_spec=base.model_spec)
        timing = apply_toml(timing, base.config, recorded) if base.config is not None else dataclasses.replace(timing, **recorded)
    return dataclasses.replace(timing, jitter=0.0)  # the measured loads carry the noise; the model need not


def _without_constants(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--config", "--slowdown", "--jitter"):
            skip = True
            continue
        if a.startswith(("--config=", "--slowdown=", "--jitter=")):
            continue
        out.append(a)
    return out


def _sim_timing(argv: list[str], where: Path, sim_args: SimArgs | None) -> ModelTiming:
    if sim_args is None:
        raise BenchError(f"{where}: a simulated engine's run needs its argument parser (bench sim calibrate has it)")
    try:
        timing = sim_args([a for a in argv if not a.startswith(("--host", "--port"))])
    except Exception as exc:  # a folder written by another bench version: say which one
        raise BenchError(f"{where}: cannot read the simulated engine's recorded arguments: {exc}") from None
    if timing is None:
        raise BenchError(f"{where}: a fixed-timing simulated engine has no constants to calibrate")
    return timing


def _flag(argv: list[str], name: str, default: Any) -> Any:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return int(argv[i + 1])
        if a.startswith(name + "="):
            return int(a.split("=", 1)[1])
    return default


def _json(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else (text or {})
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def model_from_hf_config(path: Path) -> ModelSpec:
    """A model the simulator has no preset for, from its Hugging Face ``config.json``."""
    try:
        cfg = json.loads(Path(path).read_text())
        layers, hidden = int(cfg["num_hidden_layers"]), int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads", heads))
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        inter = int(cfg.get("intermediate_size", 4 * hidden))
        vocab = int(cfg.get("vocab_size", 32000))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"{path}: not a readable Hugging Face config.json ({exc})") from None
    per_layer = hidden * (heads * head_dim) * 2 + hidden * (kv_heads * head_dim) * 2 + 3 * hidden * inter
    params_b = (layers * per_layer + 2 * vocab * hidden) / 1e9
    return ModelSpec(str(cfg.get("_name_or_path") or Path(path).parent.name or "model"), params_b, params_b, layers,
                     hidden, heads, kv_heads, head_dim, max_model_len=int(cfg.get("max_position_embeddings", 4096)))


def model_toml(spec: ModelSpec) -> str:
    """The [model] table of a profile for a model without a preset."""
    rows = [f"{f.name} = {json.dumps(getattr(spec, f.name))}" for f in dataclasses.fields(spec)
            if isinstance(getattr(spec, f.name), (int, float, str))]
    return "\n[model]\n" + "\n".join(rows) + "\n"


def split_held_out(loads: Sequence[MeasuredLoad], held: Sequence[Path], every: int) -> tuple[list[MeasuredLoad], list[MeasuredLoad]]:
    """(fit, held out): the loads under ``held`` if given, else every ``every``-th load (from the
    second), none when there are fewer than 3."""
    if held:
        marks = {str(Path(h)) for h in held}
        out = [ld for ld in loads if any(ld.name == m or ld.name.startswith(m.rstrip("/") + "/") for m in marks)]
        if not out:
            raise BenchError("--holdout: none of the runs given is among the loads")
    elif len(loads) >= 3 and every > 0:
        out = [ld for i, ld in enumerate(loads) if i % every == 1 % every]
    else:
        out = []
    fit = [ld for ld in loads if ld not in out]
    if not fit:
        raise BenchError("every load is held out: nothing left to fit on")
    return fit, out
