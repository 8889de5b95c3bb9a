"""benchmarks/client_floor.c, the C floor client of benchmarks/client_floor.py, still builds
and runs a closed loop: it counts the tokens of chunked SSE responses and re-sends on each
response's last chunk, including when that chunk is split across reads."""

from __future__ import annotations

import json
import shutil
import socket
import socketserver
import subprocess
import threading
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "benchmarks" / "client_floor.c"
TOKENS = 20


class _Handler(socketserver.BaseRequestHandler):
    """Answers each request with TOKENS chunked SSE events, one send each, and ends the
    response with its last chunk split in two sends (the client must still see it)."""

    def handle(self) -> None:
        try:
            self._serve(self.request)
        except (ConnectionResetError, BrokenPipeError):
            pass  # the client's run ended mid-response: how every run of it ends

    def _serve(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = sock.recv(65536)
                if not data:
                    return
                buf += data
            head, _, rest = buf.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(rest) < length:
                data = sock.recv(65536)
                if not data:
                    return
                rest += data
            buf = rest[length:]
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(TOKENS):
                event = b'data: {"choices":[{"text":" t%d"}]}\n\n' % i
                sock.sendall(b"%x\r\n%s\r\n" % (len(event), event))
            sock.sendall(b"0\r\n")
            sock.sendall(b"\r\n")


@pytest.fixture()
def server():
    socketserver.ThreadingTCPServer.allow_reuse_address = True
    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_c_floor_client_counts_tokens_and_closes_the_loop(server: int, tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler on PATH (benchmarks/client_floor.py skips its c row then, too)")
    exe = tmp_path / "client_floor"
    subprocess.run([cc, "-O2", "-o", str(exe), str(SOURCE)], check=True, timeout=60)
    out = subprocess.run([str(exe), str(server), "4", str(TOKENS), "m", "0.1", "0.6"], capture_output=True,
                         text=True, timeout=30, check=True)
    r = json.loads(out.stdout)
    assert r["mode"] == "c" and r["streams"] == 4
    # the loop closed: many responses per stream, each re-sent from the read that ended it
    assert r["responses"] >= 8
    assert r["send_per_token"] == pytest.approx(1 / TOKENS, rel=0.2)
    assert r["tok_s"] > 0 and r["recv_per_token"] > 0
