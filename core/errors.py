"""The error base every layer raises for bad input; free of click.

Library code raises ``BenchError`` (or a ``ValueError`` subclass) with a one-line
message; only the CLI (``bench/cli.py``) turns it into ``error: <message>`` and exit
code 2. A message names the setting at fault in words a TOML sweep and a command line
share, not a CLI flag.
"""

from __future__ import annotations

import re
from collections.abc import Callable


class BenchError(Exception):
    """An error caused by input; the message is one line, shown without a traceback."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


_SETTING = re.compile(r"\$([a-z][a-z0-9_]*)")


class SettingError(ValueError):
    """A bad value of a named setting, for library code a TOML file and a command line both call.

    The message template names each setting as ``$name`` (its config key: ``$input_tokens``,
    ``$rate``): ``str()`` shows the key (``input_tokens``), and the CLI, which knows its flags,
    shows the flag instead (``bench.errors.setting_message``: ``--input-tokens``). A message
    without ``$`` names is shown as it is.
    """

    def __init__(self, template: str) -> None:
        self.template = template
        super().__init__(self.render())

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings the message names, in order."""
        return tuple(dict.fromkeys(_SETTING.findall(self.template)))

    def render(self, name: Callable[[str], str] = str) -> str:
        """The message with each ``$setting`` written as ``name(setting)``."""
        return _SETTING.sub(lambda m: name(m[1]), self.template)
