"""Issue 33: every input bench reads has a bound (core/limits.py, docs/results.md "Input
bounds"); past it, one line naming the item, never unbounded memory."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench_llm.bench.cli import cli
from bench_llm.core import control
from bench_llm.core.limits import bounded_lines, read_bounded
from bench_llm.loadgen.scrape import MetricsScraper
from bench_llm.workloads import jsonl, readers
from bench_llm.workloads.errors import WorkloadError


def test_read_bounded_reads_no_more_than_the_bound() -> None:
    with pytest.raises(ValueError, match="/dev/zero: larger than 1 KiB"):
        read_bounded("/dev/zero", 1024)


def test_bounded_lines_names_the_first_long_line(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_bytes(b"a\n" + b"x" * 99 + b"\n" + b"y" * 101 + b"\nz\n")
    with open(f, "rb") as fh, pytest.raises(ValueError, match=r"t.jsonl:3: a line longer than 100 bytes"):
        list(bounded_lines(fh, 100, str(f)))


def test_extra_body_from_dev_zero_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["run", "--out", str(tmp_path / "r"), "--extra-body", "@/dev/zero"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: --extra-body /dev/zero: larger than 1 MiB, the bound on such a file " \
                                    "(docs/results.md, Input bounds)"  # fmt: skip
    assert not (tmp_path / "r").exists()


def test_a_workload_line_past_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 1024)  # the one line reader of workload files
    f = tmp_path / "w.jsonl"
    f.write_text('{"input_length": 5, "output_length": 4}\n{"input_length": 5, "prompt": "' + "x" * 2000 + '"}\n')
    with pytest.raises(WorkloadError, match=r"w.jsonl:2: a line longer than 1 KiB"):
        list(readers.jsonl_rows(f))


class _Metrics(http.server.BaseHTTPRequestHandler):
    served = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).served += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        line = b"# a hostile /metrics page, far past its bound\n"
        try:
            for _ in range((4 << 20) // len(line)):  # about 4 MB
                self.wfile.write(line)
        except OSError:
            pass  # the client stopped reading at the bound

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_metrics_page_past_its_bound_stops_the_scraping(
    metrics_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(control, "MAX_METRICS_BYTES", 64 << 10)
    _Metrics.served = 0
    scraper = MetricsScraper(metrics_server, tmp_path, interval_s=1.0)
    assert scraper.scrape_once() is False
    assert scraper.scrape_once() is False
    assert _Metrics.served == 1  # not asked again: one page past the bound ends the scraping
    info = scraper.describe()
    assert info["failures"] == 1 and "larger than 64 KiB" in (info["stopped"] or "")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("note: server metrics: /metrics: an answer larger than 64 KiB")
