"""Each engine's own multi-node argv: one instance as rank 0 (serving HTTP) plus headless ranks.

The flags, for the versions docs/engines.md targets:
- vLLM 0.32 (``vllm serve --help=all``, tests/launch/data/vllm_0.32.0_serve_flags.txt): one
  instance's TP×PP over N nodes is ``--nnodes N --node-rank i --master-addr A --master-port P``,
  ``--headless`` on i > 0; DP ranks spread over nodes are ``--data-parallel-size-local L
  --data-parallel-start-rank i·L --data-parallel-address A --data-parallel-rpc-port P``, with
  ``--headless`` on i > 0 (with ``--enable-expert-parallel`` the experts span every DP rank).
- SGLang (``python/sglang/srt/server_args.py``; the ``parallel`` fields from 0.5.2x):
  ``--nnodes N --node-rank i --dist-init-addr A:P``; ranks i > 0 serve no HTTP.
- the simulated engine takes vLLM's TP×PP flags (``bench sim serve``: rank 0 waits for the
  others at the rendezvous address before it serves, ``sim/rendezvous.py``).
- TGI has no multi-node launch.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench_llm.core.errors import BenchError


class PlacementError(BenchError, ValueError):
    """The plan cannot be placed on the cluster as described (the message says why)."""


def _value(argv: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _set(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag value`` (replacing the flag's value where it is already given)."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == flag and i + 1 < len(argv):
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return [*out, flag, value]


def vllm_ranks(argv: list[str], ranks: int, rank: int, master: str, port: int, gpus_per_rank: int) -> list[str]:
    dp = int(_value(argv, "--data-parallel-size") or 1)
    if dp > 1:
        per_dp = gpus_per_rank * ranks // dp
        if per_dp == 0 or gpus_per_rank % per_dp or dp % ranks:
            raise PlacementError(
                f"vLLM: {dp} DP ranks of {max(per_dp, 1)} GPUs do not divide evenly over {ranks} nodes of "
                f"{gpus_per_rank} GPUs (a DP rank must fit on one node)"
            )
        local = gpus_per_rank // per_dp
        for flag, value in (("--data-parallel-size-local", local), ("--data-parallel-start-rank", rank * local),
                            ("--data-parallel-address", master), ("--data-parallel-rpc-port", port)):  # fmt: skip
            argv = _set(argv, flag, str(value))
    else:
        argv = [*argv, "--nnodes", str(ranks), "--node-rank", str(rank), "--master-addr", master,
                "--master-port", str(port)]  # fmt: skip
    return [*argv, "--headless"] if rank > 0 else argv


def sglang_ranks(argv: list[str], ranks: int, rank: int, master: str, port: int, gpus_per_rank: int) -> list[str]:
    return [*argv, "--nnodes", str(ranks), "--node-rank", str(rank), "--dist-init-addr", f"{master}:{port}"]


def sim_ranks(argv: list[str], ranks: int, rank: int, master: str, port: int, gpus_per_rank: int) -> list[str]:
    argv = [*argv, "--nnodes", str(ranks), "--node-rank", str(rank), "--master-addr", master, "--master-port", str(port)]
    return [*argv, "--headless"] if rank > 0 else argv


_RANKS = {"vllm": vllm_ranks, "sglang": sglang_ranks, "sim": sim_ranks}


def multinode_ranks(engine: str, argv: Sequence[str], ranks: int, rank: int, master: str, port: int,
                    gpus_per_rank: int) -> list[str]:  # fmt: skip
    """Rank ``rank`` of ``ranks`` of the instance whose one-host argv is ``argv``; ``master``
    and ``port``: the rendezvous (rank 0's node). Raises PlacementError."""
    fn = _RANKS.get(engine)
    if fn is None:
        raise PlacementError(f"{engine} has no multi-node launch: give it a configuration that fits on one node")
    return fn(list(argv), ranks, rank, master, port, gpus_per_rank)
