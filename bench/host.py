"""A fingerprint of the client machine, recorded with every run."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any


def host_fingerprint() -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
    }
    try:
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import uvloop  # noqa: F401

        info["uvloop"] = True
    except ImportError:
        info["uvloop"] = False
    return info
