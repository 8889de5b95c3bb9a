"""The layers of docs/architecture.md hold: every import of every module is one the drawing allows.

The allowed imports are read from the table in docs/architecture.md, so the check enforces
exactly what the page draws. Imports inside functions count (a lazy upward import is still
an upward import). A planted upward import in a temporary tree shows the check can fail.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: The one import package; its layers are the repository's top-level folders (pyproject.toml).
PACKAGE = "bench_llm"
ARCHITECTURE = REPO / "docs" / "architecture.md"

#: Third-party modules that may be imported only by the files listed (docs/architecture.md, "nevers").
CONFINED: Mapping[str, frozenset[str]] = {
    name: frozenset({"bench/distributed/locust_master.py", "bench/distributed/locust_worker.py", "bench/commands/locust.py"})
    for name in ("locust", "gevent")
}


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    imported: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: imports {self.imported} ({self.why})"


def read_layers(page: Path) -> dict[str, frozenset[str]]:
    """Layer -> layers it may import, from the table between the ``layers`` markers."""
    text = page.read_text()
    block = text.split("<!-- layers:", 1)[1].split("<!-- /layers -->", 1)[0]
    layers: dict[str, frozenset[str]] = {}
    for row in block.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        layers[cells[0].strip("`")] = frozenset(re.findall(r"`(\w+)`", cells[1]))
    return layers


def _imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == PACKAGE:
            for alias in node.names:  # from bench_llm import results
                yield node.lineno, f"{PACKAGE}.{alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def violations(root: Path, layers: Mapping[str, frozenset[str]]) -> list[Violation]:
    """Every import under ``root`` that the layer table or a "never" forbids."""
    first_party = set(layers) | {"tests"}
    found: list[Violation] = []
    for layer in sorted(layers):
        for path in sorted((root / layer).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for line, name in _imports(ast.parse(path.read_text(), rel)):
                parts = name.split(".")
                if parts[0] in layers and parts[0] != "benchmarks":  # benchmarks/ is scripts, not in the package
                    found.append(Violation(rel, line, name, f"a layer is imported as {PACKAGE}.{parts[0]}, never bare"))
                    continue
                top = parts[1] if parts[0] == PACKAGE and len(parts) > 1 else parts[0]
                if top in first_party and top != layer and top not in layers[layer]:
                    found.append(Violation(rel, line, name, f"{layer} may import only {sorted(layers[layer]) or 'nothing'}"))
                elif top in CONFINED and rel not in CONFINED[top]:
                    found.append(Violation(rel, line, name, f"{top} is confined to {sorted(CONFINED[top])}"))
    return found


def test_the_table_covers_every_package() -> None:
    layers = read_layers(ARCHITECTURE)
    packages = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"tests"}
    assert packages <= set(layers), f"packages missing from docs/architecture.md's table: {packages - set(layers)}"
    assert "benchmarks" in layers and layers["core"] == frozenset()
    # the "nevers" that the table itself carries
    assert layers["analysis"] <= {"core", "results"}
    assert not layers["sim"] & {"loadgen", "adapters"}


def test_every_import_follows_the_layers() -> None:
    found = violations(REPO, read_layers(ARCHITECTURE))
    assert not found, "imports against docs/architecture.md:\n" + "\n".join(map(str, found))


def test_a_planted_upward_import_fails(tmp_path: Path) -> None:
    layers = read_layers(ARCHITECTURE)
    for layer in layers:
        (tmp_path / layer).mkdir()
        (tmp_path / layer / "__init__.py").write_text("")
    (tmp_path / "core" / "fine.py").write_text("import json\n")
    (tmp_path / "loadgen" / "ok.py").write_text(
        "from bench_llm.workloads.spec import Schedule\nfrom bench_llm.core.errors import BenchError\nfrom bench_llm import results\n"
    )
    assert violations(tmp_path, layers) == []

    (tmp_path / "loadgen" / "up.py").write_text("def f():\n    from bench_llm.bench.execute import run_async\n")
    (tmp_path / "analysis" / "reads.py").write_text("import bench_llm.loadgen.runner\n")
    (tmp_path / "sim" / "client.py").write_text("from bench_llm.adapters.base import Adapter\n")
    (tmp_path / "core" / "up.py").write_text("from bench_llm import sim\n")
    (tmp_path / "results" / "bare.py").write_text("from core.errors import BenchError\n")
    (tmp_path / "benchmarks" / "fixture.py").write_text("from tests.test_x import helper\n")
    (tmp_path / "results" / "patched.py").write_text("import gevent.monkey\n")
    found = {(v.path, v.imported) for v in violations(tmp_path, layers)}
    assert found == {
        ("loadgen/up.py", "bench_llm.bench.execute"),
        ("analysis/reads.py", "bench_llm.loadgen.runner"),
        ("sim/client.py", "bench_llm.adapters.base"),
        ("core/up.py", "bench_llm.sim"),
        ("results/bare.py", "core.errors"),
        ("benchmarks/fixture.py", "tests.test_x"),
        ("results/patched.py", "gevent.monkey"),
    }
