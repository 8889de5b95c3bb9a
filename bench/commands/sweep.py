"""``bench sweep``: launch the engine at each parallel configuration, measure, recommend."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bench_llm.bench.errors import ExitCode, Outcome
from bench_llm.bench.options import OutPath
from bench_llm.core.errors import BenchError
from bench_llm.core.redact import redact

if TYPE_CHECKING:
    from bench_llm.bench.sweep.spec import EndpointSpec, SweepSpec


def _ints(text: str | None, flag: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise BenchError(f"{flag} {text!r}: expected integers like 1,2,4") from None
    if not values:
        raise BenchError(f"{flag}: give at least one value")
    return values


def _floats(text: str | None, flag: str) -> tuple[float, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise BenchError(f"{flag} {text!r}: expected numbers like 1,2,4") from None
    if not values:
        raise BenchError(f"{flag}: give at least one value")
    return values


def _axes(texts: tuple[str, ...]) -> dict[str, tuple[str | int | float, ...]]:
    """``--axis max-num-seqs=8,32`` (repeatable) -> {"max-num-seqs": ("8", "32")}."""
    out: dict[str, tuple[str | int | float, ...]] = {}
    for text in texts:
        name, sep, values = text.partition("=")
        name = name.strip().removeprefix("--")
        items = tuple(v.strip() for v in values.split(",") if v.strip())
        if not sep or not name or not items:
            raise BenchError(f"--axis {text!r}: expected FLAG=V1,V2, e.g. max-num-seqs=8,32")
        if name in out:
            raise BenchError(f"--axis {name}: given twice; list every value in one --axis")
        out[name] = items
    return out


def _workload_axes(axes: dict[str, tuple[str | int | float, ...]]) -> dict[str, tuple[Any, ...]]:
    """Take the workload axes (``input-tokens``, ``output-tokens``, ``workload``) out of ``axes``
    (the rest are engine flags), as MatrixSpec field values."""
    from bench_llm.bench.sweep.spec import WORKLOAD_AXES  # the MatrixSpec fields; ``--axis`` spells them with "-"

    out: dict[str, tuple[Any, ...]] = {}
    for name in [n for n in axes if n.replace("-", "_") in WORKLOAD_AXES]:
        field, values = name.replace("-", "_"), axes.pop(name)
        text = ",".join(map(str, values))
        out[field] = tuple(values) if field == "workload" else _ints(text, f"--axis {name}") or ()
    return out


def _endpoints(texts: tuple[str, ...]) -> tuple[EndpointSpec, ...] | None:
    """``--url a=http://h:8000@2`` (repeatable) -> endpoints; ``@GPUS`` is optional (1), and so
    is an ``ENGINE:`` before the URL (``a=tgi:http://h:8080``; default: the sweep's --engine)."""
    from bench_llm.bench.sweep.spec import EndpointSpec

    out = []
    for text in texts:
        name, sep, rest = text.partition("=")
        engine, colon, after = rest.partition(":")
        if colon and after.startswith("http") and engine.strip() and engine.strip().lower() not in ("http", "https"):
            rest = after
        else:
            engine = ""
        url, at, gpus = rest.rpartition("@")
        if not (at and gpus.isdigit()):  # no GPU count (an @ in the URL's user part is kept)
            url, gpus = rest, "1"
        if not sep or not name.strip() or not url.strip():
            raise BenchError(f"--url {text!r}: expected NAME=URL, NAME=URL@GPUS or NAME=ENGINE:URL@GPUS, e.g. "
                             "a=http://10.0.0.5:8000@2 or b=tgi:http://10.0.0.6:8080@2")  # fmt: skip
        out.append(EndpointSpec(name.strip(), url.strip(), int(gpus), engine.strip() or None))
    return tuple(out) or None


@click.command("sweep")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="TOML sweep file (flags override it).")
@click.option("--engine", type=click.Choice(["sim", "vllm", "sglang", "tgi", "openai", "generic"]),
              help="Engine to launch (with --url: the engine the deployments run). [default: sim]")
