"""The simulated engine spread over nodes, as a multi-node engine starts (``bench sim serve
--nnodes N --node-rank i --master-addr A --master-port P [--headless]``).

It does what a real multi-node launch depends on, so a launcher that gets the rendezvous
wrong fails here as it would with vLLM: rank 0 listens at ``A:P`` and serves HTTP only once
every other rank has joined; a headless rank connects to ``A:P`` (retrying until the
deadline), says who it is (node rank, host, ``CUDA_VISIBLE_DEVICES``), and stays up while
rank 0 does. A rank that goes away ends rank 0 (a real instance cannot serve without one of
its ranks), and rank 0's end ends the headless ranks. Every rank writes one line about itself
to stderr, and rank 0 one line per rank that joined.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any

#: How long rank 0 waits for the others, and a headless rank tries to reach rank 0.
JOIN_TIMEOUT_S = 120.0


def whoami(rank: int, nnodes: int, master: str | None, port: int | None) -> dict[str, Any]:
    return {
        "node_rank": rank,
        "nnodes": nnodes,
        "host": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "rendezvous": f"{master}:{port}" if master is not None else None,
    }


def say_who(rank: int, nnodes: int, master: str | None, port: int | None) -> dict[str, Any]:
    """Write the rank's line (``bench sim: rank {...}``) to stderr; return what it says."""
    me = whoami(rank, nnodes, master, port)
    _say("rank " + json.dumps(me, sort_keys=True))
    return me


def _say(text: str) -> None:
    sys.stderr.write(f"bench sim: {text}\n")
    sys.stderr.flush()


def serve_rendezvous(nnodes: int, master: str, port: int, timeout_s: float = JOIN_TIMEOUT_S) -> list[dict[str, Any]]:
    """Rank 0: wait until ranks 1..nnodes-1 have joined at ``master:port``; then watch them
    (a rank leaving ends this process). Returns what each rank said, in rank order."""
    say_who(0, nnodes, master, port)
    srv = socket.create_server((master, port), reuse_port=False)
    srv.settimeout(1.0)
    joined: dict[int, tuple[socket.socket, dict[str, Any]]] = {}
    deadline = time.monotonic() + timeout_s
    while len(joined) < nnodes - 1:
        if time.monotonic() > deadline:
            raise SystemExit(f"bench sim: only {len(joined)} of {nnodes - 1} ranks joined at {master}:{port}")
        try:
            conn, peer = srv.accept()
        except TimeoutError:
            continue
        conn.settimeout(10.0)
        line = conn.makefile("r").readline()
        try:
            hello = json.loads(line)
        except ValueError:
            conn.close()
            continue
        joined[int(hello["node_rank"])] = (conn, hello)
        _say(f"rank {hello['node_rank']} joined from {peer[0]}: " + json.dumps(hello, sort_keys=True))
    srv.close()
    for rank, (conn, _) in joined.items():
        threading.Thread(target=_watch, args=(conn, rank), daemon=True, name=f"rank{rank}").start()
    return [joined[r][1] for r in sorted(joined)]


def _watch(conn: socket.socket, rank: int) -> None:
    conn.settimeout(None)
    try:
        while conn.recv(1024):
            pass
    except OSError:
        pass
    _say(f"rank {rank} left: the instance cannot serve without it; exiting")
    os._exit(1)


def join_rendezvous(rank: int, nnodes: int, master: str, port: int, timeout_s: float = JOIN_TIMEOUT_S) -> None:
    """A headless rank: join rank 0 at ``master:port`` and stay until it ends (then exit 0)."""
    me = say_who(rank, nnodes, master, port)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = socket.create_connection((master, port), timeout=5.0)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise SystemExit(f"bench sim: rank {rank} could not reach rank 0 at {master}:{port}: {exc}") from None
            time.sleep(0.1)
    conn.sendall((json.dumps(me) + "\n").encode())
    _say(f"rank {rank} joined rank 0 at {master}:{port}; headless until it ends")
    conn.settimeout(None)
    try:
        while conn.recv(1024):
            pass
    except OSError:
        pass
    _say(f"rank {rank}: rank 0 ended; exiting")
