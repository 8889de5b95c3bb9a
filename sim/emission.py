"""The engine's own emission log: every token's intended and actual send time.

Written as Parquet (``server_request_id``, ``token_index``, ``intended_ns``, ``actual_ns``;
perf_counter_ns, CLOCK_MONOTONIC, the clock the client uses on the same host), flushed
periodically in a worker thread and closed at shutdown, so a client's timing can be
compared token by token with ground truth.
"""

from __future__ import annotations

import threading
from array import array
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        ("server_request_id", pa.string()),
        ("token_index", pa.int64()),
        ("intended_ns", pa.int64()),
        ("actual_ns", pa.int64()),
    ]
)


class EmissionLog:
    __slots__ = ("path", "_rids", "_idx", "_intended", "_actual", "_writer", "_lock", "rows")

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._rids: list[str] = []
        self._idx = array("q")
        self._intended = array("q")
        self._actual = array("q")
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(self.path, SCHEMA)
        self._lock = threading.Lock()
        self.rows = 0
        # the first list -> Arrow conversion loads lazy modules (~1 s): pay it at start, not mid-run
        pa.Table.from_arrays([pa.array(["x"]), pa.array(array("q", [0]), pa.int64())], names=["a", "b"])

    def add(self, rid: str, first_index: int, intended: tuple[int, ...], actual_ns: int) -> None:
        n = len(intended)
        self._rids.extend([rid] * n) if n > 1 else self._rids.append(rid)
        self._idx.extend(range(first_index, first_index + n))
        self._intended.extend(intended)
        self._actual.extend([actual_ns] * n) if n > 1 else self._actual.append(actual_ns)
        self.rows += n

    def add1(self, rid: str, index: int, intended: int, actual_ns: int) -> None:
        self._rids.append(rid)
        self._idx.append(index)
        self._intended.append(intended)
        self._actual.append(actual_ns)
        self.rows += 1

    def take(self) -> pa.Table | None:
        """Detach the buffered rows as a table (cheap; call on the event loop)."""
        if not self._rids:
            return None
        table = pa.Table.from_arrays(
            [
                pa.array(self._rids, pa.string()),
                pa.array(self._idx, pa.int64()),
                pa.array(self._intended, pa.int64()),
                pa.array(self._actual, pa.int64()),
            ],
            schema=SCHEMA,
        )
        self._rids = []
        self._idx = array("q")
        self._intended = array("q")
        self._actual = array("q")
        return table

    def write(self, table: pa.Table | None) -> None:
        """Append ``table`` (safe from a worker thread)."""
        if table is None:
            return
        with self._lock:
            if self._writer is not None:
                self._writer.write_table(table)

    def close(self) -> None:
        self.write(self.take())
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