@click.option("--model", help="Model (sim: preset such as llama-3.1-70b; others: path or id).")
@click.option("--gpu", help="GPU type (sim: a100|h100|h200|l40s; real engines: recorded only).")
@click.option("--gpus", type=int, help="GPUs available; cells needing more are skipped with the reason.")
@click.option("--tp", help="Tensor-parallel sizes, e.g. 1,2,4.")
@click.option("--pp", help="Pipeline-parallel sizes.")
@click.option("--dp", help="Data-parallel replicas.")
@click.option("--ep", help="Expert-parallel sizes (MoE). EP adds no GPUs: vLLM and the simulated engine take "
                           "ep = tp×pcp×dp, SGLang a divisor of tp; other cells are skipped by name.")
@click.option("--dcp", help="Decode context-parallel sizes (must divide tp).")
@click.option("--pcp", help="Prefill context-parallel sizes.")
@click.option("--disagg", help="Prefill:decode instance counts, e.g. 1:1,2:1 (none = colocated).")
@click.option("--axis", "axes", multiple=True, metavar="NAME=V1,V2",
              help="A matrix axis (repeatable): an engine flag, e.g. max-num-seqs=8,32 (each value runs as "
                   "--FLAG=VALUE in its own cells), or a workload axis, input-tokens=128,1024, output-tokens=64,256 "
                   "or workload=chat,long (every cell runs its loads at each value; no new launch).")
@click.option("--url", "urls", multiple=True, metavar="NAME=[ENGINE:]URL[@GPUS]",
              help="A running deployment to measure instead of launching a matrix: one configuration named NAME "
                   "occupying GPUS (default 1), speaking ENGINE's API (default: --engine); repeat to compare "
                   "deployments (docs/sweeps.md).")
@click.option("--rate", "rates", help="Open-loop loads in requests/s, e.g. 1,2,4,8.")
@click.option("--concurrency", "concs", help="Closed-loop loads (requests in flight), e.g. 1,8,32.")
@click.option("--capacity", is_flag=True, default=None, help="Search each cell's capacity under --slo instead.")
@click.option("--capacity-start", type=float, help="First rate the first cell's capacity search probes (in real time later cells start from what earlier ones found; default: 2x the one-at-a-time rate).")
@click.option("--precision", type=float, help="Capacity search: stop when the bracket is within this fraction. [default: 0.1]")
@click.option("--max-probes", type=int, help="Capacity search: most loads per cell. [default: 8]")
@click.option("--capacity-repeats", type=int, help="Capacity search: repeat it with this many fresh workload seeds; the capacity's interval is their 90% prediction interval (docs/sweeps.md). [default: 0; 2 in virtual time]")
@click.option("--requests", "n_requests", type=int, help="Measured requests per load (at least). [default: 30]")
@click.option("--warmup", type=int, help="Warm-up requests per cell (recorded, excluded). [default: 4]")
@click.option("--min-window", type=float, help="Rate loads send for at least this many seconds (default: capacity: 8x one-at-a-time latency).")
@click.option("--max-requests", type=int, help="Most measured requests per load. [default: 600]")
@click.option("--workload", "workload_refs", multiple=True, help="Named workload or TOML file (repeatable).")
@click.option("--input-tokens", type=int, help="Synthetic workload prompt length. [default: 512]")
@click.option("--output-tokens", type=int, help="Synthetic workload output length. [default: 128]")
@click.option("--arrival", type=click.Choice(["poisson", "constant"]), help="Open-loop arrivals. [default: poisson]")
@click.option("--seed", type=int, help="Workload seed. [default: 0]")
@click.option("--tokenizer", help="Local HF tokenizer folder for exact prompt lengths.")
@click.option("--tokenize-url", help="Make prompt lengths exact with this engine's /tokenize; 'auto': each cell's engine; "
                                    "'off': word approximations. Default: a launched or --url engine with a /tokenize "
                                    "route (vLLM, SGLang) is asked, and prompts are made exact where its count differs.")
@click.option("--repeats", type=int, help="Runs per load (pooled). [default: 1]")
@click.option("--slo", "slo_text", help="SLOs, e.g. ttft_ms=500,tpot_ms=50.")
@click.option("--attainment", type=float, help="Percent of requests that must meet every SLO. [default: 90]")
@click.option("--confidence", type=float,
              help="Confidence of each load's verdict (0: the point estimate decides). [default: 0.95]")
