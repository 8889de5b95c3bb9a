"""The bad inputs and hostile servers of issue 33, each run through the installed ``bench``:
prints one row per case (exit code, first line bench printed, and what was checked).

    python benchmarks/data_safety_cases.py                 # this checkout's bench
    python benchmarks/data_safety_cases.py --bench "bench"  # another bench on PATH (before/after)

Each case runs in a fresh temporary folder on 127.0.0.1 with the embedded engine or a small
hostile server started here. Read-only and full-disk cases need a private mount namespace
(``unshare -m``, as root); where that is not permitted they say so. About 1-2 min of CPU.
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

SECRET = "pa55w0rd-h33"
SMALL_RUN = ["--requests", "8", "--concurrency", "4", "--input-tokens", "16", "--output-tokens", "4",
             "--no-progress", "--sim-ttft-ms", "1", "--sim-itl-ms", "1"]
URL_RUN = ["--model", "m", "--requests", "4", "--concurrency", "2", "--input-tokens", "4", "--output-tokens", "4",
           "--no-progress"]


# -- a hostile server ------------------------------------------------------------------------
_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(text: str, finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    obj: dict[str, object] = {"id": "c", "object": "text_completion",
                              "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class Server:
    """Answers /v1/completions in the way ``mode`` names; /metrics is 404 unless ``metrics_mb``."""

    def __init__(self, mode: str, metrics_mb: int = 0) -> None:
        self.mode, self.metrics_mb = mode, metrics_mb
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._answer(conn)
        except OSError:
            pass

    def _answer(self, conn: socket.socket) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return
            buf += data
        path = buf.split(b"\r\n", 1)[0].split(b" ")[1]
        if path.startswith(b"/metrics") and self.metrics_mb:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
            block = b"# padding line of a hostile /metrics page\n" * 25000  # ~1 MB
            for _ in range(self.metrics_mb):
                conn.sendall(block)
            return
        if not path.startswith(b"/v1/completions"):
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        mode = self.mode
        if mode == "redirect":
            conn.sendall(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:%d/v1/completions\r\n"
                         b"Content-Length: 0\r\nConnection: close\r\n\r\n" % REDIRECT_TARGET.port)
            return
        conn.sendall(_SSE_HEAD)
        if mode == "comments":
            end = time.monotonic() + 40
            while time.monotonic() < end:
                conn.sendall(_chunk(b": keep-alive\n\n"))
                time.sleep(1.0)
            return
        if mode == "backwards":
            for n in (1, 2, 3, 8, 2, 2, 2, 2):
                conn.sendall(_chunk(_event("x", usage={"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n})))
            conn.sendall(_chunk(_event("", "length", {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8})))
        else:
            for _ in range(4):
                conn.sendall(_chunk(_event("x")))
            conn.sendall(_chunk(_event("", "length")))
        conn.sendall(_chunk(b"data: [DONE]\n\n"))
        if mode == "after_done":
            for _ in range(4):
                conn.sendall(_chunk(_event("y")))
        conn.sendall(b"0\r\n\r\n")


REDIRECT_TARGET: Server


# -- running bench ---------------------------------------------------------------------------
class Bench:
    def __init__(self, argv: list[str]) -> None:
        self.argv = argv

    def __call__(self, args: list[str], cwd: Path, timeout: float = 120, wrap: list[str] | None = None,
                 limit_as: int | None = None) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of one bench command."""
        def limit() -> None:
            if limit_as:
                resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

        try:
            p = subprocess.run([*(wrap or []), *self.argv, *args], cwd=cwd, capture_output=True, text=True,
                               timeout=timeout, preexec_fn=limit)
        except subprocess.TimeoutExpired as exc:
            return -1, str(exc.stdout or ""), f"(killed after {timeout:g} s)"
        return p.returncode, p.stdout, p.stderr

    def start(self, args: list[str], cwd: Path) -> subprocess.Popen[str]:
        return subprocess.Popen([*self.argv, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def first_line(out: str, err: str) -> str:
    """The line a user sees first: an ``error:`` line, else the traceback's last line, else the first."""
    lines = [ln for ln in (err + "\n" + out).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith("error:"):
            return ln
    if any(ln.startswith("Traceback") for ln in lines):
        return "Traceback ... " + next(ln for ln in reversed(err.splitlines()) if ln.strip())
    return lines[0] if lines else ""


def can_mount() -> bool:
    if not shutil.which("unshare"):
        return False
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs $d && umount $d && rmdir $d"],
                       capture_output=True)  # fmt: skip
    return p.returncode == 0


def in_mount(folder: Path, options: str, fill: str = "") -> list[str]:
    """A wrapper argv: run the command with ``folder`` a fresh tmpfs mounted with ``options``."""
    script = f"mount -t tmpfs -o {options} tmpfs {shlex.quote(str(folder))} && {fill} exec \"$@\""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"]


# -- the cases -------------------------------------------------------------------------------
Case = Callable[[Bench, Path], tuple[int, str, str]]
CASES: list[tuple[str, Case]] = []


def case(name: str) -> Callable[[Case], Case]:
    def add(fn: Case) -> Case:
        CASES.append((name, fn))
        return fn
    return add


def _user_files(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "notes.txt").write_text("mine")
    (d / "docs").mkdir()
    (d / "docs" / "thesis.txt").write_text("years of work")


def _kept(d: Path) -> str:
    kept = (d / "notes.txt").exists() and (d / "docs" / "thesis.txt").exists()
    return "user files kept" if kept else "USER FILES DELETED"


@case("--overwrite on a folder of user files")
def overwrite_user(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    _user_files(tmp / "d")
    rc, out, err = bench(["run", "--out", "d", "--overwrite", *SMALL_RUN], tmp)
    return rc, first_line(out, err), _kept(tmp / "d")


@case("--out . --overwrite")
def overwrite_dot(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    _user_files(tmp / "cwd")
    rc, out, err = bench(["run", "--out", ".", "--overwrite", *SMALL_RUN], tmp / "cwd")
    return rc, first_line(out, err), _kept(tmp / "cwd")


@case("--out '' --overwrite")
def overwrite_empty(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    _user_files(tmp / "cwd")
    rc, out, err = bench(["run", "--out", "", "--overwrite", *SMALL_RUN], tmp / "cwd")
    return rc, first_line(out, err), _kept(tmp / "cwd")


@case("--out ''")
def out_empty(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    (tmp / "cwd").mkdir()
    rc, out, err = bench(["run", "--out", "", *SMALL_RUN], tmp / "cwd")
    wrote = (tmp / "cwd" / "run.parquet").exists()
    return rc, first_line(out, err), "run written into the current folder" if wrote else "nothing written"


@case("--overwrite on a previous run")
def overwrite_run(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    bench(["run", "--out", "r", *SMALL_RUN], tmp)
    rc, out, err = bench(["run", "--out", "r", "--overwrite", *SMALL_RUN], tmp)
    return rc, first_line(out, err), "replaced" if (tmp / "r" / "run.parquet").exists() else "no run"


@case("two runs into one --out at once")
def two_writers(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    args = ["run", "--out", "same", "--requests", "60", "--concurrency", "2", "--input-tokens", "16",
            "--output-tokens", "16", "--no-progress", "--sim-ttft-ms", "20", "--sim-itl-ms", "10"]
    a = bench.start(args, tmp)
    deadline = time.monotonic() + 60
    while not (tmp / "same").is_dir() and time.monotonic() < deadline and a.poll() is None:
        time.sleep(0.05)
    rc, out, err = bench(args, tmp)
    a_out, a_err = a.communicate(timeout=120)
    rows = "?"
    try:
        import pyarrow.dataset as ds

        rows = str(ds.dataset(str(tmp / "same" / "requests")).count_rows())
    except Exception:  # noqa: BLE001 - a figure for the table only
        pass
    return rc, first_line(out, err), f"first writer exit {a.returncode}; requests rows {rows} (60 per run)"


def _files_with_secret(root: Path) -> list[str]:
    import pyarrow.parquet as pq

    found = []
    for p in root.rglob("*"):
        if not p.is_file():
            continue
        if p.suffix == ".parquet":
            text = json.dumps(pq.read_table(p).to_pylist(), default=str)
        else:
            text = p.read_bytes().decode("utf-8", "replace")
        if SECRET in text:
            found.append(str(p.relative_to(root)))
    return found


@case("a password in --url")
def secret_url(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    server = Server("ok")
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    rc, out, err = bench(["run", "--url", f"http://alice:{SECRET}@127.0.0.1:{server.port}", "--out", "a", *URL_RUN], tmp)
    rc2, out2, err2 = bench(["run", "--url", f"http://alice:{SECRET}@127.0.0.1:{dead_port}", "--out", "b", *URL_RUN], tmp)
    files = _files_with_secret(tmp)
    printed = SECRET in out + err + out2 + err2
    line = first_line(out2, err2)
    return rc2, line, (f"secret in {len(files)} file(s) ({', '.join(files[:2])})" if files else "secret in no file") + (
        "; printed" if printed else "; not printed")


@case("aiohttp transport and a 307 to another port")
def redirect(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    global REDIRECT_TARGET
    REDIRECT_TARGET = Server("ok")
    server = Server("redirect")
    rc, out, err = bench(["run", "--url", f"http://127.0.0.1:{server.port}", "--out", "r", "--transport", "aiohttp",
                          "--no-scrape", *URL_RUN], tmp)
    summary = next((ln for ln in out.splitlines() if ln.startswith("requests:")), "")
    return rc, first_line(out, err), summary[:90]


def _tokens(run: Path) -> str:
    import pyarrow.dataset as ds

    t = ds.dataset(str(run / "requests")).to_table(columns=["chunk_tokens", "output_tokens"])
    return f"chunk_tokens {t.column('chunk_tokens').to_pylist()[0]}"


@case("usage counts that go backwards")
def backwards(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    server = Server("backwards")
    rc, out, err = bench(["run", "--url", f"http://127.0.0.1:{server.port}", "--out", "r", "--no-scrape", *URL_RUN], tmp)
    anomalies = next((ln.strip() for ln in out.splitlines() if "anomal" in ln), "no anomaly shown")
    return rc, first_line(out, err), f"{_tokens(tmp / 'r')}; {anomalies[:60]}"


@case("events after [DONE]")
def after_done(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    server = Server("after_done")
    rc, out, err = bench(["run", "--url", f"http://127.0.0.1:{server.port}", "--out", "r", "--no-scrape", *URL_RUN], tmp)
    anomalies = next((ln.strip() for ln in out.splitlines() if "anomal" in ln), "no anomaly shown")
    return rc, first_line(out, err), f"{_tokens(tmp / 'r')}; {anomalies[:60]}"


@case("a 100 MB /metrics body")
def big_metrics(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    server = Server("ok", metrics_mb=100)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    rc, out, err = bench(["run", "--url", f"http://127.0.0.1:{server.port}", "--out", "r", *URL_RUN], tmp,
                         timeout=300)  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    note = next((ln for ln in (err + out).splitlines() if "metrics" in ln.lower() and ("larger" in ln or "bound" in ln)), "")
    return rc, first_line(out, err), f"peak RSS {max(peak, before) / 1024:.0f} MB" + (f"; {note[:60]}" if note else "")


@case("--extra-body @/dev/zero (1.5 GB address-space limit)")
def extra_body_zero(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    rc, out, err = bench(["run", "--out", "r", "--extra-body", "@/dev/zero", *SMALL_RUN], tmp, limit_as=3 << 29)
    return rc, first_line(out, err), ""


@case("SSE head, then only comments, --stall-timeout 5")
def comments_only(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    server = Server("comments")
    t0 = time.monotonic()
    rc, out, err = bench(["run", "--url", f"http://127.0.0.1:{server.port}", "--out", "r", "--stall-timeout", "5",
                          "--no-scrape", *URL_RUN], tmp)
    return rc, first_line(out, err), f"ended after {time.monotonic() - t0:.0f} s"


def _ro(bench: Bench, tmp: Path, args: list[str], folder: Path) -> tuple[int, str, str]:
    if not can_mount():
        return 0, "(skipped: no private mount namespace here)", ""
    folder.mkdir(parents=True, exist_ok=True)
    rc, out, err = bench(args, tmp, wrap=in_mount(folder, "ro,size=1m"))
    return rc, first_line(out, err), ""


def _a_run(bench: Bench, tmp: Path) -> Path:
    if not (tmp / "base").exists():
        bench(["run", "--out", "base", *SMALL_RUN], tmp)
    return tmp / "base"


@case("read-only output: run")
def ro_run(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    return _ro(bench, tmp, ["run", "--out", "ro/r", *SMALL_RUN], tmp / "ro")


@case("read-only output: sweep")
def ro_sweep(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    return _ro(bench, tmp, ["sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--tp", "1", "--rate", "1",
                            "--requests", "4", "--out", "ro/s"], tmp / "ro")


@case("read-only output: report -o")
def ro_report(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    _a_run(bench, tmp)
    return _ro(bench, tmp, ["report", "base", "-o", "ro/report.html"], tmp / "ro")


@case("read-only output: history --store")
def ro_history(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    _a_run(bench, tmp)
    return _ro(bench, tmp, ["history", "base", "--store", "ro/store", "--commit", "abc"], tmp / "ro")


@case("read-only output: trend --html")
def ro_trend(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    _a_run(bench, tmp)
    bench(["history", "base", "--store", "store", "--commit", "abc"], tmp)
    return _ro(bench, tmp, ["trend", "store", "--html", "ro/trend.html"], tmp / "ro")


@case("disk full during a run")
def disk_full(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    if not can_mount():
        return 0, "(skipped: no private mount namespace here)", ""
    disk = tmp / "disk"
    disk.mkdir()
    args = ["run", "--out", str(disk / "r"), "--requests", "400", "--concurrency", "8", "--input-tokens", "16",
            "--output-tokens", "64", "--no-progress", "--sim-ttft-ms", "1", "--sim-itl-ms", "2", "--save-text"]
    # the run's folder is copied out of the namespace before its tmpfs goes away
    script = f'mount -t tmpfs -o size=256k tmpfs {disk} && "$@"; rc=$?; cp -r {disk}/r {tmp}/kept 2>/dev/null; exit $rc'
    rc, out, err = bench(args, tmp, wrap=["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh"])
    note = "nothing kept"
    try:
        import pyarrow.dataset as ds
        import pyarrow.parquet as pq

        meta = pq.read_table(tmp / "kept" / "run.parquet").to_pylist()[0]
        rows = ds.dataset(str(tmp / "kept" / "requests")).count_rows() if (tmp / "kept" / "requests").is_dir() else 0
        note = f"{rows} rows readable; status {meta['status']}"
    except Exception as exc:  # noqa: BLE001
        note = f"kept files unreadable ({type(exc).__name__})"
    return rc, first_line(out, err), note


@case("sweep --out <an existing file>")
def sweep_out_file(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    (tmp / "f").write_text("x")
    rc, out, err = bench(["sweep", "--engine", "sim", "--model", "llama-3.1-8b", "--tp", "1", "--rate", "1",
                          "--requests", "4", "--out", "f"], tmp)
    return rc, first_line(out, err), ""


@case("report RUN -o <an existing folder>")
def report_into_folder(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    _a_run(bench, tmp)
    (tmp / "folder").mkdir()
    rc, out, err = bench(["report", "base", "-o", "folder"], tmp)
    left = [p.name for p in tmp.iterdir() if p.name.startswith(".") or "tmp" in p.name]
    return rc, first_line(out, err), f"temporary files left: {left}" if left else "no temporary file left"


@case("a truncated Parquet file in a run folder")
def truncated(bench: Bench, tmp: Path) -> tuple[int, str, str]:
    run = _a_run(bench, tmp)
    part = sorted((run / "requests").glob("*.parquet"))[0]
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])
    rc, out, err = bench(["summary", "base"], tmp)
    line = first_line(out, err)
    return rc, line, "names the file" if part.name in line else "names no file"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=None, help="bench command (default: this interpreter's bench)")
    ap.add_argument("--only", default="", help="substring of the case names to run")
    args = ap.parse_args()
    argv = shlex.split(args.bench) if args.bench else [sys.executable, "-m", "bench_llm.bench"]
    bench = Bench(argv)
    print(f"{'case':48} {'exit':>4}  first line  [checked]")
    for name, fn in CASES:
        if args.only and args.only not in name:
            continue
        tmp = Path(tempfile.mkdtemp(prefix="h33-"))
        try:
            rc, line, note = fn(bench, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"{name:48} {rc:>4}  {line[:110]}" + (f"  [{note}]" if note else ""), flush=True)


if __name__ == "__main__":
    main()
