"""The bounds on what bench reads from files and servers, declared once (docs/results.md,
"Input bounds", lists every one). Past a bound bench says so in one line and records the
item (a failed scrape, a refused file), never holding more than the bound in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

#: One ``/metrics`` page (vLLM's is about 100 KB; one with thousands of LoRA or label series
#: a few MB). A larger page is not parsed: the scrape fails and scraping stops for the run.
MAX_METRICS_BYTES = 16 << 20
#: Any other answer of an engine's control routes (``/v1/models``, ``/version``, ``/tokenize``).
MAX_CONTROL_BYTES = 16 << 20
#: A JSON file given with ``@FILE`` (``--extra-body``, ``--json-schema``).
MAX_JSON_ARG_BYTES = 1 << 20
#: One line of a workload or dataset file (JSONL, CSV): a prompt of 2M tokens is about 8 MB.
MAX_LINE_BYTES = 32 << 20
#: A dataset file that is one JSON array (ShareGPT dumps), read whole.
MAX_JSON_FILE_BYTES = 512 << 20
#: A TOML file (a sweep, gates, a workload definition).
MAX_TOML_BYTES = 4 << 20


def read_bounded(path: Path | str, max_bytes: int) -> bytes:
    """The bytes of ``path``, or ``ValueError`` (one line naming the file and the bound) when
    it holds more than ``max_bytes``; never reads more than ``max_bytes + 1`` (``/dev/zero``)."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path}: larger than {human_bytes(max_bytes)}, the bound on such a file (docs/results.md, Input bounds)")
    return data


def bounded_lines(f: BinaryIO, max_bytes: int, where: str) -> Iterator[bytes]:
    """The lines of ``f``, each at most ``max_bytes`` long, or ``ValueError`` naming
    ``where`` and the line number at the first longer one (read no further)."""
    line_no = 0
    while True:
        raw = f.readline(max_bytes + 1)
        if not raw:
            return
        line_no += 1
        if len(raw) > max_bytes and not raw.endswith(b"\n"):
            raise ValueError(f"{where}:{line_no}: a line longer than {human_bytes(max_bytes)}, the bound on a line "
                             "(docs/results.md, Input bounds)")  # fmt: skip
        yield raw


def human_bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"
