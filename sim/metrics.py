"""A small Prometheus text-format registry for the simulated engine's /metrics."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

DEFAULT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


@dataclass
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...] = DEFAULT_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0
    #: labels of this series beyond the registry's (e.g. TGI's ``method="prefill"``)
    extra: str = ""

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.n += 1

    def render(self, labels: str) -> list[str]:
        if self.extra:
            labels = f"{labels},{self.extra}" if labels else self.extra
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cum = 0
        sep = "," if labels else ""
        for b, c in zip(self.buckets, self.counts):
            cum += c
            out.append(f'{self.name}_bucket{{{labels}{sep}le="{b}"}} {cum}')
        out.append(f'{self.name}_bucket{{{labels}{sep}le="+Inf"}} {self.n}')
        out.append(f"{self.name}_sum{{{labels}}} {self.total}")
        out.append(f"{self.name}_count{{{labels}}} {self.n}")
        return out


class Registry:
    """Gauges, counters and histograms rendered with fixed labels."""

    def __init__(self, labels: dict[str, str], counter_suffix: str = "_total") -> None:
        self.labels = ",".join(f'{k}="{v}"' for k, v in labels.items())
        self.counter_suffix = counter_suffix
        self.labelled: dict[str, tuple[str, str, dict[str, float]]] = {}
        self.gauges: dict[str, tuple[str, float]] = {}
        self.counters: dict[str, tuple[str, float]] = {}
        self.histograms: dict[str, Histogram] = {}

    def gauge(self, name: str, help: str, value: float) -> None:
        self.gauges[name] = (help, value)

    def inc(self, name: str, help: str, by: float = 1.0) -> None:
        old = self.counters.get(name, (help, 0.0))[1]
        self.counters[name] = (help, old + by)

    def inc_labelled(self, name: str, help: str, label: str, value: str, by: float = 1.0) -> None:
        """A counter with one extra label (e.g. ``finished_reason``, ``err``)."""
        entry = self.labelled.setdefault(name, (help, label, {}))
        entry[2][value] = entry[2].get(value, 0.0) + by

    def histogram(self, name: str, help: str, buckets: tuple[float, ...] = DEFAULT_BUCKETS, extra: str = "") -> Histogram:
        key = f"{name}{{{extra}}}" if extra else name
        h = self.histograms.get(key)
        if h is None:
            h = self.histograms[key] = Histogram(name, help, buckets, extra=extra)
        return h

    def render(self) -> str:
        lines: list[str] = []
        lb = f"{{{self.labels}}}" if self.labels else ""
        for name, (help, value) in self.gauges.items():
            lines += [f"# HELP {name} {help}", f"# TYPE {name} gauge", f"{name}{lb} {value}"]
        for name, (help, value) in self.counters.items():
            lines += [f"# HELP {name} {help}", f"# TYPE {name} counter", f"{name}{self.counter_suffix}{lb} {value}"]
        sep = "," if self.labels else ""
        for name, (help, label, values) in self.labelled.items():
            lines += [f"# HELP {name} {help}", f"# TYPE {name} counter"]
            for v, c in values.items():
                lines.append(f'{name}{self.counter_suffix}{{{self.labels}{sep}{label}="{v}"}} {c}')
        for h in self.histograms.values():
            lines += h.render(self.labels)
        return "\n".join(lines) + "\n"
