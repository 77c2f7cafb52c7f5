"""Error types raised for bad user input.

Every error that a user can cause (a bad name, a bad config key, a malformed trace) is a
subclass of :class:`MxsimError`; the CLI prints its message on one line and exits non-zero.
Programming errors inside mxsim stay ordinary exceptions and keep their tracebacks.
"""

from __future__ import annotations

from collections.abc import Iterable


class MxsimError(Exception):
    """Base class of every user-facing error."""


class UnknownNameError(MxsimError, KeyError):
    """A name (format, profile, option value) that mxsim does not know."""

    def __init__(self, kind: str, name: object, accepted: Iterable[str]):
        self.kind = kind
        self.name = name
        self.accepted = sorted(accepted)
        super().__init__(f"unknown {kind} {name!r}; accepted: {', '.join(self.accepted)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class ConfigError(MxsimError, ValueError):
    """A hardware-config problem, located by file and key path (``array.rows``)."""

    def __init__(self, source: str, key_path: str, message: str):
        if len(key_path) > 120:  # key paths come from the file: never echo a long one whole
            key_path = key_path[:117] + "..."
        self.source = source
        self.key_path = key_path
        where = f"{source}: {key_path}" if key_path else source
        super().__init__(f"{where}: {message}")


class TraceError(MxsimError, ValueError):
    """A trace problem, located by trace directory, layer and field."""


class CaptureWarning(UserWarning):
    """A trace capture ran ops it could not record as layers (listed in the trace's ``source.skipped``)."""


class ArgumentError(MxsimError, ValueError):
    """A bad argument to a public function or CLI option: names the argument and what is accepted."""


class InputFileError(MxsimError, ValueError):
    """A file mxsim was asked to read is unreadable, not UTF-8, malformed, or too deep or large."""


class BudgetError(MxsimError, ValueError):
    """Work or memory beyond the budget (``MXSIM_MAX_BYTES``, see docs/limits.md) was asked for."""


class IncompleteResultError(MxsimError):
    """Work failed after other parts of it had finished: ``partial`` holds what was computed
    (e.g. a replay report of the layers that succeeded), so that no finished work is lost."""

    def __init__(self, message: str, partial):
        super().__init__(message)
        self.partial = partial
