"""Stopping cleanly: SIGTERM/SIGUSR1 ask the trainer to finish the current step, save a
full checkpoint and exit with ``REQUEUE_EXIT_CODE`` (85), which pt-slurm requeues. A first
SIGINT (Ctrl-C) does the same, and ``pt-train run`` then exits 130 saying where the run
resumes; a second SIGINT raises KeyboardInterrupt at once, without saving (the run
resumes from its last complete checkpoint, as after ``kill -9``).

The handler only sets a flag; the training loop checks it between optimizer
steps, and all ranks agree on it through one all-reduce, so every rank saves the
same step even if the signal reached only some of them.
"""

from __future__ import annotations

import os
import signal

from pt_core.contracts import REQUEUE_EXIT_CODE

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

__all__ = ["REQUEUE_EXIT_CODE", "StopRequest"]


class StopRequest:
    """Install with ``with StopRequest() as stop:``; ``stop.requested`` turns True on a signal.

    The last one installed is :attr:`StopRequest.last`, so that a command line can tell,
    once training returns, whether Ctrl-C stopped it (:attr:`interrupted`)."""

    last: StopRequest | None = None

    def __init__(self):
        self.requested = False
        self.signum: int | None = None
        self._old: dict = {}

    @property
    def interrupted(self) -> bool:
        """True when the stop was asked for with SIGINT (Ctrl-C)."""
        return self.signum == signal.SIGINT

    def _handle(self, signum, _frame) -> None:
        if signum == signal.SIGINT:
            if self.interrupted:
                raise KeyboardInterrupt  # the second Ctrl-C: stop now, without saving
            # os.write, not print: a handler may run in the middle of another write to stderr.
            # Rank 0 alone speaks for a job of several ranks (all of them get the SIGINT).
            if os.environ.get("RANK", "0") == "0":
                os.write(
                    2,
                    b"interrupt: saving a checkpoint at the end of this step, then stopping "
                    b"(Ctrl-C again to stop at once, without saving)\n",
                )
        if self.requested and signum != signal.SIGINT:
            return  # a SIGTERM after Ctrl-C: the stop is already on its way, keep its kind
        self.requested = True
        self.signum = signum

    def __enter__(self) -> StopRequest:
        for s in STOP_SIGNALS:
            self._old[s] = signal.signal(s, self._handle)
        StopRequest.last = self
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
