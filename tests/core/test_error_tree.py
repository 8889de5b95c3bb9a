"""One exception root: every public error class bench defines derives from core.errors.BenchError,
so the CLI translates errors in one place (bench/cli.py) and callers need one ``except``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import click
import click.testing

from bench_llm.core.errors import BenchError, SettingError

#: Exceptions that are not errors of bench's: how the CLI itself ends a verb (click's own tree),
#: and the interruption signal a sweep's cells raise (ends in exit 130, never an error line).
NOT_ERRORS = {"CliError", "Outcome", "SweepInterrupted"}
#: Modules that import locust (gevent patches the standard library at import).
SKIP = ("locust",)
LAYERS = ("core", "bench", "loadgen", "adapters", "launch", "workloads", "analysis", "results", "sim")


def _public_exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    infos = []
    for layer in LAYERS:
        package = importlib.import_module(f"bench_llm.{layer}")
        infos += [pkgutil.ModuleInfo(None, package.__name__, True),  # type: ignore[arg-type]
                  *pkgutil.walk_packages(package.__path__, f"{package.__name__}.")]
    for info in infos:
        if any(s in info.name for s in SKIP) or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name
                    and not name.startswith("_")):
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_public_error_derives_from_the_one_root() -> None:
    classes = _public_exception_classes()
    assert len(classes) >= 15, sorted(classes)  # the tree documented in core/errors.py
    strays = sorted(name for name, cls in classes.items()
                    if not issubclass(cls, BenchError) and name.rsplit(".", 1)[1] not in NOT_ERRORS)
    assert not strays, f"exception classes outside core.errors.BenchError: {strays}"


def test_the_cli_turns_any_bench_error_into_one_line_and_exit_2() -> None:
    from bench_llm.bench.cli import LazyGroup
    from bench_llm.results.reader import ResultsError

    class Group(LazyGroup):  # LazyGroup's error handling, click's own command table
        get_command = click.Group.get_command  # type: ignore[assignment]
        list_commands = click.Group.list_commands  # type: ignore[assignment]

    @click.group(cls=Group)
    def group() -> None: ...

    @group.command("boom")
    def boom() -> None:
        raise ResultsError("runs/x: not a bench run (no run.parquet)")

    @group.command("setting")
    def setting() -> None:
        raise SettingError("$input_tokens must be >= 1")

    runner = click.testing.CliRunner()
    out = runner.invoke(group, ["boom"])
    assert out.exit_code == 2 and out.output.strip() == "error: runs/x: not a bench run (no run.parquet)"
    out = runner.invoke(group, ["setting"])
    assert out.exit_code == 2 and out.output.strip() == "error: --input-tokens must be >= 1"
