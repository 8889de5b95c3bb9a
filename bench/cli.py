"""The ``bench`` command line: one verb per job.

Subcommands live in ``bench/commands/<name>.py`` (each exports ``command``) and are
imported only when used, so ``bench --help`` stays fast.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import sys

import click

from bench_llm.bench.errors import CliError, ExitCode, as_cli_error, os_error_message
from bench_llm.core import __version__
from bench_llm.core.errors import BenchError
from bench_llm.core.memory import use_system_allocator

use_system_allocator()  # before pyarrow's first allocation (core/memory.py: why)

#: verb -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("bench_llm.bench.commands.run", "Measure one workload against an engine (the embedded one by default)."),
    "summary": ("bench_llm.bench.commands.summary", "Print the metric table of a run folder (or --json)."),
    "sweep": ("bench_llm.bench.commands.sweep", "Launch an engine at each parallel configuration, measure, recommend."),
    "recommend": ("bench_llm.bench.commands.recommend", "Recommend the smallest configuration that meets the SLOs."),
    "report": ("bench_llm.bench.commands.report", "Write a self-contained HTML report of runs or a sweep."),
    "compare": ("bench_llm.bench.commands.compare", "Compare two runs with bootstrap confidence intervals."),
    "gate": ("bench_llm.bench.commands.gate", "CI performance gate: fail on a real regression, not on noise."),
    "history": ("bench_llm.bench.commands.history", "Add a run or sweep to a results store (partitioned Parquet history)."),
    "trend": ("bench_llm.bench.commands.trend", "Change points in each gated metric across commits of a results store."),
    "workload": ("bench_llm.bench.commands.workload", "Inspect workloads (bench workload show NAME|FILE)."),
    "sim": ("bench_llm.bench.commands.sim", "The embedded simulated engine (bench sim serve)."),
    "locust": ("bench_llm.bench.commands.locust", "Distributed load generation on locust (master/worker)."),
}


class LazyGroup(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        """The one place where a library's input error becomes a CLI message and exit code."""
        try:
            return super().invoke(ctx)
        except BenchError as exc:  # the root of bench's errors (core/errors.py)
            raise as_cli_error(exc) from None
        except BrokenPipeError:
            raise  # a reader that stopped reading (`| head`): click ends quietly
        except OSError as exc:  # every verb's output path: read-only, no space, not a folder, ...
            raise CliError(os_error_message(exc)) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (module, _) in COMMANDS.items() if importlib.util.find_spec(module) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        entry = COMMANDS.get(name)
        if entry is None or importlib.util.find_spec(entry[0]) is None:
            return None
        cmd: click.Command = importlib.import_module(entry[0]).command
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="bench")
def cli() -> None:
    """Benchmark and load-test LLM inference engines (vLLM, SGLang, TGI, OpenAI-compatible).

    \b
    Quick start (no GPU needed, uses the embedded simulated engine):
      bench run --concurrency 16 --requests 200 --out runs/first
      bench summary runs/first
      bench sweep --engine sim --model llama-3.1-70b --gpu h100 --gpus 4 --tp 2,4 --dp 1,2 \\
          --capacity --slo ttft_ms=300,tpot_ms=40 --target-rate 38 --input-tokens 128 \\
          --output-tokens 16 --requests 20 --precision 0.2 --engine-arg=--max-num-seqs=8 --out runs/sweep
      bench report runs/sweep -o report.html

    Each verb has its own --help. Metric definitions: docs/metrics.md.
    """


def main() -> None:
    try:
        cli.main(prog_name="bench", standalone_mode=True)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    finally:
        # Free Arrow objects while Arrow is whole: left to the interpreter's final teardown, a
        # Parquet reader's pool thread could outlive it and abort the process after its work was
        # done ("terminate called without an active exception", exit -6; apache/arrow#34314),
        # seen in about 1 of 15 virtual-time sweeps.
        gc.collect()