@click.option("--target-rate", type=float, help="Load (req/s) the recommendation must serve.")
@click.option("--target-concurrency", type=int, help="Concurrency the recommendation must serve (concurrency sweeps).")
@click.option("--engine-arg", "engine_args", multiple=True, help="Extra engine argument (repeatable).")
@click.option("--engine-env", "engine_env", multiple=True, help="NAME=value for the engine's environment, or NAME for bench's own value (a secret's only form; repeatable).")
@click.option("--ready-timeout", type=float, help="Seconds to wait for an engine to become ready. [default: 600]")
@click.option("--engine-version", help="The engine's version (e.g. 3.3.6): version-gated flags and metric names "
                                       "(docs/engines.md). [default: what each launched engine reports]")
@click.option("--workers", type=click.IntRange(1, 64),
              help="Load-generating processes per load, as in bench run. [default: 1]")
@click.option("--clock", type=click.Choice(("auto", "user", "kernel", "virtual")),
              help="virtual (the simulated engine's default): run its scheduler and cost model in virtual "
                   "time, no server or client, the same answer every time; auto|user|kernel: measure "
                   "a live server in real time, chunk timestamps as in bench run. [default: virtual for "
                   "--engine sim, else auto]")
@click.option("--jobs", type=click.IntRange(1, 256),
              help="Cells computed at once, each in its own process (virtual time only; a real-time sweep runs one "
                   "cell at a time, except on a cluster, where cells run side by side as concurrent jobs). The files "
                   "are the same for any value. [default: one per CPU in virtual time]")
@click.option("--out", type=OutPath(path_type=Path), help="Sweep folder (required unless --dry-run).")
@click.option("--dry-run", is_flag=True,
              help="Print every cell's argv, environment, GPU assignment and skip reason; start nothing.")
@click.option("--resume", is_flag=True, help="Finish an interrupted sweep in --out: only missing cells run. "
              "With another --slo/--attainment/--confidence: re-judge its loads and probe the ones the new verdicts need.")
@click.option("--retry-failed", is_flag=True, help="With --resume: also rerun cells that failed.")
@click.option("--plan", is_flag=True,
              help="Plan first: run every cell on the simulated engine in virtual time, rank them with the model's "
                   "error as an interval, and launch only the cells whose interval can hold the answer, re-ranking "
                   "after each (docs/sweeps.md, A planned sweep). Needs --capacity and --slo.")
@click.option("--plan-config", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="The planner's profile (bench sim calibrate --out): its constants and held-out error.")
@click.option("--plan-model", help="The planner's model preset (default: --model), for a real engine's model path.")
@click.option("--plan-error", type=float,
              help="The model's relative error on a capacity (e.g. 0.2). [default: the --plan-config profile's "
                   "held-out error, else the shipped validation's 20%]")
@click.option("--plan-refit/--no-plan-refit", default=True, show_default=True,
              help="Re-fit the planner's constants on the cells measured so far after each one, and re-rank the rest "
                   "with the re-fitted model and its held-out error.")
@click.option("--progress/--no-progress", default=None, help="Per-request progress bar (default: on a terminal).")
@click.option("--otlp-receiver", is_flag=True,
              help="Receive the engines' per-request OpenTelemetry spans (one OTLP/HTTP receiver on 127.0.0.1 for the "
                   "sweep; each launched engine is pointed at it) and keep each load's in its run folder for the "
                   "TTFT split (docs/metrics.md). Not in virtual time.")
@click.option("--cluster", type=click.Choice(["slurm", "kubernetes"]),
              help="Place each cell's engine on a cluster's nodes (docs/sweeps.md, On a cluster): slurm runs each "
                   "cell as one job (cells side by side with --jobs N); kubernetes applies each cell's manifests and "
                   "runs its loads as Jobs (--dry-run writes the manifests).")
@click.option("--gpus-per-node", type=click.IntRange(1), help="Cluster: GPUs per node. [default: 8]")
@click.option("--max-nodes", type=click.IntRange(1), help="Cluster: most nodes one cell may take.")
@click.option("--gres-type", help="Slurm: GPU type in the gres request, e.g. h100 (gpu:h100:N).")
@click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="ARG",
              help="Slurm: an sbatch option passed through (repeatable), e.g. --sbatch-arg=--partition=gpu "
                   "--sbatch-arg=--account=A --sbatch-arg=--qos=Q.")
@click.option("--time-limit", type=click.IntRange(1),
              help="Slurm: each cell's job --time in minutes, a dead-man limit if bench dies. [default: 120]")
