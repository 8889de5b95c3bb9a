"""How the CLI shows an input error: one line, no traceback, exit code 2.

Library code raises ``core.errors.BenchError`` (click-free); ``bench/cli.py`` alone turns
it into this click exception.
"""

from __future__ import annotations

import click

from core.errors import BenchError


class CliError(click.ClickException):
    """An input error as the CLI prints it: ``error: <message>``, exit code 2."""

    exit_code = 2

    def format_message(self) -> str:
        return self.message

    def show(self, file=None) -> None:  # type: ignore[no-untyped-def]
        click.echo(f"error: {self.message}", err=True)


def as_cli_error(exc: BenchError) -> CliError:
    return CliError(exc.message)
