"""The error base every layer raises for bad input; free of click.

Library code raises ``BenchError`` (or a ``ValueError`` subclass) with a one-line
message; only the CLI (``bench/cli.py``) turns it into ``error: <message>`` and exit
code 2. A message names the setting at fault in words a TOML sweep and a command line
share, not a CLI flag.
"""

from __future__ import annotations


class BenchError(Exception):
    """An error caused by input; the message is one line, shown without a traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
