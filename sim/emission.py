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

import numpy as np
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
    __slots__ = ("path", "_rids", "_idx", "_intended", "_actual", "_writer", "_lock", "rows", "_codes", "_names")

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._rids = array("q")  # codes into _names (cheap to append and to convert)
        self._codes: dict[str, int] = {}
        self._names: list[str] = []
        self._idx = array("q")
        self._intended = array("q")
        self._actual = array("q")
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(self.path, SCHEMA)
        self._lock = threading.Lock()
        self.rows = 0
        # the first list -> Arrow conversion loads lazy modules (~1 s): pay it at start, not mid-run
        self.write(None)
        warm = pa.DictionaryArray.from_arrays(pa.array(np.zeros(1, np.int64)), pa.array(["x"])).cast(pa.string())
        pa.Table.from_arrays([warm, pa.array(np.zeros(1, np.int64))], names=["a", "b"])

    def _code(self, rid: str) -> int:
        c = self._codes.get(rid)
        if c is None:
            c = self._codes[rid] = len(self._names)
            self._names.append(rid)
        return c

    def add(self, rid: str, first_index: int, intended: tuple[int, ...], actual_ns: int) -> None:
        n = len(intended)
        c = self._code(rid)
        self._rids.extend([c] * n) if n > 1 else self._rids.append(c)
        self._idx.extend(range(first_index, first_index + n))
        self._intended.extend(intended)
        self._actual.extend([actual_ns] * n) if n > 1 else self._actual.append(actual_ns)
        self.rows += n

    def add1(self, rid: str, index: int, intended: int, actual_ns: int) -> None:
        c = self._codes.get(rid)
        self._rids.append(self._code(rid) if c is None else c)
        self._idx.append(index)
        self._intended.append(intended)
        self._actual.append(actual_ns)
        self.rows += 1

    def take(self) -> tuple[array, array, array, array, list[str]] | None:
        """Detach the buffered rows (O(1) on the event loop; conversion happens in ``write``)."""
        if not self._rids:
            return None
        batch = (self._rids, self._idx, self._intended, self._actual, list(self._names))
        self._rids = array("q")
        self._idx = array("q")
        self._intended = array("q")
        self._actual = array("q")
        if len(self._names) > 100_000:  # finished requests' ids are not needed again
            self._codes.clear()
            self._names = []
        return batch

    def write(self, batch: tuple[array, array, array, array, list[str]] | None) -> None:
        """Append ``batch`` to the file (safe from a worker thread)."""
        if batch is None:
            return
        codes, idx, intended, actual, names = batch
        rid = pa.DictionaryArray.from_arrays(pa.array(np.frombuffer(codes, np.int64)), pa.array(names, pa.string()))
        table = pa.Table.from_arrays(
            [rid.cast(pa.string()), *(pa.array(np.frombuffer(a, np.int64)) for a in (idx, intended, actual))],
            schema=SCHEMA,
        )
        with self._lock:
            if self._writer is not None:
                self._writer.write_table(table)

    def close(self) -> None:
        self.write(self.take())
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
