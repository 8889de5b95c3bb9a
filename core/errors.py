"""bench's one exception tree; free of click.

Every error bench raises on purpose derives from ``BenchError``, so a caller (and the CLI, in one
place: ``bench/cli.py``) needs one ``except``. The message is one line; the CLI prints it as
``error: <message>`` and exits 2 (bad input). A message names the setting at fault in words a
TOML sweep and a command line share, not a CLI flag.

The tree (each class lives beside the code that raises it; where a class also derives from a
built-in exception, existing ``except ValueError`` callers keep working)::

    BenchError                          core/errors.py
    ├── SettingError (ValueError)       a bad value of a named setting ($name -> --flag in the CLI)
    │   ├── WorkloadError               workloads/errors.py: a workload file, trace or spec
    │   ├── UnsupportedRequest          adapters/sampling.py: a request kind an engine cannot take
    │   └── FaultSpecError              sim/faults.py: a simulated-engine fault specification
    ├── ConfigError (ValueError)        core/config.py: a TOML file; names the file and dotted key
    ├── ControlError (ValueError)       core/control.py: an engine's control route answered nonsense
    ├── SLOError (ValueError)           analysis/slo.py: an SLO specification
    ├── NotComparable (ValueError)      analysis/history.py: a run unlike the stored ones it is judged against
    ├── ResultsError                    results/reader.py: a folder or file that is not a readable run
    ├── SweepSpecError (ValueError)     bench/sweep/spec.py: a sweep that cannot run
    ├── PartRejected (ValueError)       bench/distributed/assemble.py: a worker's part of a run
    ├── EngineStartError (RuntimeError) launch/process.py: an engine died or never became ready
    │   └── UnsupportedConfigError      launch/launcher.py: refused before anything started
    ├── StreamError                     loadgen/transport.py: a stream failed (recorded, typed)
    ├── WireError (ValueError)          loadgen/otlp.py: a malformed OTLP payload
    ├── StreamPayloadError              adapters/openai.py: a payload the protocol forbids
    ├── OutOfMemory (ValueError)        sim/costmodel.py: weights do not fit the GPUs
    └── Unsupported (ValueError)        sim/structured.py: a constraint the simulator cannot answer

Errors inside a run (a stream reset, a malformed chunk) are recorded as the request's
``error_type`` (a code) and never end the run; only the ones that stop a command reach the CLI.
Policies branch on the class or a code attribute, never on a message's wording.
"""

from __future__ import annotations

import re
from collections.abc import Callable


class BenchError(Exception):
    """The root of bench's errors; the message is one line, shown without a traceback."""

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(message, *args)
        self.message = str(message)


_SETTING = re.compile(r"\$([a-z][a-z0-9_]*)")


class SettingError(BenchError, ValueError):
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
