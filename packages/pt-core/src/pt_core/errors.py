"""The errors pt reports as one ``error:`` line (and a ``fix:`` line), never a traceback.

Two branches, told apart by their exit codes: :class:`PtError` and its input branch
(:class:`ConfigError`, :class:`InputError`: exit 2) are what a user can fix in what they
gave; :class:`RunFailure` (exit 3, :class:`DiskFull` 74) is what a run met while running
(a worker that cannot start, training that cannot go on, a write that fails).
Ctrl-C is :class:`Interrupted` (130). Anything else reaching a CLI is a bug in pt: one
``error: internal error`` line, exit 70 (sysexits' EX_SOFTWARE), and the traceback only
with ``PT_TRACEBACK=1``."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


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


def first_line(exc: BaseException) -> str:
    """The first line of a library's exception message (its name when it has none): what
    a one-line error quotes of it."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class ConfigError(PtError):
    """A config file or override that does not fit the schema."""


class InputError(PtError):
    """A data file that cannot be read: malformed line, missing column, wrong kind."""


class RunFailure(PtError):
    """What a run met while running, not a fault in its input: the message names the
    cause; exit code 3."""

    exit_code = 3


class Interrupted(PtError):
    """Ctrl-C (SIGINT): the message says what was kept and how to go on; exit code 130, the
    shell's code for an interrupted command."""

    exit_code = 130


class DiskFull(RunFailure):
    """A write failed for want of space (ENOSPC, or a quota: EDQUOT). The message names the
    path and says what was kept; exit code 74 (sysexits' EX_IOERR), apart from input errors."""

    exit_code = 74

    def __init__(self, path: str | os.PathLike, *, kept: str | None = None):
        message = f"{path}: no space left on the device"
        super().__init__(
            message if kept is None else f"{message}; {kept}",
            hint="free some space there (or write to another disk) and run the same command again",
        )


# Below this much free space, a write that failed without an errno failed for want of room.
_NEARLY_FULL_BYTES = 1 << 20


def is_disk_full(exc: BaseException, path: str | os.PathLike) -> bool:
    """Whether ``exc``, raised while writing under ``path``, means the disk (or the quota) is
    full: an OSError with ENOSPC/EDQUOT in ``exc`` or what caused it, a library's message
    that says so, or a failed torch.save (its writer drops the errno) on a file system with
    less than 1 MiB left."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(seen)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return "inline_container" in str(exc) and _free_bytes(path) < _NEARLY_FULL_BYTES


def _free_bytes(path: str | os.PathLike) -> int:
    existing = Path(path).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return shutil.disk_usage(existing).free


@contextlib.contextmanager
def disk_full_as_error(path: str | os.PathLike, *, kept: str | None = None) -> Iterator[None]:
    """Turn a write under ``path`` that fails for want of space into :class:`DiskFull`
    naming ``path`` (and what was ``kept``); any other error passes through."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as exc:
        if not is_disk_full(exc, path):
            raise
        raise DiskFull(path, kept=kept) from exc
