"""One load of a sweep run inside a Kubernetes cluster, and how its results come back.

bench, on the launching host, need not reach the cell's engine (its Service is a cluster
name) nor share a volume with the cluster. So each load is a ``batch/v1`` Job on a CPU node
(``bench.sweep.cluster_kube``) whose one container runs ``python3 -m
bench_llm.bench.sweep.cluster_job PAYLOAD``: PAYLOAD is the load as the sweep would run it
here (the sweep's settings, the load, its warm-up, the run's metadata), pickled, compressed and
base64-encoded by bench itself (the pod trusts its own arguments, as it trusts its command;
bench's version is checked first, as the pickled settings are bench's own classes). The pod
empties the engine's prefix cache, runs the load against ``$ENGINE_URL`` with the code a local
sweep runs (``bench.sweep.loads.run_load``), and writes its run folder to standard output as
one frame: a ``begin`` line (format version, SHA-256, size, the load's measured request count,
whether it was interrupted), the folder as a gzip'd tar in base64 lines of 76 characters, and
an ``end`` line. bench reads the frame back through the pod log API (``read_frame``) and
unpacks it into the load's run folder, where it reads every other load's.

The frame is bounded (``MAX_FRAME_BYTES`` of tar, so the encoded log stays under the kubelet's
default 10 MiB log rotation, beyond which the log API returns only the newest file): a larger
run folder fails the load with that reason rather than coming back truncated; the checksum
refuses a frame damaged on the way.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import pickle
import sys
import tarfile
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench_llm.core import __version__
from bench_llm.core.errors import BenchError
from bench_llm.results.sweep_rows import RunMeta

FRAME_VERSION = 1
BEGIN, END = "bench-run-folder-begin", "bench-run-folder-end"
#: Most bytes of gzip'd tar a frame carries (base64 makes it 4/3 larger: 8 MiB of log).
MAX_FRAME_BYTES = 6 * 1024 * 1024
LINE = 76
#: Exit codes of the pod (a Job's failure reason).
EXIT_PAYLOAD, EXIT_TOO_LARGE = 3, 4


class FrameError(BenchError):
    """A load Job's log holds no complete, intact run folder."""


@dataclass(frozen=True)
class Frame:
    """What a load Job sent back: its run folder (gzip'd tar) and the load's outcome."""

    folder: bytes
    expected: int
    interrupted: bool


def encode_payload(job: dict[str, Any]) -> str:
    """``run_load``'s keyword arguments (all but the run folder, URL and clients) for the pod."""
    return base64.b64encode(zlib.compress(pickle.dumps((__version__, job)), 9)).decode()


def decode_payload(text: str) -> dict[str, Any]:
    try:
        version, job = pickle.loads(zlib.decompress(base64.b64decode(text)))  # noqa: S301 (bench's own argument)
    except Exception as exc:  # noqa: BLE001  # whatever the text is, the answer is one line
        raise BenchError(f"the load Job's argument is not a load from bench {__version__} ({type(exc).__name__})") from None
    if version != __version__:
        raise BenchError(f"the load Job's image has bench {__version__}; the sweep is bench {version}: "
                         "use an image with the same version (--client-image)")  # fmt: skip
    return dict(job)


def pack_folder(run_dir: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(run_dir.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(run_dir)), recursive=False)
    return buf.getvalue()


def frame_lines(frame: Frame) -> list[str]:
    """The frame as log lines."""
    if len(frame.folder) > MAX_FRAME_BYTES:
        raise FrameError(f"the run folder is {len(frame.folder)} bytes packed, more than the log frame's "
                         f"{MAX_FRAME_BYTES}: measure fewer requests per load")  # fmt: skip
    text = base64.b64encode(frame.folder).decode()
    digest = hashlib.sha256(frame.folder).hexdigest()
    head = (f"{BEGIN} v{FRAME_VERSION} sha256={digest} bytes={len(frame.folder)} expected={frame.expected} "
            f"interrupted={int(frame.interrupted)}")  # fmt: skip
    return [head, *(text[i:i + LINE] for i in range(0, len(text), LINE)), END]


def read_frame(log: str) -> Frame:
    """The last complete frame in a pod's log (other lines, the load's own output, ignored)."""
    lines = log.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith(BEGIN + " ")]
    if not starts:
        raise FrameError("the load Job's log holds no run folder")
    head = dict(f.split("=", 1) for f in lines[starts[-1]].split()[2:])
    if lines[starts[-1]].split()[1] != f"v{FRAME_VERSION}":
        raise FrameError(f"the load Job wrote a frame of format {lines[starts[-1]].split()[1]}, not v{FRAME_VERSION}")
    body = []
    for ln in lines[starts[-1] + 1:]:
        if ln == END:
            break
        body.append(ln.strip())
    else:
        raise FrameError("the load Job's run folder is cut short (no end line)")
    folder = base64.b64decode("".join(body))
    if len(folder) != int(head["bytes"]) or hashlib.sha256(folder).hexdigest() != head["sha256"]:
        raise FrameError("the load Job's run folder came back damaged (size or SHA-256 differs)")
    return Frame(folder, int(head["expected"]), head["interrupted"] == "1")


def unpack_folder(folder: bytes, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(folder), mode="r:gz") as tar:
        tar.extractall(run_dir, filter="data")  # names stay inside run_dir


def run_in_pod(job: dict[str, Any], url: str, work: Path) -> Frame:
    """The pod's side: reset the prefix cache, run the load, pack its folder."""
    from bench_llm.bench.sweep.engines import reset_prefix_cache
    from bench_llm.bench.sweep.loads import run_load
    from bench_llm.launch.launcher import client_round_trip

    spec = job["spec"]
    meta: RunMeta = job["extra"]
    info = dict(meta.engine_info or {})
    probe = client_round_trip(url, spec.engine, "kubernetes-job", node=os.environ.get("NODE_NAME"))
    info["client"] = {**(info.get("client") or {}), **probe.as_json()}
    extra = replace(meta, prefix_cache=reset_prefix_cache(spec.engine, url), engine_info=info)
    run_dir = work / "run"
    measured = run_load(
        spec=spec, load=job["load"], run_dir=run_dir, url=url, served_model=job["served_model"], extra=extra,
        warmup=job["warmup"], progress=False, engine_version=job["engine_version"],
    )  # fmt: skip
    expected = measured.figures.requests + measured.missing_rows
    interrupted = measured.interrupted
    return Frame(pack_folder(run_dir), expected, interrupted)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        job = decode_payload(args[0])
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_PAYLOAD
    with tempfile.TemporaryDirectory(prefix="bench-load-") as work:
        frame = run_in_pod(job, os.environ["ENGINE_URL"], Path(work))
    try:
        lines = frame_lines(frame)
    except FrameError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_TOO_LARGE
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
