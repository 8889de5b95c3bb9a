"""The clock of each node of a cell's Slurm job, against the launching host's.

Engine-side times are stamped on the engine's node (an OTLP span's ``start_time_unix_nano``, a
log line's time), the client's on the launching host. To put them on one time line, each
node's wall clock is measured against this host's once the job runs, with bench's distributed
clock estimator (``bench.distributed.clock``): a job step on the node (``srun --overlap``, no
GPU) answers each line it reads with its ``time.time_ns()``; of ``SAMPLES`` exchanges over the
step's standard input and output, the one with the smallest round trip gives the offset (node
minus launching host, assuming a symmetric path) and its error bound (half that round trip).
The offsets go into ``engine_info.placement.nodes[].clock``; the node's own clock discipline
(NTP, PTP) is not known to bench, so drift during a cell is not accounted for.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence

from bench_llm.bench.distributed.clock import ClockSample, estimate_offset
from bench_llm.launch.placement import Node, NodeClock

SAMPLES = 16
#: Seconds the step may take to start and to answer each line.
STEP_START_S, REPLY_S = 20.0, 5.0
#: What the step runs on the node: the launching host's Python path, as the engines' steps
#: (docs/sweeps.md: the nodes need bench's software tree at the same path).
_ECHO = "import sys, time\nfor _ in sys.stdin:\n    sys.stdout.write(f'{time.time_ns()}\\n'); sys.stdout.flush()\n"


def clock_step_argv(job: str, node: str, python: str = sys.executable) -> list[str]:
    return ["srun", f"--jobid={job}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--gres=none",
            python, "-u", "-c", _ECHO]  # fmt: skip


def _reply(fd: int, buf: bytearray, timeout_s: float) -> int | None:
    """The next line the step writes, as an integer; None when it does not come in time."""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        buf.extend(chunk)
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    try:
        return int(line)
    except ValueError:
        return None


def measure_node_clock(job: str, node: str, samples: int = SAMPLES) -> NodeClock:
    """The node's wall clock against this host's: ``offset_ns`` (node minus here), ``bound_ns``
    (its error bound), ``samples``; or ``error`` when the step did not answer."""
    proc = subprocess.Popen(clock_step_argv(job, node), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, bufsize=0)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    fd, buf = proc.stdout.fileno(), bytearray()
    got: list[ClockSample] = []
    try:
        for i in range(samples + 1):  # the first exchange waits for the step to start: not a sample
            sent = time.time_ns()
            proc.stdin.write(b"t\n")
            there = _reply(fd, buf, STEP_START_S if i == 0 else REPLY_S)
            back = time.time_ns()
            if there is None:
                return NodeClock(node, len(got), error="the clock step did not answer")
            if i:
                got.append(ClockSample(sent, there, back))
    except OSError as exc:
        return NodeClock(node, len(got), error=f"the clock step: {exc}")
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    est = estimate_offset(got)
    return NodeClock(node, est.samples, est.offset_ns, est.rtt_ns // 2)


def measure_clocks(job: str, nodes: Sequence[Node]) -> dict[str, NodeClock]:
    """Each node's clock (``measure_node_clock``), by node name."""
    return {n.name: measure_node_clock(job, n.name) for n in nodes}
