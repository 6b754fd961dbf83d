"""Logging and progress on stderr, so stdout stays free for the one manifest line."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
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

_state = {"quiet": False}


def setup_logging(*, quiet: bool = False, verbose: bool = False) -> None:
    """Route every ``pt_*`` logger to stderr through rich; --quiet also hides progress bars."""
    _state["quiet"] = quiet
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    root = logging.getLogger("pt")
    root.handlers.clear()
    handler = RichHandler(console=console, show_path=verbose, show_time=False, markup=False)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def get_logger(name: str) -> logging.Logger:
    """A logger under the ``pt`` hierarchy (``pt_data.build`` -> ``pt.data.build``)."""
    return logging.getLogger("pt." + name.removeprefix("pt_").replace("_", "."))


def is_quiet() -> bool:
    return _state["quiet"]


def progress(*extra_columns, transient: bool = False, disable: bool = False) -> Progress:
    """A rich progress bar on stderr, disabled under --quiet, by ``disable`` (work that is a
    part of a step another bar shows), or when stderr is not a terminal and output would
    only be noise in a log file."""
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


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a progress bar on stderr."""
    with progress() as bar:
        task = bar.add_task(description, total=total if total is not None else _len(items))
        for item in items:
            yield item
            bar.advance(task)


def _len(items) -> int | None:
    try:
        return len(items)
    except TypeError:
        return None
