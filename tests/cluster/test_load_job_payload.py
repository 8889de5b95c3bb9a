"""A Kubernetes load Job's argument (bench/sweep/cluster_job.py): the load as JSON through the
typed ``LoadJob.to_row``/``from_row``, bounded, and refused in one line when it is anything else
(never unpickled). No cluster: the pod's entry point is called as the container would call it."""

from __future__ import annotations

import base64
import json
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from bench_llm.bench.sweep import cluster_job
from bench_llm.bench.sweep.cluster_job import (
    EXIT_PAYLOAD,
    MAX_PAYLOAD_CHARS,
    PAYLOAD_VERSION,
    PayloadError,
    decode_payload,
    encode_payload,
)
from bench_llm.bench.sweep.loads import Load, LoadJob
from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec, WorkloadSpec
from bench_llm.core import __version__
from bench_llm.launch.placement import ClusterSpec
from bench_llm.results.sweep_rows import LoadRef, RunMeta
from tests.conftest import REPO


def _job(engine_args: tuple[str, ...] = ("--enforce-eager",)) -> LoadJob:
    w = WorkloadSpec(input_tokens=64, output_tokens=8, seed=3, label="short")
    spec = SweepSpec(
        model="llama-3.1-8b", engine="sim", gpu="h100", matrix=MatrixSpec(tp=(1, 2), flags={"max-num-seqs": (8, 16)}),
        loads=LoadSpec(rates=(4.0,), requests=8, warmup=0), workloads=(w,), slo={"ttft_ms": 500.0},
        engine_args=engine_args, ready_timeout_s=60.0,
        cluster=ClusterSpec(manager="kubernetes", gpus_per_node=4, namespace="bench", image="engine-img",
                            client_image="bench-img"),
    )  # fmt: skip
    meta = RunMeta("abc123", {"tp": 2, "cell_id": "tp2"}, LoadRef("rate", 4.0, "rate-4"), "short", 0, True, "probe",
                   engine_info={"placement": {"manager": "kubernetes"}, "client": {"where": "kubernetes-job"}})  # fmt: skip
    return LoadJob(spec, Load("rate", 4.0, w, role="probe", requests=8, seq=2), "llama", meta, 0, "0.6.0")


def _argument(obj: object) -> str:
    return base64.b64encode(zlib.compress(json.dumps(obj).encode())).decode()


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cluster_job.main(argv) == EXIT_PAYLOAD
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()


def test_a_load_job_goes_through_its_argument_unchanged_and_small() -> None:
    job = _job()
    text = encode_payload(job)
    assert decode_payload(text) == job  # the spec, the load, its workload and the run's metadata, typed
    assert len(text) < 4096  # a sweep's settings: a few KiB of the 96 KiB an argument may take
    assert json.loads(zlib.decompress(base64.b64decode(text)))["format"] == PAYLOAD_VERSION


def test_hostile_arguments_end_the_pod_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert "not a load from bench" in _refused(["bm90IGEgbG9hZA=="], capsys)  # base64 of "not a load"
    assert "not a load from bench" in _refused(["%%% not base64 %%%"], capsys)
    assert "one argument" in _refused([], capsys)
    assert "more than 98304" in _refused(["A" * (MAX_PAYLOAD_CHARS + 1)], capsys)
    # a small argument that would inflate to 64 MiB of JSON: refused at the bound, not inflated
    bomb = base64.b64encode(zlib.compress(b" " * (64 << 20), 9)).decode()
    assert len(bomb) < MAX_PAYLOAD_CHARS and "inflates past 1048576 bytes" in _refused([bomb], capsys)
    assert "cut short" in _refused([encode_payload(_job())[:-40]], capsys)
    # JSON of the right shape but values of the wrong kind: named, in one line
    row = _job().to_row()
    bad = {"format": PAYLOAD_VERSION, "bench_version": __version__, "job": {**row, "warmup": "many"}}
    assert "warmup an integer" in _refused([_argument(bad)], capsys)
    spec = {**row["spec"], "repeats": "twice\nand\nmore"}
    said = _refused([_argument({"format": PAYLOAD_VERSION, "bench_version": __version__, "job": {**row, "spec": spec}})],
                    capsys)  # fmt: skip
    assert "repeats" in said and "expected an integer" in said
    nested = {"format": PAYLOAD_VERSION, "bench_version": __version__, "job": {**row, "load": {"kind": [[[]]]}}}
    assert "load.kind" in _refused([_argument(nested)], capsys)
    assert "format 1" in _refused([_argument({"format": 0, "job": {}})], capsys)
    assert "format 1" in _refused([_argument([1, 2, 3])], capsys)


def test_another_version_of_bench_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    other = {"format": PAYLOAD_VERSION, "bench_version": "0.0.1", "job": _job().to_row()}
    said = _refused([_argument(other)], capsys)
    assert f"the load Job's image has bench {__version__}; the sweep is bench 0.0.1" in said


class _Trap:
    """Unpickling it would create a file: the pod must never get that far."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (str(self.path),))  # type: ignore[return-value]


def test_a_pickled_argument_is_refused_without_being_unpickled(tmp_path: Path) -> None:
    """The earlier format (a pickle) from a hostile writer of the Job: refused as data, in a
    subprocess as the container runs it."""
    trap = tmp_path / "unpickled"
    text = base64.b64encode(zlib.compress(pickle.dumps((__version__, {"spec": _Trap(trap)})))).decode()
    run = subprocess.run([sys.executable, "-m", "bench_llm.bench.sweep.cluster_job", text], cwd=REPO,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == EXIT_PAYLOAD and not trap.exists()
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("error: the load Job's argument is not a load")
    assert run.stdout == ""


def test_a_load_too_large_for_a_job_is_refused_before_the_job_is_made() -> None:
    import random

    rng = random.Random(0)  # incompressible: 200 KiB of random engine arguments
    noise = tuple("".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(1000)) for _ in range(200))
    with pytest.raises(PayloadError, match="a load Job takes at most"):
        encode_payload(_job(engine_args=noise))
