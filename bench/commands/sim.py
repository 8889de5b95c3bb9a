"""``bench sim serve``: the embedded simulated engine as a process."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

import click

from bench_llm.bench.errors import ExitCode, setting_message
from bench_llm.core.errors import BenchError

_GPUS = ("a100", "h100", "h200", "l40s")
_PRESETS = ("llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "deepseek-v3")
_PROFILES = ("vllm", "vllm-v0", "sglang", "sglang-2024", "trtllm", "tgi", "legacy-2023")


@click.group("sim")
def command() -> None:
    """The embedded simulated engine."""


@command.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless told otherwise).")
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--model", default=None, help="Served model name (default: sim-model, or the preset name with --timing model).")
@click.option("--timing", type=click.Choice(["fixed", "model"]), default="fixed", show_default=True,
              help="fixed: same TTFT/ITL for every request; model: batching, KV capacity and the cost model.")
@click.option("--flavor", type=click.Choice(["vllm", "sglang", "tgi"]), default="vllm", show_default=True,
              help="Which engine's API, stream format and metric names to imitate.")
@click.option("--ttft-ms", default=50.0, show_default=True, type=float, help="Fixed timing: time to first token.")
@click.option("--itl-ms", default=10.0, show_default=True, type=float, help="Fixed timing: inter-token latency (step).")
@click.option("--tokens-per-chunk", default=1, show_default=True, type=int, help="Fixed timing: tokens per stream chunk.")
@click.option("--fixed-grid", is_flag=True,
              help="Fixed timing: step every stream on one global ITL grid (first token at the first step "
                   "boundary at or after arrival+TTFT) instead of per-request deadlines.")
@click.option("--model-preset", type=click.Choice(_PRESETS), default="llama-3.1-8b", show_default=True)
@click.option("--gpu", type=click.Choice(_GPUS), default="h100", show_default=True)
@click.option("--dtype", type=click.Choice(["bf16", "fp8"]), default=None,
              help="Weight precision (default: the preset's; llama-3.1-70b and deepseek-v3 default to fp8).")
@click.option("--kv-dtype", type=click.Choice(["auto", "bf16", "fp8"]), default=None,
              help="KV-cache dtype (default auto: the engine profile's default for the weights' precision, "
                   "BF16 on vllm/sglang, FP8 for FP8 weights on trtllm).")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor parallel degree.")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline parallel stages.")
@click.option("--dp", type=int, default=1, show_default=True, help="Data parallel replicas (behind --router).")
@click.option("--ep", type=int, default=1, show_default=True, help="Expert parallel width (MoE presets): 1 or tp×pcp×dp (experts over every GPU; EP adds none).")
@click.option("--expert-imbalance", type=float, default=None, metavar="MAX/MEAN",
              help="MoE with --ep > 1: the busiest EP rank's expert load over the mean (1.0: balanced; "
                   "default 1.3). That rank's GPU sets every MoE step.")
@click.option("--dcp", type=int, default=1, show_default=True, help="Decode context parallel (divides --tp).")
@click.option("--pcp", type=int, default=1, show_default=True, help="Prefill context parallel (extra GPUs).")
@click.option("--disagg", default=None, metavar="P:D", help="Prefill/decode disaggregation: P prefill, D decode instances.")
@click.option("--router", type=click.Choice(["round-robin", "least-queue", "kv-aware", "prefix-aware"]),
              default="round-robin", show_default=True, help="How requests are spread over DP replicas.")
@click.option("--profile", type=click.Choice(list(_PROFILES)), default=None,
              help="Engine profile: scheduling policy, step/sequence/layer overheads and limits of one engine "
                   "generation (vllm = V1, vllm-v0, sglang, sglang-2024, trtllm, tgi, legacy-2023); default: the flavour's.")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="TOML overrides: [gpu], [model], [profile], [engine] tables.")
@click.option("--max-num-seqs", type=int, default=None, help="Max running requests per instance.")
@click.option("--max-num-batched-tokens", type=int, default=None, help="Token budget per step.")
@click.option("--gpu-memory-utilization", type=float, default=None,
              help="Share of GPU memory for weights + KV cache (default: the engine profile's, 0.9).")
@click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=None, help="Prefix cache (default on).")
@click.option("--slowdown", type=float, default=1.0, show_default=True, help="Multiply every step time by this factor.")
@click.option("--jitter", type=float, default=0.0, show_default=True, help="Gaussian step-time jitter sigma (fraction).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for jitter and faults.")
@click.option("--faults", default=None, help="Fault injection, e.g. reset=0.1,http500=0.05,stall=0.05:5s,slow_start=3s.")
@click.option("--spin-us", type=int, default=0, show_default=True,
              help="Busy-wait this many µs before each deadline (tighter emission times at the cost of CPU).")
@click.option("--natural-stop", type=float, default=0.0, show_default=True, metavar="MEAN",
              help="Requests that do not force their length (no ignore_eos; TGI always) end at a seeded "
                   "end-of-sequence with this mean length (0: every request gets max_tokens).")
@click.option("--max-concurrent-requests", type=int, default=128, show_default=True,
              help="TGI flavour: requests admitted at once (TGI's own default); the next one gets an "
                   "in-stream 'overloaded' error, as TGI answers (0: no limit).")
@click.option("--max-num-queued-reqs", type=click.IntRange(0), default=0, show_default=True,
              help="vLLM flavour: requests in the engine (waiting and running) at most (vLLM's "
                   "--max-num-queued-reqs); the next one is answered HTTP 503, as vLLM does (0: no limit).")
@click.option("--max-queued-requests", type=click.IntRange(0), default=0, show_default=True,
              help="SGLang flavour: requests waiting at most (SGLang's --max-queued-requests); the next one's "
                   "stream ends with an abort, status 503, as SGLang does (0: no limit).")
@click.option("--engine-version", default=None, metavar="VERSION",
              help="SGLang flavour: the release imitated and reported (default 0.5.23): 0.5.6-0.5.9 speak the 0.5.8 "
                   "generation, 0.5.10-0.5.11 the 0.5.10 one, 0.5.12 on the 0.5.23 one (timings, spans, checks).")
@click.option("--reasoning-tokens", type=click.IntRange(0), default=0, show_default=True,
              help="Chat answers start with this many reasoning tokens (delta.reasoning_content), then the answer.")
@click.option("--lora-adapters", default="", metavar="NAME,...",
              help="LoRA adapters served besides the model (requests name one as their model).")
@click.option("--max-loras", type=click.IntRange(1), default=1, show_default=True,
              help="Adapters resident at once; loading another evicts the least recently used.")
@click.option("--lora-swap-ms", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Time to load an adapter that is not resident, waited by the request that needs it.")
@click.option("--mlock", is_flag=True,
              help="Lock the engine's memory (mlockall; needs root) so host memory reclaim cannot stall emission.")
@click.option("--otlp-traces-endpoint", default=None, metavar="URL",
              help="Export each finished request's span over OTLP/HTTP to URL (http://HOST:PORT/v1/traces), "
                   "in the flavour's naming (vLLM llm_request, SGLang rid; TGI none): bench run/sweep --otlp-receiver.")
@click.option("--emission-log", type=click.Path(path_type=Path), default=None,
              help="Parquet of every token's intended and actual send time (written at shutdown).")
@click.option("--nnodes", type=click.IntRange(1), default=1, show_default=True,
              help="Ranks of a multi-node instance (as vLLM's --nnodes): rank 0 serves once every rank joined.")
@click.option("--node-rank", type=click.IntRange(0), default=0, show_default=True, help="This process's rank.")
@click.option("--master-addr", default=None, help="Rendezvous address (rank 0's node).")
@click.option("--master-port", type=int, default=None, help="Rendezvous port.")
@click.option("--headless", is_flag=True, help="A rank > 0: join the rendezvous, serve no HTTP.")
def serve(**kw: Any) -> None:
    """Serve the simulated engine until interrupted."""
    nnodes, rank = kw.pop("nnodes"), kw.pop("node_rank")
    master, master_port, headless = kw.pop("master_addr"), kw.pop("master_port"), kw.pop("headless")
    if nnodes > 1 and (master is None or master_port is None):
        raise BenchError("--nnodes above 1 needs --master-addr and --master-port (the rendezvous)")
    if nnodes > 1 and (headless or rank > 0):
        from bench_llm.sim.rendezvous import join_rendezvous

        join_rendezvous(rank, nnodes, master, master_port)  # a headless rank serves no HTTP
        return
    from bench_llm.sim.costmodel import OutOfMemory

    try:
        cfg = build_config(kw)
        from bench_llm.sim.server import create_app

        app = create_app(cfg)
    except OutOfMemory as exc:
        sys.stderr.write(f"{exc}\n")
        sys.stderr.flush()
        raise SystemExit(ExitCode.BAD_INPUT) from None
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    from aiohttp import web

    from bench_llm.sim.process import tune_process

    tune_process(mlock=bool(kw.get("mlock")))
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if cfg.model_timing is not None:
        import json

        from bench_llm.sim.options import describe

        info = describe(cfg.model_timing)
        sys.stderr.write(f"bench sim: {json.dumps(info)}\n")
        if str(info["calibration"]).startswith("uncalibrated"):
            sys.stderr.write(f"bench sim: {info['calibration']}\n")
        sys.stderr.flush()
    if nnodes > 1:  # rank 0: every rank first, as a multi-node engine waits for its ranks
        from bench_llm.sim.rendezvous import serve_rendezvous

        serve_rendezvous(nnodes, master, master_port)
    elif "CUDA_VISIBLE_DEVICES" in os.environ:  # given GPUs (a cluster's): say which, as a rank does
        from bench_llm.sim.rendezvous import say_who

        say_who(0, 1, None, None)
    try:
        web.run_app(app, host=kw["host"], port=kw["port"], access_log=None, print=lambda *_: None, backlog=4096)
    except OSError as exc:
        if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise
        raise BenchError(f"cannot listen on {kw['host']}:{kw['port']}: {exc.strerror} (choose another --port)") from None


def build_config(kw: dict[str, Any]) -> Any:
    """Turn the CLI options into a ``ServerConfig`` (also used by tests)."""
    from bench_llm.sim.config import ServerConfig
    from bench_llm.sim.faults import FaultSpec
    from bench_llm.sim.options import ModelTiming, apply_toml
    from bench_llm.sim.timing import FixedTiming

    faults = FaultSpec.parse(kw.get("faults"))
    model_timing = None
    if kw.get("timing", "fixed") == "model":
        dp, dd = 0, 0
        if kw.get("disagg"):
            p, sep, d = str(kw["disagg"]).partition(":")
            try:
                dp, dd = int(p), int(d)
                if not sep or dp < 1 or dd < 1:
                    raise ValueError
            except ValueError:
                raise BenchError(f"--disagg {kw['disagg']!r}: expected P:D, e.g. 1:1") from None
        cli: dict[str, Any] = {
            "preset": kw.get("model_preset") or "llama-3.1-8b",
            "gpu": kw.get("gpu") or "h100",
            "tp": kw.get("tp", 1), "pp": kw.get("pp", 1), "dp": kw.get("dp", 1), "ep": kw.get("ep", 1),
            "dcp": kw.get("dcp", 1), "pcp": kw.get("pcp", 1),
            "disagg_prefill": dp, "disagg_decode": dd,
            "router": kw.get("router") or "round-robin",
            "profile": kw.get("profile") or kw.get("flavor") or "vllm",
            "slowdown": kw.get("slowdown", 1.0), "jitter": kw.get("jitter", 0.0), "seed": kw.get("seed", 0),
        }
        for key in ("dtype", "kv_dtype", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching",
                    "gpu_memory_utilization", "expert_imbalance"):
            if kw.get(key) is not None:
                cli[key] = kw[key]
        try:
            if kw.get("config_path"):
                defaults = {k: v for k, v in cli.items() if _given(kw, k)}
                model_timing = apply_toml(ModelTiming(**cli), Path(kw["config_path"]), defaults)
            else:
                model_timing = ModelTiming(**cli)
        except ValueError as exc:
            raise BenchError(str(exc)) from None
    model = kw.get("model") or (model_timing.preset if model_timing else "sim-model")
    timing = FixedTiming(float(kw.get("ttft_ms", 50.0)) / 1000, float(kw.get("itl_ms", 10.0)) / 1000,
                         int(kw.get("tokens_per_chunk", 1)))
    try:
        return _server_config(ServerConfig, kw, model, timing, model_timing, faults)
    except ValueError as exc:
        raise BenchError(str(exc)) from None


def _server_config(make: Any, kw: dict[str, Any], model: str, timing: Any, model_timing: Any, faults: Any) -> Any:
    return make(
        model=model, timing=timing, flavor=kw.get("flavor") or "vllm", model_timing=model_timing, faults=faults,
        emission_log=kw.get("emission_log"), seed=int(kw.get("seed", 0)),
        fixed_grid=bool(kw.get("fixed_grid")), spin_us=int(kw.get("spin_us") or 0),
        natural_stop_mean=float(kw.get("natural_stop") or 0.0),
        max_concurrent_requests=int(kw.get("max_concurrent_requests", 128) or 0),
        reasoning_tokens=int(kw.get("reasoning_tokens") or 0),
        lora_adapters=tuple(a.strip() for a in str(kw.get("lora_adapters") or "").split(",") if a.strip()),
        max_loras=int(kw.get("max_loras") or 1), lora_swap_ms=float(kw.get("lora_swap_ms") or 0.0),
        otlp_traces_endpoint=kw.get("otlp_traces_endpoint"),
        engine_version=kw.get("engine_version"),
        max_num_queued_reqs=int(kw.get("max_num_queued_reqs") or 0),
        max_queued_requests=int(kw.get("max_queued_requests") or 0),
    )


_DEFAULTS = {"preset": "llama-3.1-8b", "gpu": "h100", "tp": 1, "pp": 1, "dp": 1, "ep": 1, "dcp": 1, "pcp": 1,
             "disagg_prefill": 0, "disagg_decode": 0, "router": "round-robin", "slowdown": 1.0, "jitter": 0.0,
             "seed": 0}


def _given(kw: dict[str, Any], key: str) -> bool:
    """True when a CLI value differs from its default (so the TOML file does not override it)."""
    if key in ("dtype", "kv_dtype", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching",
               "gpu_memory_utilization", "expert_imbalance"):
        return True
    if key == "profile":
        return kw.get("profile") is not None
    if key == "preset":
        return kw.get("model_preset") not in (None, _DEFAULTS["preset"])
    if key in ("disagg_prefill", "disagg_decode"):
        return bool(kw.get("disagg"))
    return kw.get(key) != _DEFAULTS.get(key)


@command.command("describe", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def describe_cmd(ctx: click.Context) -> None:
    """Print what a modelled configuration holds (weights and KV per GPU, limits), or its
    out-of-memory reason. Takes the same flags as ``serve``, e.g.
    ``bench sim describe --model-preset llama-3.1-70b --gpu h100 --tp 2 --dp 2``."""
    import json

    from bench_llm.sim.options import describe

    args = list(ctx.args)
    if "--timing" not in args:
        args = ["--timing", "model", *args]
    try:
        params = serve.make_context("serve", args).params
    except click.UsageError as exc:
        raise BenchError(str(exc)) from None
    cfg = build_config(params)
    if cfg.model_timing is None:
        raise BenchError("describe needs --timing model")
    cfg.model_timing.cost_model().check_fits()
    click.echo(json.dumps(describe(cfg.model_timing), indent=2))


@command.command("validate")
@click.option("--markdown", is_flag=True, help="Print the published rows' table as docs/simulator.md carries it.")
@click.option("--only", type=click.Choice(["all", "published", "silicon"]), default="all", show_default=True,
              help="published: the published figures' table; silicon: the measured H200 rows (AIConfigurator's "
                   "silicon data) scored per (backend, model, mode); all: both.")
@click.option("--silicon-rows", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="The H200 rows' CSV (default: $BENCH_SILICON_ROWS, else ../shared/reference/silicon/"
                   "h200_silicon.csv beside the repository or the working directory; skipped when absent).")
@click.option("--per-row", is_flag=True, help="Also print every H200 row: measured, simulated, ratio.")
@click.option("--workers", type=click.IntRange(1), default=None,
              help="Processes for the simulations (default: 2 where the host has a core to spare, else 1).")
def validate_cmd(markdown: bool, only: str, silicon_rows: Path | None, per_row: bool, workers: int | None) -> None:
    """Print the simulator's figures next to measured ones, in virtual time: the published rows (source,
    configuration, figure, published, simulated, ratio, and whether a constant was fitted to the row),
    then the measured H200 rows per (backend, model, mode): figures within ±20 %, median |error|, worst
    ratio, and the constants fitted on them."""
    from bench_llm.sim import silicon, validation

    if only in ("all", "published"):
        rows = validation.rows(workers)
        click.echo(validation.markdown(rows) if markdown else validation.table(rows))
    if only in ("all", "silicon"):
        path = silicon_rows or silicon.default_path()
        if path is None or not path.is_file():
            where = path or f"${silicon.ENV} or ../shared/reference/silicon/h200_silicon.csv"
            click.echo(f"H200 silicon rows: skipped ({where} not found)")
            return
        click.echo(silicon.report(path, workers, per_row))


@command.command("calibrate")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--out", "out_path", required=True, type=click.Path(path_type=Path),
              help="Profile to write: a `bench sim serve --config` file (refused if it exists).")
@click.option("--holdout", multiple=True, type=click.Path(path_type=Path),
              help="Runs to hold out (repeat); default: every --holdout-every-th load.")
@click.option("--holdout-every", default=3, show_default=True, type=int,
              help="Hold out every Nth load (from the second) when --holdout is not given; 0: none.")
@click.option("--model-preset", default="llama-3.1-8b", show_default=True,
              help="For runs of a real engine: the model the simulator assumes (or --model-config).")
@click.option("--model-config", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="For a model without a preset: its Hugging Face config.json (written into the profile).")
@click.option("--gpu", default="h100", show_default=True,
              help="For runs of a real engine: the hardware preset the fit starts from (its rates are fitted).")
@click.option("--profile", "engine_profile", default="vllm", show_default=True, help="Engine profile the fit starts from.")
@click.option("--tp", default=1, show_default=True, type=int, help="For runs of a real engine that did not record it.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A --config file the fit starts from (e.g. an earlier calibration).")
@click.option("--rounds", default=3, show_default=True, type=int, help="Coordinate-descent rounds over the constants.")
@click.option("--fit", "fit_set", type=click.Choice(["standard", "hardware"]), default="standard", show_default=True,
              help="standard: per-step, per-sequence and per-request times and the compute and memory rates; "
                   "hardware: also the attention and KV-cache rates (hardware without a preset; vary prompt lengths).")
def calibrate_cmd(runs: tuple[Path, ...], out_path: Path, holdout: tuple[Path, ...], holdout_every: int,
                  model_preset: str, model_config: Path | None, gpu: str, engine_profile: str, tp: int,
                  config_path: Path | None, rounds: int, fit_set: str) -> None:
    """Fit the simulated engine's constants to measured runs (any engine bench measured), hold some
    loads out, and print how the shipped and the calibrated constants predict the held-out loads
    (median |error|, bias, correlation per metric). The profile loads wherever the simulated
    engine runs (`--config FILE`; in virtual-time runs and sweeps `--engine-arg=--config=FILE`).

    \b
      bench sim calibrate runs/c1 runs/c4 runs/c8 runs/c16 --holdout runs/c16 --out host.toml
    """
    from bench_llm.bench.calibrate import BaseConfig, model_from_hf_config, model_toml, screened_loads, split_held_out
    from bench_llm.sim.calibrate import (
        HARDWARE_KNOBS,
        KNOBS,
        coverage,
        fit,
        max_in_flight,
        profile_toml,
        score,
        with_values,
    )

    if out_path.exists():
        raise BenchError(f"--out {out_path}: exists; bench writes a new profile, never over a file")
    if not out_path.parent.is_dir():
        raise BenchError(f"--out {out_path}: folder {out_path.parent} does not exist")
    spec = model_from_hf_config(model_config) if model_config else None
    base = BaseConfig(model_preset, gpu, engine_profile, tp, config_path, spec)
    try:
        screened = screened_loads(runs, base, lambda argv: build_config(serve.make_context("serve", argv).params).model_timing)
    except ValueError as exc:  # an unknown preset or GPU in the base configuration
        raise BenchError(setting_message(exc)) from None
    for ex in screened.excluded:  # a saturated client or anomalous records: not the engine's timings
        click.echo(f"left out: {ex.name}: {ex.reason} ({ex.detail})", err=True)
    loads = list(screened.loads)
    left = [h for h in holdout if any(e.name == str(Path(h)) or e.name.startswith(str(Path(h)) + "/") for e in screened.excluded)]
    if holdout and len(left) == len(holdout):
        raise BenchError("--holdout: every held-out run was left out (" + ", ".join(map(str, left)) + "; see above)")
    fit_loads, held = split_held_out(loads, holdout, holdout_every)
    click.echo(f"calibrating on {len(fit_loads)} load(s), holding out {len(held)}", err=True)
    knobs = HARDWARE_KNOBS if fit_set == "hardware" else KNOBS
    fitted = fit(fit_loads, knobs, rounds=rounds, progress=lambda line: click.echo(f"  {line}", err=True))
    check = held or fit_loads
    before = score(check, lambda ld: ld.timing)
    after = score(check, lambda ld: with_values(ld.timing, fitted.after))
    cov = coverage(fit_loads)
    which = "held-out" if held else "fitting (nothing held out)"
    click.echo(f"{which} loads: {len(check)}")
    click.echo(f"{'metric':<16}{'shipped |err|':>14}{'bias':>8}{'r':>7}   {'calibrated |err|':>17}{'bias':>8}{'r':>7}")
    for b, a in zip(before, after):
        rb = "-" if b.correlation is None else f"{b.correlation:.2f}"
        ra = "-" if a.correlation is None else f"{a.correlation:.2f}"
        click.echo(f"{b.metric:<16}{b.median_abs_error:>13.1%}{b.bias:>+8.1%}{rb:>7}   "
                   f"{a.median_abs_error:>16.1%}{a.bias:>+8.1%}{ra:>7}")
    click.echo("constants:")
    for knob, value in fitted.after.items():
        was = fitted.before[knob]
        click.echo(f"  [{knob.table}] {knob.name}: {was:.4g} -> {value:.4g} (x{value / was:.3g})" if was else
                   f"  [{knob.table}] {knob.name}: {was:.4g} -> {value:.4g}")
    for ld in held:
        outside = cov.outside(ld, max_in_flight(ld))
        if outside:
            click.echo(f"extrapolated: {ld.name}: {'; '.join(outside)}")
    text = profile_toml(fitted, cov, after if held else [], ", ".join(ld.name for ld in fit_loads))
    if spec is not None:
        text += model_toml(spec)
    out_path.write_text(text)
    click.echo(f"wrote {out_path} ({fitted.evaluations} replays of the fitting loads)")
