"""``bench sim serve``: the embedded simulated engine as a process."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from bench_llm.bench.errors import ExitCode, setting_message
from bench_llm.core.errors import BenchError
from bench_llm.sim.serve_args import PROFILES, SERVE_OPTIONS, Option, build_config, parse_serve_args

_PROFILES = PROFILES  # (tests read it here)


@click.group("sim")
def command() -> None:
    """The embedded simulated engine."""


def _click_option(o: Option) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``o`` (sim/serve_args.py's table) as a click option."""
    kw: dict[str, Any] = {"default": o.default, "help": o.help, "show_default": o.show_default or None}
    if o.metavar:
        kw["metavar"] = o.metavar
    decls = [o.flag] if o.dest is None else [o.flag, o.dest]
    if o.kind == "flag":
        kw["is_flag"] = True
    elif o.kind == "switch":
        decls[0] = f"{o.flag}/--no-{o.flag[2:]}"
    elif o.choices is not None:
        kw["type"] = click.Choice(list(o.choices))
    elif o.kind == "path":
        kw["type"] = click.Path(path_type=Path)
    elif o.kind == "int":
        kw["type"] = click.IntRange(int(o.minimum)) if o.minimum is not None else int
    elif o.kind == "float":
        kw["type"] = click.FloatRange(o.minimum) if o.minimum is not None else float
    return click.option(*decls, **kw)


def _serve(**kw: Any) -> None:
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


def _serve_command() -> click.Command:
    """``bench sim serve``: its options from the one table (``SERVE_OPTIONS``)."""
    fn: Callable[..., Any] = _serve
    for o in reversed(SERVE_OPTIONS):
        fn = _click_option(o)(fn)
    return command.command("serve")(fn)


serve = _serve_command()


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
    cfg = build_config(parse_serve_args(args))
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
