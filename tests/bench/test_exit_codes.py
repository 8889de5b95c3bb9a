"""Exit codes and one-line causes a script or CI can rely on (README, "Exit codes")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench_llm.bench.errors import ExitCode
from tests.conftest import REPO, bench_argv, run_cli
from tests.hostile_server import hostile


def _bench(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(bench_argv(*args), capture_output=True, text=True, timeout=timeout, cwd=cwd)


def _one_error_line(p: subprocess.CompletedProcess[str]) -> str:
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in p.stderr, p.stderr
    return lines[0]


def test_a_run_whose_requests_all_fail_exits_3_and_names_the_cause(tmp_path: Path) -> None:
    with hostile("notfound") as server:
        p = _bench("run", "--url", server.url, "--model", "my-model", "--concurrency", "2", "--requests", "6",
                   "--out", str(tmp_path / "r"), "--no-progress", "--slo", "ttft_ms=100")
    assert p.returncode == ExitCode.NO_DATA == 3
    assert "most frequent errors: 6 x http_error: HTTP 404:" in p.stdout and "does not exist" in p.stdout
    assert "nan" not in p.stdout.replace("nan", " nan ").split(), p.stdout
    line = _one_error_line(p)
    assert line.startswith("error: 0 of 6 measured requests succeeded") and "does not exist" in line
    s = json.loads(_bench("summary", str(tmp_path / "r"), "--json").stdout)
    assert s["requests"]["top_errors"][0]["count"] == 6


@pytest.mark.parametrize(
    "url,hint",
    [("127.0.0.1:8000", "e.g. http://127.0.0.1:8000"), ("http://127.0.0.1:8000/v1", "give the server's root (http://127.0.0.1:8000)")],
)
def test_url_hints(tmp_path: Path, url: str, hint: str) -> None:
    p = run_cli("run", "--url", url, "--out", str(tmp_path / "r"))
    assert p.returncode == ExitCode.BAD_INPUT and hint in _one_error_line(p)
    assert not (tmp_path / "r").exists()


def test_absurd_sizes_are_refused_in_one_line(tmp_path: Path) -> None:
    p = run_cli("run", "--input-tokens", "10000000", "--requests", "2", "--out", str(tmp_path / "r"))
    assert p.returncode == ExitCode.BAD_INPUT and "--input-tokens 10,000,000: more than a request can hold" in _one_error_line(p)
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"input_tokens": 10, "output_tokens": 5}\n{"input_tokens": 99999999999, "output_tokens": 5}\n')
    p = run_cli("workload", "show", str(trace))
    assert p.returncode == ExitCode.BAD_INPUT and f"{trace}:2: field 'input_tokens'" in _one_error_line(p)


def test_a_trace_that_is_not_utf8_names_file_and_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_bytes(b"input_tokens,output_tokens\n10,5\n12,6\n\xff\xfe,7\n")
    p = _bench("workload", "show", str(trace), timeout=30)
    assert p.returncode == ExitCode.BAD_INPUT and f"{trace}:4: not UTF-8 text" in _one_error_line(p)


def test_workload_show_writes_only_where_asked(tmp_path: Path) -> None:
    p = _bench("workload", "show", "chat", "--requests", "50", cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    assert list(tmp_path.iterdir()) == []
    p = _bench("workload", "show", "chat", "--requests", "50", "--html", str(tmp_path / "no" / "w.html"), timeout=60)
    assert p.returncode == ExitCode.BAD_INPUT and "does not exist" in _one_error_line(p)
    assert not (tmp_path / "no").exists()
    p = _bench("workload", "show", "chat", "--requests", "50", "--html", str(tmp_path / "w.html"), timeout=60)
    assert p.returncode == 0 and (tmp_path / "w.html").stat().st_size > 0


def test_sim_serve_on_a_busy_port_is_one_line() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        p = _bench("sim", "serve", "--port", str(s.getsockname()[1]), timeout=60)
    assert p.returncode == ExitCode.BAD_INPUT and "choose another --port" in _one_error_line(p)


def test_locust_master_without_locust_is_one_line(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['locust'] = None; from bench_llm.bench.cli import main; "
        f"sys.argv = ['bench', 'locust', 'master', '--workers', '1', '--url', 'http://127.0.0.1:9', '--out', {str(tmp_path / 'r')!r}]; main()"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == ExitCode.BAD_INPUT and "needs locust" in _one_error_line(p)


@pytest.mark.parametrize("engine", ["sglang", "tgi"])
def test_the_embedded_engine_speaks_the_flavour_of_engine_whatever_the_cwd(tmp_path: Path, engine: str) -> None:
    """Started from a folder holding its own `bench` package (which `python -m bench` from
    that folder would import), with --engine sglang|tgi and no --url; --save-text keeps the
    answers of requests outside sessions."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "__init__.py").write_text("")
    argv = [sys.executable, "-P", "-m", "bench_llm.bench", "run", "--engine", engine, "--concurrency", "2", "--requests", "4",
            "--input-tokens", "8", "--output-tokens", "4", "--sim-ttft-ms", "2", "--sim-itl-ms", "1",
            "--out", "r", "--no-progress", "--json", "--save-text"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["requests"]["ok"] == 4
    from bench_llm.results.reader import read_requests

    texts = read_requests(tmp_path / "r").column("output_text").to_pylist()
    assert len(texts) == 4 and all(texts), texts


def _sweep_with(tmp: Path, ok: int) -> Path:
    from tests.analysis.test_recommend import _point, _sweep

    # every request met the SLO: 50 of 50 clears 90 % at 95 % confidence (Wilson), 0.95 would not
    pts = [{**_point("tp1", r, 1.0 if ok else 0.0), "ok": ok, "failed": 50 - ok} for r in (1.0, 2.0)]
    return _sweep(tmp, pts)


def test_recommend_exit_codes(tmp_path: Path) -> None:
    sweep = _sweep_with(tmp_path / "s", ok=50)  # in this process: the exit codes are click's, as in `bench`
    p = run_cli("recommend", str(sweep), "--slo", "ttft_ms=500", "--target-rate", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    p = run_cli("recommend", str(sweep), "--slo", "ttft_ms=500", "--target-rate", "50")
    assert p.returncode == ExitCode.NO_CONFIGURATION == 4 and "RECOMMENDATION: none" in p.stdout
    assert p.stderr.startswith("no configuration meets the SLOs")
    failed = _sweep_with(tmp_path / "f", ok=0)
    p = run_cli("recommend", str(failed), "--slo", "ttft_ms=500")
    assert p.returncode == ExitCode.NO_DATA and "0 of 100 requests of the sweep succeeded" in _one_error_line(p)


def _slow_run(out: Path, drain: str) -> subprocess.Popen[str]:
    """Closed loop on the embedded engine at 0.5 s per token: no request can end before
    --duration 1 does."""
    return subprocess.Popen(
        bench_argv("run", "--concurrency", "3", "--requests", "50", "--output-tokens", "200", "--sim-itl-ms", "500",
                   "--duration", "1", "--drain-timeout", drain, "--out", str(out), "--no-progress"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_the_drain_after_duration_is_bounded_and_ctrl_c_there_is_clean(tmp_path: Path) -> None:
    import signal
    import time

    from bench_llm.analysis.load import load_run

    t0 = time.monotonic()
    p = _slow_run(tmp_path / "a", "1")
    out, err = p.communicate(timeout=120)
    assert p.returncode == ExitCode.NO_DATA, err
    assert "no request completed: 3 still running were cancelled at the end" in err
    assert load_run(tmp_path / "a").meta["status"] == "complete" and time.monotonic() - t0 < 60

    p = _slow_run(tmp_path / "b", "60")
    deadline = time.monotonic() + 60
    # the monitor's first part file is written 2 s into the run: past --duration 1, draining
    while time.monotonic() < deadline and not list((tmp_path / "b").glob("client_monitor/*")):
        time.sleep(0.1)
    time.sleep(0.5)
    t1 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == ExitCode.INTERRUPTED and time.monotonic() - t1 < 30
    assert "Traceback" not in err and "never retrieved" not in err, err
    run = load_run(tmp_path / "b")
    assert run.meta["status"] == "interrupted"
    assert set(run.requests.column("error_type").to_pylist()) == {"cancelled"}


def test_top_errors_count_messages_that_differ_only_in_numbers() -> None:
    from bench_llm.analysis.failures import error_line, top_errors

    types = ["http_error"] * 3 + ["timeout", None]
    messages = [
        "HTTP 400: maximum context length is 4096 tokens, you requested 5000",
        "HTTP 400: maximum context length is 4096 tokens, you requested 6100",
        "HTTP 404: The model `m` does not exist.",
        "no data for 120 s",
        None,
    ]
    top = top_errors(types, messages)
    assert top[0] == {"error_type": "http_error", "count": 2,
                      "message": "HTTP 400: maximum context length is 4096 tokens, you requested 5000"}
    assert [e["count"] for e in top] == [2, 1, 1] and len(top) == 3
    assert error_line(top[:1]) == "2 x http_error: HTTP 400: maximum context length is 4096 tokens, you requested 5000"


def test_a_sweep_load_names_its_most_frequent_error(tmp_path: Path) -> None:
    import dataclasses

    from bench_llm.analysis.capacity_points import point_metrics
    from bench_llm.analysis.load import load_run
    from bench_llm.analysis.slo import SLO
    from tests.helpers_records import record, write_run

    recs = [record(f"r{i}", i * 100.0, [(i * 100.0 + 50, 1), (i * 100.0 + 60, 1)]) for i in range(4)]
    recs += [dataclasses.replace(record(f"f{i}", 500.0 + i, [], ok=False, error_type="http_error", end_ms=600.0 + i),
                                 error_message=f"HTTP 400: {4096 + i} tokens is too long") for i in range(3)]
    recs.append(record("gone", 900.0, [], ok=False, error_type="cancelled", end_ms=5000.0))
    m = point_metrics(load_run(write_run(tmp_path / "r", recs, {"workload_json": '{"rate": 10.0}'})), SLO.parse("ttft_ms=200"))
    assert m.top_error == "3 x http_error: HTTP 400: 4096 tokens is too long"
