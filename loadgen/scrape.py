"""Scraping an engine's Prometheus ``/metrics`` at a fixed interval during a run.

A daemon thread fetches the page, parses it with prometheus_client's text parser and
appends long-format rows (``results.schema.SERVER_METRICS_SCHEMA``) to
``server_metrics/part-*.parquet``: one row per sample; histogram buckets one row each
(``le``), plus ``_sum``/``_count`` rows; counters, buckets, sums and counts also carry the
``delta`` from the previous scrape (the value itself after a counter reset). One scrape is
taken right at ``start()`` and one at ``stop()`` so the run's window is covered at both
ends. The client's timestamps come from the transport (kernel receive stamps), so this
thread does not disturb them; it never raises into the run: failures are counted.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench_llm.adapters.metrics_map import CUMULATIVE_GAUGES, MetricNames, metric_names
from bench_llm.core.control import EngineClient
from bench_llm.results.schema import SERVER_METRICS_DIR, SERVER_METRICS_SCHEMA
from bench_llm.results.writer import PartWriter

_DELTA_TYPES = frozenset({"counter", "histogram_bucket", "histogram_sum", "histogram_count", "summary_sum",
                          "summary_count"})  # fmt: skip


_ALL_NAMES = metric_names()


def parse_metrics(text: str, ts_ns: int, names: MetricNames = _ALL_NAMES) -> list[dict[str, Any]]:
    """Long-format rows (without ``delta``) for one /metrics page; common names from ``names``."""
    rows: list[dict[str, Any]] = []
    for family in text_string_to_metric_families(text):
        fname = family.name
        if fname.endswith("_created"):
            continue  # prometheus_client's creation timestamps, not measurements
        common = names.common(fname)
        ftype = family.type
        for sample in family.samples:
            sname = sample.name
            labels = sample.labels
            if common is not None and labels.get("priority"):
                common_here = names.common(fname, labels)
            else:
                common_here = common
            le: float | None = None
            stype = ftype
            if ftype in ("histogram", "gaugehistogram"):
                if sname.endswith("_bucket"):
                    stype = "histogram_bucket"
                    labels = dict(labels)
                    le = float(labels.pop("le", "inf"))
                elif sname.endswith("_sum"):
                    stype = "histogram_sum"
                elif sname.endswith("_count"):
                    stype = "histogram_count"
                else:
                    continue  # _created / _gsum etc.
            elif ftype == "summary":
                if sname.endswith("_sum"):
                    stype = "summary_sum"
                elif sname.endswith("_count"):
                    stype = "summary_count"
                elif sname.endswith("_created"):
                    continue
            elif ftype == "counter" and sname.endswith("_created"):
                continue
            elif ftype in ("unknown", "untyped") and sname.endswith("_total"):
                stype = "counter"  # an untyped page (no TYPE lines): the suffix says counter
            rows.append(
                {
                    "ts_ns": ts_ns,
                    "metric": sname,
                    "common": common_here,
                    "type": stype,
                    "labels": json.dumps(labels, sort_keys=True, separators=(",", ":")) if labels else "",
                    "le": le,
                    "value": float(sample.value),
                }
            )
    return rows


class DeltaTracker:
    """Adds ``delta`` (vs the previous scrape) to counter-like rows.

    The first page is the baseline (no deltas). A series first seen on a later page was created
    since the page before, at 0 (engines create a labelled series, or a whole counter in TGI's
    exporter, when it is first counted: an ``abort`` reason, a first preemption): its value is
    its delta, not lost to the baseline."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str, float | None], float] = {}
        self._pages = 0

    def apply(self, rows: list[dict[str, Any]]) -> None:
        last = self._last
        born = None if self._pages == 0 else 0.0  # a new series' previous value
        self._pages += 1
        for row in rows:
            if row["type"] not in _DELTA_TYPES and row["metric"] not in CUMULATIVE_GAUGES:
                row["delta"] = None
                continue
            key = (row["metric"], row["labels"], row["le"])
            value = row["value"]
            prev = last.get(key, born)
            row["delta"] = None if prev is None else (value - prev if value >= prev else value)
            last[key] = value


class MetricsScraper:
    """Scrapes ``url`` every ``interval_s`` into ``run_dir/server_metrics``. Start/stop around a run."""

    def __init__(self, url: str, run_dir: Path, interval_s: float = 1.0, timeout_s: float | None = None,
                 path: str = "/metrics", worker_id: int = 0, names: MetricNames = _ALL_NAMES) -> None:  # fmt: skip
        if interval_s <= 0:
            raise ValueError("scrape interval must be positive")
        self.url = url.rstrip("/") + path
        self.names = names
        self._path = path
        self._client = EngineClient(url)
        self.interval_s = interval_s
        self.timeout_s = timeout_s if timeout_s is not None else max(1.0, min(5.0, interval_s))
        self.writer = PartWriter(Path(run_dir) / SERVER_METRICS_DIR, SERVER_METRICS_SCHEMA, worker_id,
                                 flush_rows=20000, flush_interval_s=5.0)  # fmt: skip
        self._deltas = DeltaTracker()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.scrapes = 0
        self.failures = 0
        self.last_error: str | None = None
        #: Why scraping stopped early (a page past its bound, a write that failed), or None.
        self.stopped_because: str | None = None

    def scrape_once(self) -> bool:
        """One scrape; True when it produced rows."""
        t_send = time.perf_counter_ns()
        if self.stopped_because is not None:
            return False
        reply = self._client.metrics(self._path, self.timeout_s)
        t_recv = time.perf_counter_ns()
        if reply.too_large:  # never parsed; asked again every interval it would skew the run
            return self._give_up(f"/metrics: {reply.problem()}")
        if not reply.ok:
            return self._failed(reply.problem())
        try:
            rows = parse_metrics(reply.body.decode("utf-8", "replace"), (t_send + t_recv) // 2, self.names)
        except ValueError as exc:  # the parser's complaint about a malformed page
            return self._failed(f"unparsable /metrics: {exc}")
        self._deltas.apply(rows)
        for row in rows:
            self.writer.add(row)
        self.scrapes += 1
        if self.writer.due:
            self._flush()
        return bool(rows)

    def _flush(self) -> None:
        """Write the pending rows; a write that fails (a full disk) stops the scraping, with a
        note, and never raises into the run (the run's own writer reports the disk)."""
        try:
            self.writer.flush()
        except OSError as exc:
            self._give_up(f"cannot write {self.writer.folder}: {exc.strerror or str(exc).splitlines()[0]}")

    def _failed(self, reason: str) -> bool:
        self.failures += 1
        self.last_error = reason[:200]
        return False

    def _give_up(self, reason: str) -> bool:
        """Stop scraping for the rest of the run: one line on stderr, the reason recorded."""
        self._failed(reason)
        if self.stopped_because is None:
            self.stopped_because = self.last_error
            sys.stderr.write(f"note: server metrics: {self.last_error}; scraping stopped for this run\n")
        return False

    def _loop(self) -> None:
        next_t = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_t - time.monotonic())):
            self.scrape_once()
            next_t += self.interval_s
            if next_t < time.monotonic():  # fell behind (slow server): skip, never burst
                next_t = time.monotonic() + self.interval_s

    def start(self) -> None:
        self.scrape_once()  # the baseline at the start of the window
        self._thread = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)
            self._thread = None
        self.scrape_once()  # the end of the window
        self._flush()

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "interval_s": self.interval_s,
            "scrapes": self.scrapes,
            "failures": self.failures,
            "last_error": self.last_error,
            "stopped": self.stopped_because,
            "rows": self.writer.rows_written,
        }