@click.option("--client-shares-node", is_flag=True, default=None,
              help="Slurm: let engines run on the launching host's node (where the load generator runs); by "
                   "default that node is excluded from every cell's job.")
@click.option("--image", help="Kubernetes: the engine's container image.")
@click.option("--client-image", help="Kubernetes: the load generator's image (bench installed).")
@click.option("--namespace", help="Kubernetes: the namespace. [default: default]")
def command(config_path: Path | None, **flags: Any) -> None:
    """Measure every parallel configuration under the workload and recommend the smallest
    one that meets the SLOs.

    \b
    Examples:
      bench sweep --engine sim --model llama-3.1-70b --gpu h100 --gpus 4 --tp 2,4 --dp 1,2 \\
          --capacity --slo ttft_ms=300,tpot_ms=40 --target-rate 38 --input-tokens 128 \\
          --output-tokens 16 --requests 20 --precision 0.2 --engine-arg=--max-num-seqs=8 --out sweeps/70b
      bench sweep --engine vllm --model /models/M --tp 1,2,4 --rate 1,2,4,8 --slo ttft_ms=500 --out sweeps/m
      bench sweep --config sweep.toml --out sweeps/s
      bench sweep --resume --out sweeps/70b        # after an interruption
      bench sweep --resume --out sweeps/70b --slo ttft_ms=150,tpot_ms=40   # tighter SLOs: probe the gaps
    """
    from bench_llm.bench.sweep.spec import load_spec

    out: Path | None = flags.pop("out")
    dry_run = bool(flags.pop("dry_run"))
    resume = bool(flags.pop("resume"))
    retry_failed = bool(flags.pop("retry_failed"))
    progress = flags.pop("progress")
    otlp_receiver = bool(flags.pop("otlp_receiver"))
    jobs: int | None = flags.pop("jobs")
    plan = _plan_settings(flags)
    base: SweepSpec | None
    if config_path is not None:
        base = load_spec(config_path)
    elif resume and out is not None:
        from bench_llm.bench.sweep.orchestrate import stored_spec

        base = stored_spec(out)
    else:
        base = None
    explicit = _explicit_loads(config_path, flags, resumed=base is not None and config_path is None)
    spec = _apply_flags(base, flags).with_clock(explicit)
    spec.validate()
    if not dry_run:
        spec.engine_env_pairs()  # a variable passed by name but unset fails here, before any launch
    if plan is not None:
        from bench_llm.bench.sweep.plan import check

        check(spec)
    if dry_run:
        from bench_llm.bench.sweep.dryrun import dry_run_lines

        click.echo("\n".join(dry_run_lines(spec)))
        return
    if out is None:
        raise BenchError("--out is required (the sweep folder), unless --dry-run")
    from bench_llm.analysis.recommend import recommend
    from bench_llm.analysis.recommend_text import format_recommendation
    from bench_llm.bench.outcome import sweep_outcome
    from bench_llm.bench.sweep.orchestrate import run_sweep
    from bench_llm.bench.sweep.store import write_recommendation

    if not resume:  # a resumed sweep reads Parquet first: its cells come from a fork server
        from bench_llm.bench.sweep.parallel import fork_point

        fork_point(spec, jobs)  # the cells' processes will be forks of this one, imports done
    # the modules just imported (pandas, pyarrow, ...) live as long as the process: the
    # collector's full passes need not scan them again (about 0.1 s of a virtual-time sweep)
    gc.freeze()
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        from bench_llm.results.outdir import claim_sweep_folder, took_over_note

        lock = claim_sweep_folder(out, ("bench", *sys.argv[1:]))  # one writer per sweep folder
        stack.callback(lock.release)
        note = took_over_note(lock)
        if note:
            click.echo(f"note: {note}", err=True)
        receiver = None
        if otlp_receiver:
            from bench_llm.bench.launch_engine import otlp_note
            from bench_llm.bench.sweep.cluster import otlp_host
            from bench_llm.loadgen.otlp import OtlpReceiver

            receiver = stack.enter_context(OtlpReceiver(otlp_host(spec.cluster), 0))  # the nodes' engines reach it
            click.echo(f"OTLP receiver at {receiver.endpoint} ({otlp_note(str(spec.engine), not spec.endpoints)})", err=True)
        if plan is not None:
            from bench_llm.bench.sweep.plan import run_planned

            planned = run_planned(spec, out, plan, resume=resume, echo=lambda line: click.echo(redact(line), err=True),
                                  progress=progress, command=("bench", *sys.argv[1:]), jobs=jobs)  # fmt: skip
            if planned.interrupted:
                raise Outcome(ExitCode.INTERRUPTED,
                              f"sweep interrupted; finish it with: bench sweep --plan --resume --out {out}")  # fmt: skip
        result = None if plan is not None else run_sweep(
            spec,
            out,
            resume=resume,
            retry_failed=retry_failed,
            echo=lambda line: click.echo(redact(line), err=True),
            progress=progress,
            command=("bench", *sys.argv[1:]),
            otlp=receiver,
            jobs=jobs,
        )
    if result is not None and result.interrupted:
        raise Outcome(ExitCode.INTERRUPTED, f"sweep interrupted; finish it with: bench sweep --resume --out {out}")
    rec = recommend(out)
    write_recommendation(out, rec)
    click.echo(f"\nsweep finished in {time.monotonic() - t0:.0f} s: {out}")
    if spec.virtual:
        click.echo(
            "ran in virtual time: the simulated engine's scheduler and cost model, no server or client, "
            "so the same sweep gives the same figures (--clock auto measures it live, in real time)"
        )
    if plan is not None:
        from bench_llm.bench.sweep.plan import format_plan

        pick = rec.recommendation.cell_id if rec.recommendation else None
        click.echo("\n".join(format_plan(planned, pick)))
    click.echo(format_recommendation(rec))
    if spec.engine == "sim":  # the simulated engine's capacities carry its error (issue 36)
        from bench_llm.bench.sweep.model_error import model_error_lines, sim_model_error

        click.echo("\n".join(model_error_lines(rec, sim_model_error(spec.engine_args))))
    if otlp_receiver:
        from bench_llm.analysis.ttft_split import format_sweep_splits, sweep_splits

        for line in format_sweep_splits(sweep_splits(out)):
            click.echo(line)
    outcome = sweep_outcome(out, rec)
    if outcome is not None:
        raise outcome


