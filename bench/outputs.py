"""Files a CI step asks for (JUnit, Markdown, JSON, HTML), and the GitHub job summary."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from bench_llm.core.files import write_text_atomic


def write_outputs(files: Iterable[tuple[Path | None, Callable[[], str]]], summary_markdown: str) -> None:
    """Write each requested file (its text built only when asked for) and append the Markdown
    to ``$GITHUB_STEP_SUMMARY`` when that is set (GitHub Actions)."""
    for path, text in files:
        if path is not None:
            write_text_atomic(path, text())
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as f:
            f.write(summary_markdown)
