"""Logging and progress on stderr, so stdout stays free for the one manifest line."""

from __future__ import annotations

import logging
import sys
from typing import TypeVar

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)
T = TypeVar("T")

_state = {"quiet": False, "rank": 0}


class _FirstRankOnly(logging.Filter):
    """In a job of several ranks, what every rank would say alike is said once: records
    from ranks other than 0 pass only when logged with ``extra={"all_ranks": True}``
    (what is particular to a rank), prefixed with the rank."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _state["rank"] == 0:
            return True
        if not getattr(record, "all_ranks", False):
            return False
        record.msg = f"[rank {_state['rank']}] {record.msg}"
        return True


def set_rank(rank: int) -> None:
    """This process is rank ``rank`` of a job: from now on the ``pt`` loggers speak on
    rank 0 only (see :class:`_FirstRankOnly`)."""
    _state["rank"] = int(rank)


def current_rank() -> int:
    return _state["rank"]


class _Stderr:
    """The stderr of the moment (a test or a fork may replace ``sys.stderr``)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def setup_logging(*, quiet: bool = False, verbose: bool = False) -> None:
    """Route every ``pt_*`` logger to stderr through rich; --quiet also hides progress bars."""
    _state["quiet"] = quiet
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    root = logging.getLogger("pt")
    root.handlers.clear()
    handler: logging.Handler
    if console.is_terminal:
        handler = RichHandler(console=console, show_path=verbose, show_time=False, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        # a log file (SLURM's, a pipe): one line per record, not wrapped at 80 columns and
        # padded, so a message stays whole under srun's "N: " labels and for grep
        handler = logging.StreamHandler(_Stderr())
        handler.setFormatter(logging.Formatter("%(levelname)-8s %(message)s"))
    handler.addFilter(_FirstRankOnly())
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def get_logger(name: str) -> logging.Logger:
    """A logger under the ``pt`` hierarchy (``pt_data.build`` -> ``pt.data.build``)."""
    return logging.getLogger("pt." + name.removeprefix("pt_").replace("_", "."))


def progress(*extra_columns, transient: bool = False, disable: bool = False) -> Progress:
    """A rich progress bar on stderr, disabled under --quiet or by ``disable`` (work that is
    a part of a step another bar shows). Where stderr is not a terminal (a log file), rich
    does not redraw it: it is written once, as it ends."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *extra_columns,
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=transient,
        disable=disable or _state["quiet"],
    )


def _len(items) -> int | None:
    try:
        return len(items)
    except TypeError:
        return None