def _plan_settings(flags: dict[str, Any]) -> Any:
    """``--plan`` and its settings (None: no plan; its settings given without it: an error)."""
    from bench_llm.bench.sweep.plan import PlanSettings

    on = bool(flags.pop("plan"))
    given = {"profile": flags.pop("plan_config"), "model": flags.pop("plan_model"), "error": flags.pop("plan_error")}
    refit = bool(flags.pop("plan_refit"))
    if not on:
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            name = {"profile": "config", "model": "model", "error": "error"}[extra[0]]
            raise BenchError(f"--plan-{name}: a planned sweep's setting; add --plan")
        return None
    from bench_llm.bench.commands.sim import build_config, serve

    def sim_args(argv: list[str]) -> Any:  # a simulated engine's recorded arguments, read by its own parser
        return build_config(serve.make_context("serve", argv).params).model_timing

    return PlanSettings(**given, refit=refit, sim_args=sim_args)


#: Load flags -> LoadSpec fields.
_LOAD_FLAGS = {
    "capacity_start": "capacity_start",
    "precision": "capacity_precision",
    "max_probes": "capacity_max_probes",
    "capacity_repeats": "capacity_repeats",
    "n_requests": "requests",
    "warmup": "warmup",
    "min_window": "min_window_s",
    "max_requests": "max_requests",
}


def _explicit_loads(config_path: Path | None, flags: dict[str, Any], resumed: bool) -> set[str] | None:
    """The load settings this sweep sets itself (flags, its TOML file); None: all of them
    (a resumed sweep keeps what it ran with)."""
    from bench_llm.bench.sweep.spec import toml_load_keys

    if resumed:
        return None
    given = {field for flag, field in _LOAD_FLAGS.items() if flags.get(flag) is not None}
    return given | (toml_load_keys(config_path) if config_path is not None else set())


