"""The one exception type a user can cause, and how the CLIs report it."""

from __future__ import annotations


class PtError(Exception):
    """An error in the user's input: a config key, a file, a column, a flag.

    The message names where the problem is (file, line, key) and how to fix it.
    The CLIs print it without a traceback and exit with ``exit_code``.
    """

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  fix: {hint}")


class ConfigError(PtError):
    """A config file or override that does not fit the schema."""


class InputError(PtError):
    """A data file that cannot be read: malformed line, missing column, wrong kind."""
