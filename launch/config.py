"""A parallel configuration: how an engine splits one model over GPUs.

Shared by launchers (which turn it into argv), the simulated engine (which models its
cost) and sweeps (which enumerate it). ``gpus`` is what the configuration occupies.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench_llm.core.pairs import split_pairs


@dataclass(frozen=True, slots=True)
class Disagg:
    """Prefill/decode disaggregation: P prefill instances, D decode instances
    (each instance has the configuration's tp×pp×pcp GPUs; dcp lives inside the TP group)."""

    prefill: int
    decode: int

    @classmethod
    def parse(cls, text: str) -> "Disagg":
        p, sep, d = text.partition(":")
        try:
            if not sep:
                raise ValueError
            out = cls(int(p), int(d))
        except ValueError:
            raise ValueError(f"disaggregation {text!r}: expected P:D, e.g. 1:1") from None
        if out.prefill < 1 or out.decode < 1:
            raise ValueError(f"disaggregation {text!r}: both sides need at least one instance")
        return out

    def __str__(self) -> str:
        return f"{self.prefill}:{self.decode}"


#: What an existing deployment may be called (it names the cell's folder).
DEPLOYMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

#: The integer parallel axes, in the order names and cell ids list them.
AXES: tuple[str, ...] = ("tp", "pp", "dp", "ep", "dcp", "pcp")


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1  # expert-parallel width for MoE layers (1: off)
    dcp: int = 1  # decode context parallel, inside the TP group (dcp must divide tp)
    pcp: int = 1  # prefill context parallel, extra devices
    disagg: Disagg | None = None
    extra_args: tuple[str, ...] = ()
    #: An existing deployment bench did not start (``bench sweep --url NAME=URL@N``): its
    #: layout is the server's own, so the configuration is known by this name and by
    #: ``deployment_gpus``, the GPU count its user declared; the axes above stay 1.
    deployment: str | None = None
    deployment_gpus: int | None = None

    @classmethod
    def parse(cls, text: str, extra_args: Sequence[str] = ()) -> "ParallelConfig":
        """``"tp=2,dp=2,disagg=1:1"`` → ParallelConfig (empty text: one GPU, no parallelism).
        Raises ValueError with a one-line message that names no CLI flag."""
        values: dict[str, int | Disagg] = {}
        for _, name, value in split_pairs(text):
            key = name.lower()
            if value is None:
                raise ValueError("expected key=value pairs like tp=2,dp=2")
            if key in AXES:
                values[key] = int(value)
            elif key == "disagg":
                values[key] = Disagg.parse(value.strip())
            else:
                raise ValueError(f"unknown axis {key!r} (known: {', '.join(AXES)}, disagg)")
        return cls(**values, extra_args=tuple(extra_args))  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        for name in AXES:
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, not {v!r}")
        if self.tp % self.dcp:
            raise ValueError(f"dcp ({self.dcp}) must divide tp ({self.tp})")
        if self.deployment is not None:
            if not DEPLOYMENT_NAME.fullmatch(self.deployment):
                raise ValueError(f"deployment name {self.deployment!r}: use letters, digits, '.', '_' and '-'")
            if not isinstance(self.deployment_gpus, int) or self.deployment_gpus < 1:
                raise ValueError(f"deployment {self.deployment}: its GPU count must be a positive integer")

    @property
    def gpus_per_instance(self) -> int:
        return self.tp * self.pp * self.pcp

    @property
    def gpus(self) -> int:
        """GPUs the whole configuration occupies."""
        if self.deployment_gpus is not None:
            return self.deployment_gpus
        if self.disagg is not None:
            return self.gpus_per_instance * (self.disagg.prefill + self.disagg.decode) * self.dp
        return self.gpus_per_instance * self.dp

    @property
    def axes(self) -> int:
        """How many parallel axes are in use (for 'fewest axes' tie-breaking; 0 for a deployment)."""
        n = sum(1 for name in AXES if getattr(self, name) > 1)
        return n + (1 if self.disagg is not None else 0)

    @property
    def cell_id(self) -> str:
        """A short stable name, e.g. ``tp2-dp2`` or ``tp1`` or ``tp4-disagg1x1``; a deployment's name."""
        if self.deployment is not None:
            return self.deployment
        parts = [f"tp{self.tp}"]
        for name in ("pp", "dp", "ep", "dcp", "pcp"):
            v = getattr(self, name)
            if v > 1:
                parts.append(f"{name}{v}")
        if self.disagg is not None:
            parts.append(f"disagg{self.disagg.prefill}x{self.disagg.decode}")
        if self.extra_args:
            import hashlib

            parts.append("x" + hashlib.sha1(" ".join(self.extra_args).encode()).hexdigest()[:6])
        return "-".join(parts)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["disagg"] = str(self.disagg) if self.disagg is not None else None
        d["extra_args"] = list(self.extra_args)
        d["gpus"] = self.gpus
        d["cell_id"] = self.cell_id
        if self.deployment is None:  # a launched configuration's record is as it always was
            del d["deployment"], d["deployment_gpus"]
        return d
