"""Headless Chromium driven over the DevTools protocol (a small client on aiohttp websockets).

``load_page`` opens a URL in a fresh headless Chromium at a given viewport, collects console
errors, uncaught exceptions and log errors while the page loads, then evaluates a probe (a
JavaScript expression returning a JSON string) and, if asked, saves a PNG of the viewport.
Used by the report's browser test and ``benchmarks/report_screenshot.py``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

#: A laptop's first screen.
VIEWPORT = (1280, 800)


async def load_page(
    chromium: str, url: str, profile: Path, probe: str, settle_s: float = 1.5, timeout_s: float = 60.0,
    screenshot: Path | None = None, viewport: tuple[int, int] = VIEWPORT,
) -> tuple[list[str], dict[str, Any]]:
    """(errors seen while loading, the probe's value decoded from JSON)."""
    argv = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
        f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not open its DevTools port")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                    pages = [t for t in await r.json() if t.get("type") == "page"]
                if pages:
                    break
                await asyncio.sleep(0.1)
            ws_url = pages[0]["webSocketDebuggerUrl"]
            async with http.ws_connect(ws_url, max_msg_size=0) as ws:
                return await asyncio.wait_for(_drive(ws, url, settle_s, probe, screenshot, viewport), timeout_s)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


async def _drive(
    ws: aiohttp.ClientWebSocketResponse, url: str, settle_s: float, probe_js: str, screenshot: Path | None, viewport: tuple[int, int]
) -> tuple[list[str], dict[str, Any]]:
    errors: list[str] = []
    next_id = 0
    pending: dict[int, asyncio.Future[Any]] = {}
    loaded = asyncio.Event()

    async def reader() -> None:
        async for msg in ws:
            m = json.loads(msg.data)
            if "id" in m and m["id"] in pending:
                pending.pop(m["id"]).set_result(m)
            method = m.get("method")
            p = m.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                errors.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                errors.append("log: " + str(p["entry"].get("text")))
            elif method == "Page.loadEventFired":
                loaded.set()

    async def call(method: str, **params: Any) -> Any:
        nonlocal next_id
        next_id += 1
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        pending[next_id] = fut
        await ws.send_str(json.dumps({"id": next_id, "method": method, "params": params}))
        return await fut

    task = asyncio.create_task(reader())
    try:
        for domain in ("Runtime", "Log", "Page"):
            await call(f"{domain}.enable")
        width, height = viewport
        await call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        await call("Page.navigate", url=url)
        await loaded.wait()
        await asyncio.sleep(settle_s)
        res = await call("Runtime.evaluate", expression=probe_js, returnByValue=True)
        probe = json.loads(res["result"]["result"]["value"])
        if screenshot is not None:
            shot = await call("Page.captureScreenshot", format="png")
            screenshot.write_bytes(base64.b64decode(shot["result"]["data"]))
    finally:
        task.cancel()
    return errors, probe
