"""No import cycle among bench's modules: every import (including those inside functions and under
TYPE_CHECKING) makes an edge, and the module graph must have no strongly connected component
larger than one module. A cycle is a design smell even when Python tolerates it at run time: two
modules that need each other are one module, or a third is missing below both."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "bench_llm"
LAYERS = ("core", "bench", "loadgen", "adapters", "launch", "workloads", "analysis", "results", "sim")


def module_files(root: Path) -> dict[str, Path]:
    mods = {}
    for layer in LAYERS:
        for path in (root / layer).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join((PACKAGE, *parts))
            mods[name.removesuffix(".__init__")] = path
    return mods


def import_graph(mods: Mapping[str, Path]) -> dict[str, set[str]]:
    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {resolve(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps |= {resolve(f"{node.module}.{a.name}") if f"{node.module}.{a.name}" in mods else resolve(node.module)
                         for a in node.names}
        graph[name] = deps - {"", name}
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycle() -> None:
    found = cycles(import_graph(module_files(REPO)))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_a_planted_cycle_is_found(tmp_path: Path) -> None:
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
        (tmp_path / layer / "__init__.py").write_text("")
    (tmp_path / "sim" / "a.py").write_text("def f():\n    from bench_llm.sim.b import g\n")
    (tmp_path / "sim" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bench_llm.sim import a\n")
    (tmp_path / "sim" / "c.py").write_text("from bench_llm.sim.a import f\n")
    assert cycles(import_graph(module_files(tmp_path))) == [["bench_llm.sim.a", "bench_llm.sim.b"]]
