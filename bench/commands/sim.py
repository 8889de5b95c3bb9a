"""``bench sim serve``: the embedded simulated engine as a process."""

from __future__ import annotations

import click

from sim.server import ServerConfig, create_app
from sim.timing import FixedTiming


@click.group("sim")
def command() -> None:
    """The embedded simulated engine."""


@command.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless told otherwise).")
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--model", default="sim-model", show_default=True, help="Served model name.")
@click.option("--ttft-ms", default=50.0, show_default=True, type=float, help="Fixed time to first token.")
@click.option("--itl-ms", default=10.0, show_default=True, type=float, help="Fixed inter-token latency.")
@click.option("--tokens-per-chunk", default=1, show_default=True, type=int, help="Tokens sent in each stream chunk.")
def serve(host: str, port: int, model: str, ttft_ms: float, itl_ms: float, tokens_per_chunk: int) -> None:
    """Serve the simulated engine (vLLM-flavoured OpenAI API) until interrupted."""
    from aiohttp import web

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    cfg = ServerConfig(model=model, timing=FixedTiming(ttft_ms / 1000, itl_ms / 1000, tokens_per_chunk))
    web.run_app(create_app(cfg), host=host, port=port, access_log=None, print=lambda *_: None, backlog=4096)
