"""``bench sweep --dry-run``: every cell's processes as they would start, starting nothing.

The output is plain text meant to be diffed between two sweep definitions: cells in the
order the sweep runs them, ports numbered from 8000, environment names sorted, values of
secret-looking variables masked.
"""

from __future__ import annotations

import shlex

from bench_llm.bench.sweep.cell import cell_engine
from bench_llm.bench.sweep.engines import DefaultLauncher
from bench_llm.bench.sweep.matrix import expand
from bench_llm.bench.sweep.spec import SweepSpec, WorkloadSpec
from bench_llm.core.redact import secret_name
from bench_llm.launch.process import EngineStartError


def dry_run_lines(spec: SweepSpec, launcher: DefaultLauncher | None = None) -> list[str]:
    """The dry-run text, one line per element (on a cluster: ``bench.sweep.cluster``'s)."""
    if spec.cluster is not None:
        from bench_llm.bench.sweep.cluster import dry_run_lines as on_cluster

        return on_cluster(spec)
    launcher = launcher or DefaultLauncher(spec.engine_version)
    planned = expand(spec, launcher.unsupported)
    skipped = sum(1 for c in planned if c.skip_reason)
    lines = [
        f"# bench sweep --dry-run: engine {spec.engine}, model {spec.model}, {len(planned)} cells"
        f" ({len(planned) - skipped} to run, {skipped} skipped); nothing was started"
    ]
    workloads = spec.cell_workloads
    if len(workloads) > 1:  # workload axes (or several workloads): loads inside each cell, no launch of their own
        lines.append(f"# {len(workloads)} workloads, each measured in every cell (no launch of its own): "
                     + "; ".join(f"{w.tag} ({_values(w)})" for w in workloads))  # fmt: skip
    urls = {e.name: e.url for e in spec.endpoints}
    for c in planned:
        head = f"cell {c.cell_id}: {c.config.gpus} GPU{'s' if c.config.gpus != 1 else ''}"
        if c.skip_reason:
            lines.append(f"{head}, skipped: {c.skip_reason}")
            continue
        if c.config.deployment is not None:
            engine = spec.for_cell(c.config).engine
            named = f"{engine} " if engine != spec.engine else ""
            lines.append(f"{head}, running {named}deployment at {urls[c.config.deployment]} (bench starts nothing)")
            continue
        try:
            procs = launcher.plan(cell_engine(spec, c.config, dry_run=True))
        except EngineStartError as exc:
            lines.append(f"{head}, skipped: {exc}")
            continue
        lines.append(head)
        for p in procs:
            env = " ".join(f"{k}={_shown(k, v)}" for k, v in p.env) or "-"
            lines.append(f"  {p.role}: gpus {p.devices or '-'}; env {env}")
            lines.append(f"    {shlex.join(p.argv)}")
    return lines


def _values(w: WorkloadSpec) -> str:
    lengths = f"input {w.input_tokens}, output {w.output_tokens} tokens"
    return f"workload {w.name}" if w.name else lengths


def _shown(name: str, value: str) -> str:
    return "***" if secret_name(name) else value