def _apply_flags(base: SweepSpec | None, flags: dict[str, Any]) -> SweepSpec:
    """``base`` (None: a spec from the flags alone) with the flags given (click's values, None
    where a flag was not given)."""
    from bench_llm.analysis.slo import SLO
    from bench_llm.bench.sweep.spec import SweepSpec, WorkloadSpec

    model = flags.get("model")
    if base is None:
        if not model:
            raise BenchError("--model is required (or give --config FILE)")
        base = SweepSpec(model=str(model))
    # keyword arguments for dataclasses.replace (each field its own type)
    matrix_changes: dict[str, Any] = {
        axis: _ints(flags.get(axis), f"--{axis}")
        for axis in ("tp", "pp", "dp", "ep", "dcp", "pcp")
    }
    disagg = flags.get("disagg")
    if disagg is not None:
        matrix_changes["disagg"] = tuple(v.strip() for v in str(disagg).split(",") if v.strip())
    axes = _axes(flags.get("axes") or ())
    matrix_changes.update(_workload_axes(axes))
    if axes:
        matrix_changes["flags"] = {**base.matrix.flags, **axes}
    matrix = dataclasses.replace(base.matrix, **{k: v for k, v in matrix_changes.items() if v is not None})

    rates = _floats(flags.get("rates"), "--rate")
    concs = _ints(flags.get("concs"), "--concurrency")
    load_changes: dict[str, Any] = {field: flags.get(flag) for flag, field in _LOAD_FLAGS.items()}
    if rates is not None or concs is not None or flags.get("capacity"):
        # a load kind given on the command line replaces the file's
        load_changes.update(rates=rates or (), concurrency=concs or (), capacity=bool(flags.get("capacity")))
    loads = dataclasses.replace(base.loads, **{k: v for k, v in load_changes.items() if v is not None})

    w_changes: dict[str, Any] = {
        "input_tokens": flags.get("input_tokens"),
        "output_tokens": flags.get("output_tokens"),
        "arrival": flags.get("arrival"),
        "seed": flags.get("seed"),
        "tokenizer": flags.get("tokenizer"),
        "tokenize_url": flags.get("tokenize_url"),
    }
    w_changes = {k: v for k, v in w_changes.items() if v is not None}
    refs = flags.get("workload_refs") or ()
    if refs:
        workloads = tuple(WorkloadSpec(name=str(r), **w_changes) for r in refs)
    else:
        workloads = tuple(dataclasses.replace(w, **w_changes) for w in base.workloads)

    slo_text = flags.get("slo_text")
    slo = None
    if slo_text is not None:
        slo = SLO.parse(str(slo_text)).as_dict()
    engine_args = tuple(flags.get("engine_args") or ()) or None
    engine_env = tuple(flags.get("engine_env") or ()) or None
    return base.with_overrides(
        model=model,
        engine=flags.get("engine"),
        gpu=flags.get("gpu"),
        gpus=flags.get("gpus"),
        matrix=matrix,
        loads=loads,
        workloads=workloads,
        repeats=flags.get("repeats"),
        slo=slo,
        attainment_pct=flags.get("attainment"),
        confidence=flags.get("confidence"),
        target_rate=flags.get("target_rate"),
        target_concurrency=flags.get("target_concurrency"),
        engine_args=engine_args,
        engine_env=engine_env,
        ready_timeout_s=flags.get("ready_timeout"),
        engine_version=flags.get("engine_version"),
        workers=flags.get("workers"),
        clock=flags.get("clock"),
        endpoints=_endpoints(tuple(flags.get("urls") or ())),
        cluster=_cluster(base.cluster, flags),
    )


#: Cluster flags -> ClusterSpec fields.
_CLUSTER_FLAGS = {
    "cluster": "manager", "gpus_per_node": "gpus_per_node", "max_nodes": "max_nodes", "gres_type": "gres_type",
    "sbatch_args": "sbatch_args", "time_limit": "time_limit_min", "image": "image", "client_image": "client_image",
    "namespace": "namespace", "client_shares_node": "client_shares_node",
}  # fmt: skip


def _cluster(base: Any, flags: dict[str, Any]) -> Any:
    """The sweep's cluster: ``base``'s (TOML ``[cluster]``, a resumed sweep's) with the cluster
    flags given; None when neither names one."""
    from bench_llm.launch.placement import ClusterSpec

    given = {field: flags.pop(flag, None) for flag, field in _CLUSTER_FLAGS.items()}
    given = {k: (tuple(v) if isinstance(v, tuple) else v) for k, v in given.items() if v not in (None, ())}
    if base is None and not given:
        return None
    if base is None and "manager" not in given:
        raise BenchError(f"--{next(iter(given)).replace('_', '-')}: a cluster setting; give --cluster slurm|kubernetes")
    try:
        return dataclasses.replace(base, **given) if base is not None else ClusterSpec(**given)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
