"""Loading a run folder into the tables analysis works on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from results.reader import find_runs, read_monitor, read_requests, read_run_meta


@dataclass(frozen=True)
class Run:
    path: Path
    meta: dict[str, Any]
    requests: pa.Table  # every row, warm-up included
    monitor: pa.Table | None

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id", self.path.name))


def load_run(path: Path, columns: list[str] | None = None) -> Run:
    runs = find_runs(Path(path))
    if len(runs) != 1:
        raise ValueError(f"{path}: holds {len(runs)} runs; name one run folder")
    run_dir = runs[0]
    return Run(run_dir, read_run_meta(run_dir), read_requests(run_dir, columns), read_monitor(run_dir))


def load_runs(path: Path, columns: list[str] | None = None) -> list[Run]:
    return [Run(p, read_run_meta(p), read_requests(p, columns), read_monitor(p)) for p in find_runs(Path(path))]
