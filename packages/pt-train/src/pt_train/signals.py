"""Stopping cleanly: SIGTERM/SIGUSR1 ask the trainer to finish the current step, save a
full checkpoint and exit with ``REQUEUE_EXIT_CODE`` (85), which pt-slurm requeues.

The handler only sets a flag; the training loop checks it between optimizer
steps, and all ranks agree on it through one all-reduce, so every rank saves the
same step even if the signal reached only some of them.
"""

from __future__ import annotations

import signal

from pt_core.contracts import REQUEUE_EXIT_CODE

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

__all__ = ["REQUEUE_EXIT_CODE", "StopRequest"]


class StopRequest:
    """Install with ``with StopRequest() as stop:``; ``stop.requested`` turns True on a signal."""

    def __init__(self):
        self.requested = False
        self.signum: int | None = None
        self._old: dict = {}

    def _handle(self, signum, _frame) -> None:
        self.requested = True
        self.signum = signum

    def __enter__(self) -> StopRequest:
        for s in STOP_SIGNALS:
            self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)


class NonFiniteLoss:
    """Counts consecutive optimizer steps whose loss was NaN/inf; the trainer skips such
    a step and aborts after ``limit`` of them in a row."""

    def __init__(self, limit: int, consecutive: int = 0):
        self.limit = limit
        self.consecutive = consecutive

    def update(self, finite: bool) -> bool:
        """Record one step; True when training must stop."""
        self.consecutive = 0 if finite else self.consecutive + 1
        return self.consecutive >= self.limit
