"""The simulated engine's arguments are declared once (sim/serve_args.py): the library's parser
and ``bench sim serve``'s click options read the same table and agree, and no library module
calls into a CLI command."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench_llm.bench.commands.sim import serve
from bench_llm.sim.serve_args import ServeArgsError, build_config, parse_serve_args

ROOT = Path(__file__).resolve().parents[2]

ARGVS = [
    [],
    ["--timing", "model", "--model-preset", "llama-3.1-70b", "--tp", "2", "--dp", "2", "--max-num-seqs=8"],
    ["--enable-prefix-caching", "--config", "x.toml", "--max-loras", "2", "--disagg", "1:1"],
    ["--no-enable-prefix-caching", "--mlock", "--lora-adapters", "a,b", "--max-num-queued-reqs", "4"],
]


@pytest.mark.parametrize("argv", ARGVS)
def test_the_library_parses_an_argv_as_the_command_does(argv: list[str]) -> None:
    assert parse_serve_args(argv) == serve.make_context("serve", list(argv)).params


def test_the_same_config_from_either() -> None:
    argv = ARGVS[1]
    assert build_config(parse_serve_args(argv)) == build_config(serve.make_context("serve", list(argv)).params)


@pytest.mark.parametrize("argv", [["--foo"], ["--gpu", "x"], ["--max-loras", "0"], ["--tp", "x"], ["extra"]])
def test_what_the_engine_does_not_take_is_a_bench_error(argv: list[str]) -> None:
    with pytest.raises(ServeArgsError):
        parse_serve_args(argv)


def test_no_library_module_imports_a_cli_command() -> None:
    """Only the CLI (bench/cli.py, bench/commands/) imports bench/commands."""
    offenders = []
    layers = ("core", "bench", "loadgen", "adapters", "launch", "workloads", "analysis", "results", "sim")
    for path in sorted(p for layer in layers for p in (ROOT / layer).rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[:2] == ("bench", "commands") or rel == Path("bench/cli.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])  # fmt: skip
            if any(n.startswith("bench_llm.bench.commands") for n in names):
                offenders.append(str(rel))
    assert offenders == []
