"""User-facing errors: one line, no traceback."""

from __future__ import annotations

import click


#: Exit status of ``bench sweep`` / ``bench recommend`` when the answer rests on loads the
#: client could not measure truthfully (client saturated, anomalous records): the output is
#: printed in full, and marked UNTRUSTWORTHY (docs/sweeps.md, Confidence).
EXIT_UNTRUSTWORTHY = 4


class BenchError(click.ClickException):
    """An error caused by input; printed as ``error: <message>``, exit code 2."""

    exit_code = 2

    def format_message(self) -> str:
        return self.message

    def show(self, file=None) -> None:  # type: ignore[no-untyped-def]
        click.echo(f"error: {self.message}", err=True)
