"""How the CLI ends a verb: the exit codes of every verb (README, "Exit codes"), and one-line
input errors.

Library code raises ``core.errors.BenchError`` (click-free) or returns outcomes; only the CLI
(``bench/commands``, ``bench/cli.py``) turns them into an exit status, with these codes and
nowhere else.
"""

from __future__ import annotations

import enum
import os

import click

from bench_llm.core.errors import BenchError, SettingError
from bench_llm.core.redact import redact


class ExitCode(enum.IntEnum):
    """The exit status of ``bench run|sweep|recommend|gate|locust master`` (and every verb)."""

    #: Measured (most requests succeeded); a gate passed; a configuration meets the SLOs.
    OK = 0
    #: ``bench gate``: a real regression; ``bench trend``: a regression flagged in the history.
    #: Also Python's status for an unexpected crash.
    REGRESSION = 1
    #: Bad input: a flag, a file, a folder, an output path the system refuses (one ``error:``
    #: line naming it, no traceback).
    BAD_INPUT = 2
    #: Nothing or almost nothing succeeded: a run (or every load of a sweep) whose requests
    #: failed (see ``too_few_succeeded``); the summary names the most frequent errors.
    #: ``bench history``: such a run was refused, not stored.
    NO_DATA = 3
    #: The measurement worked but no configuration meets the SLOs at the target load.
    NO_CONFIGURATION = 4
    #: ``bench sweep`` / ``bench recommend``: the answer rests on loads the client could not
    #: measure truthfully (client saturated, anomalous records); the output is printed in full
    #: and marked UNTRUSTWORTHY (docs/sweeps.md, Confidence).
    UNTRUSTWORTHY = 5
    #: ``bench sweep`` / ``bench recommend``: a configuration failed (its engine did not start
    #: or died, or (nearly) every request to it failed: ``status = failed`` in cells.parquet,
    #: its top errors in ``reason``); the rest of the sweep is printed and judged as usual.
    CELL_FAILED = 6
    #: Interrupted (Ctrl-C, SIGTERM, or a run's folder could not be written: a full disk);
    #: what was measured is on disk.
    INTERRUPTED = 130


#: A run "measured" when at least this share of its counted (measured, not cancelled at the
#: end) requests succeeded; below it the run exits ``NO_DATA``.
MIN_OK_FRACTION = 0.1


def too_few_succeeded(ok: int, counted: int) -> bool:
    """True when a run's requests (``counted``: measured, not cancelled at the end) mostly
    failed: no success at all, or fewer than ``MIN_OK_FRACTION`` of them."""
    return ok == 0 or ok < MIN_OK_FRACTION * counted


class CliError(click.ClickException):
    """An input error as the CLI prints it: ``error: <message>``, exit code 2."""

    exit_code = ExitCode.BAD_INPUT

    def format_message(self) -> str:
        return self.message

    def show(self, file=None) -> None:  # type: ignore[no-untyped-def]
        click.echo(f"error: {redact(self.message)}", err=True)


def as_cli_error(exc: BenchError) -> CliError:
    """Any of bench's errors as the CLI prints it; a ``SettingError`` names the flags."""
    return CliError(setting_message(exc))


def os_error_message(exc: OSError) -> str:
    """An operating-system error as one line naming its path: ``out/run.parquet: No space left
    on device`` (a rename names its target; an Arrow I/O error, which carries no path, its own
    first line, which names the file)."""
    path = exc.filename2 if exc.filename2 is not None else exc.filename
    why = exc.strerror or (str(exc).splitlines() or [type(exc).__name__])[0]
    return f"{os.fsdecode(path)}: {why}" if path is not None else why


def flag(setting: str) -> str:
    """The command-line flag of a setting a library message names (``input_tokens`` ->
    ``--input-tokens``): the commands name their options after the settings."""
    return "--" + setting.replace("_", "-")


def setting_message(exc: BaseException) -> str:
    """An error's message as the CLI prints it: the settings a ``SettingError`` names become
    the flags that set them (``core.errors.SettingError``); any other error as it is."""
    return exc.render(flag) if isinstance(exc, SettingError) else str(exc)


class Outcome(click.ClickException):
    """Ends a verb with a non-zero ``code`` after its output was printed (``message`` is one
    line on stderr, or nothing)."""

    def __init__(self, code: ExitCode, message: str = "") -> None:
        super().__init__(message)
        self.exit_code = int(code)  # type: ignore[misc]  # click's class default, per instance here

    def show(self, file=None) -> None:  # type: ignore[no-untyped-def]
        if self.message:
            click.echo(redact(self.message), err=True)
