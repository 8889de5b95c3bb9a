"""The embedded engine's HTTP server: vLLM, SGLang or TGI on the wire, paced in real time.

One engine loop (``sim.loop``) drives a backend (fixed timing or the performance model);
at each step boundary it hands every due token to its request's ``HttpStream``
(``sim.stream``), which formats the flavour's payload and writes it to the socket
synchronously, in the same pass, then records the token in the emission log. Request
handlers (``sim.routes``) only parse, submit (``sim.serving.SimServer``) and wait for the
end of their stream. This module assembles the app from the flavour's route table and runs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from bench_llm.sim.config import ServerConfig
from bench_llm.sim.routes import ROUTE_CLASSES, ROUTES
from bench_llm.sim.serving import SimServer

ENGINE_KEY: web.AppKey[SimServer] = web.AppKey("sim_engine")


def create_app(config: ServerConfig = ServerConfig()) -> web.Application:
    """The simulated engine as an aiohttp app (raises ``OutOfMemory`` for impossible configurations)."""
    srv = SimServer(config)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[ENGINE_KEY] = srv
    app.on_startup.append(srv.on_startup)
    app.on_shutdown.append(srv.on_shutdown)
    app.on_cleanup.append(srv.on_cleanup)
    owners = [cls(srv) for cls in ROUTE_CLASSES]
    add = {"GET": app.router.add_get, "POST": app.router.add_post}  # add_get answers HEAD too
    for method, path, handler in ROUTES[config.flavor]:
        owner = next(o for o in owners if vars(type(o)).get(handler.__name__) is handler)
        add[method](path, getattr(owner, handler.__name__))
    return app


@contextlib.asynccontextmanager
async def serve_in_process(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Run ``app`` on the current event loop; yields its base URL."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    await site.start()
    sock_port = runner.addresses[0][1]
    try:
        yield f"http://[{host}]:{sock_port}" if ":" in host else f"http://{host}:{sock_port}"
    finally:
        await runner.cleanup()
