"""One load of a sweep run inside a Kubernetes cluster, and how its results come back.

bench, on the launching host, need not reach the cell's engine (its Service is a cluster
name) nor share a volume with the cluster. So each load is a ``batch/v1`` Job on a CPU node
(``bench.sweep.cluster_kube``) whose one container runs ``python3 -m
bench_llm.bench.sweep.cluster_job PAYLOAD``: PAYLOAD is the load as the sweep would run it
here (``loads.LoadJob``: the sweep's settings, the load, its warm-up, the run's metadata) as
JSON through its typed ``to_row``/``from_row``, compressed and base64-encoded, with the format
and bench's version, which the pod checks first. Nothing is unpickled: the argument is data,
read into typed values and checked as any settings file is, and bounded (``MAX_PAYLOAD_CHARS``
of argument, one argv string, ``MAX_PAYLOAD_JSON_BYTES`` of JSON once inflated); an argument
that is not such a load ends the pod with one line saying why (exit code ``EXIT_PAYLOAD``).
The pod empties the engine's prefix cache, runs the load against ``$ENGINE_URL`` with the code
a local sweep runs (``bench.sweep.loads.run_load``), and writes its run folder to standard
output as one frame: a ``begin`` line (format version, SHA-256, size, the load's measured
request count, whether it was interrupted), the folder as a gzip'd tar in base64 lines of 76
characters, and an ``end`` line. bench reads the frame back through the pod log API
(``read_frame``) and unpacks it into the load's run folder, where it reads every other load's.

The frame is bounded (``MAX_FRAME_BYTES`` of tar, so the encoded log stays under the kubelet's
default 10 MiB log rotation, beyond which the log API returns only the newest file): a larger
run folder fails the load with that reason rather than coming back truncated; the checksum
refuses a frame damaged on the way.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bench_llm.bench.sweep.loads import LoadJob
from bench_llm.core import __version__
from bench_llm.core.errors import BenchError

FRAME_VERSION = 1
BEGIN, END = "bench-run-folder-begin", "bench-run-folder-end"
#: Most bytes of gzip'd tar a frame carries (base64 makes it 4/3 larger: 8 MiB of log).
MAX_FRAME_BYTES = 6 * 1024 * 1024
LINE = 76
#: Format of a load Job's argument: ``{"format", "bench_version", "job": LoadJob.to_row()}``.
PAYLOAD_VERSION = 1
#: Most characters of the argument: it is one argv string, and Linux refuses one over 128 KiB
#: (MAX_ARG_STRLEN); a sweep's settings take a few KiB.
MAX_PAYLOAD_CHARS = 96 * 1024
#: Most bytes of JSON the argument may inflate to (so a small argument cannot inflate without end).
MAX_PAYLOAD_JSON_BYTES = 1024 * 1024
#: Exit codes of the pod (a Job's failure reason).
EXIT_PAYLOAD, EXIT_TOO_LARGE = 3, 4


class FrameError(BenchError):
    """A load Job's log holds no complete, intact run folder."""


class PayloadError(BenchError):
    """A load Job's argument is not a load this bench can run (or a load too large to be one)."""


@dataclass(frozen=True)
class Frame:
    """What a load Job sent back: its run folder (gzip'd tar) and the load's outcome."""

    folder: bytes
    expected: int
    interrupted: bool


def encode_payload(job: LoadJob) -> str:
    """The load Job's argument for ``job`` (PayloadError when it would be larger than one may be)."""
    try:
        data = json.dumps({"format": PAYLOAD_VERSION, "bench_version": __version__, "job": job.to_row()},
                          sort_keys=True, separators=(",", ":")).encode()  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"the load cannot be sent to its Job: {_one_line(exc)}") from None
    text = base64.b64encode(zlib.compress(data, 9)).decode()
    if len(data) > MAX_PAYLOAD_JSON_BYTES or len(text) > MAX_PAYLOAD_CHARS:
        raise PayloadError(f"the load is {len(data)} bytes of JSON, {len(text)} characters as the Job's argument; "
                           f"a load Job takes at most {MAX_PAYLOAD_JSON_BYTES} and {MAX_PAYLOAD_CHARS}")  # fmt: skip
    return text


def decode_payload(text: str) -> LoadJob:
    """The load a Job's argument holds; PayloadError, one line, for anything that is not a load
    from this bench (too large, not base64, not compressed JSON of this format and version, a
    value of the wrong kind). Never unpickles or evaluates anything."""
    not_ours = f"the load Job's argument is not a load from bench {__version__}"
    if len(text) > MAX_PAYLOAD_CHARS:
        raise PayloadError(f"{not_ours}: {len(text)} characters, more than {MAX_PAYLOAD_CHARS}")
    try:
        inflate = zlib.decompressobj()
        data = inflate.decompress(base64.b64decode(text, validate=True), MAX_PAYLOAD_JSON_BYTES + 1)
        if len(data) > MAX_PAYLOAD_JSON_BYTES:
            raise PayloadError(f"{not_ours}: it inflates past {MAX_PAYLOAD_JSON_BYTES} bytes")
        if not inflate.eof:
            raise PayloadError(f"{not_ours}: its compressed data is cut short")
        obj = json.loads(data)
    except PayloadError:
        raise
    except (ValueError, zlib.error, binascii.Error, RecursionError) as exc:
        raise PayloadError(f"{not_ours} ({type(exc).__name__})") from None
    if not isinstance(obj, dict) or obj.get("format") != PAYLOAD_VERSION or not isinstance(obj.get("job"), dict):
        raise PayloadError(f"{not_ours}: not a load job of format {PAYLOAD_VERSION}")
    if obj.get("bench_version") != __version__:
        raise PayloadError(f"the load Job's image has bench {__version__}; the sweep is bench "
                           f"{_one_line(obj.get('bench_version'))[:40]}: use an image with the same version (--client-image)")  # fmt: skip
    try:
        return LoadJob.from_row(obj["job"])
    except BenchError as exc:
        raise PayloadError(f"{not_ours}: {_one_line(exc)[:500]}") from None
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        raise PayloadError(f"{not_ours} ({type(exc).__name__})") from None


def _one_line(value: object) -> str:
    return " ".join(str(value).split())


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


def run_in_pod(job: LoadJob, url: str, work: Path) -> Frame:
    """The pod's side: reset the prefix cache, run the load, pack its folder."""
    from bench_llm.bench.sweep.engines import reset_prefix_cache
    from bench_llm.bench.sweep.loads import run_load
    from bench_llm.launch.launcher import client_round_trip

    spec, meta = job.spec, job.extra
    info = dict(meta.engine_info or {})
    probe = client_round_trip(url, spec.engine, "kubernetes-job", node=os.environ.get("NODE_NAME"))
    info["client"] = {**(info.get("client") or {}), **probe.as_json()}
    extra = replace(meta, prefix_cache=reset_prefix_cache(spec.engine, url), engine_info=info)
    run_dir = work / "run"
    measured = run_load(
        spec=spec, load=job.load, run_dir=run_dir, url=url, served_model=job.served_model, extra=extra,
        warmup=job.warmup, progress=False, engine_version=job.engine_version,
    )  # fmt: skip
    expected = measured.figures.requests + measured.missing_rows
    return Frame(pack_folder(run_dir), expected, measured.interrupted)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if len(args) != 1:
            raise PayloadError(f"a load Job takes one argument, its load; it was given {len(args)}")
        job = decode_payload(args[0])
    except PayloadError as exc:
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
