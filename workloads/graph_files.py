"""Reading a file of job graphs in whichever format it holds: bench's own graph JSONL
(workloads/graph.py) or Weka agentic traces (workloads/weka.py), recognised by content."""

from __future__ import annotations

from pathlib import Path

from bench_llm.workloads.graph import FileGraphs, read_graph_jsonl
from bench_llm.workloads.weka import is_weka, read_weka


def read_graph_file(path: Path) -> FileGraphs:
    """A graph JSONL file, or Weka agentic traces (recognised by their content)."""
    if is_weka(path):
        return FileGraphs(str(path), tuple(read_weka(path)), "weka")
    return FileGraphs(str(path), tuple(read_graph_jsonl(path)))
