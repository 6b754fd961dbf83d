"""The hang watchdog: a rank that completes no optimizer step for ``training.watchdog_minutes``
dumps its Python stacks and exits with ``HANG_EXIT_CODE``, so that a job stuck on a dead
rank or a deadlocked loader fails (and pt-slurm retries it from the last checkpoint)
instead of holding its allocation until the wall time.

Every rank runs its own :class:`Watchdog` thread. The training loop calls
:meth:`Watchdog.beat` after each optimizer step (and the save that may follow it); the
first window, from the start of :func:`pt_train.trainer.train` (process group, model load,
DeepSpeed's set-up and compilation, the resume) to the end of the first step, is
``training.watchdog_first_step_minutes`` (or ``watchdog_minutes`` where that is longer).
When a window passes without a beat, the thread

1. writes every thread's Python stack (:func:`faulthandler.dump_traceback`) to
   ``<run_dir>/hang/rank-R-<UTC time>.txt`` and to stderr;
2. waits ``EXIT_GRACE_S`` (or the window, where that is shorter) so that the other ranks,
   whose windows end within the same few milliseconds (every step ends in a collective),
   dump theirs before this rank's exit breaks their collectives;
3. ends the process with ``os._exit(HANG_EXIT_CODE)``: a rank stuck in a collective cannot
   be interrupted from Python, and nothing else of the process is trusted to run.

The thread needs the GIL, which torch's collectives and waits release. Should a C call
hold the GIL for ever, faulthandler's own C thread (armed ``BACKSTOP_S``, or the window
where that is shorter, after the window and the grace) dumps the stacks to stderr and
exits with code 1 instead.

A test hook lives here as well (:class:`TestStall`, read from ``PT_TRAIN_TEST_STALL``):
it makes a rank sleep before a step or before writing a checkpoint, so that the tests
can hang one rank on purpose. It is not meant for anything but tests.
"""

from __future__ import annotations

import ctypes
import faulthandler
import math
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from pt_core.errors import ConfigError
from pt_core.log import get_logger

log = get_logger(__name__)

# Exit code of a rank that the watchdog ended; neither 0, 2 (bad input) nor 85 (the
# requeue asked for), so pt-slurm counts it as a failure and retries.
HANG_EXIT_CODE = 86
HANG_DIR = "hang"
STALL_VARIABLE = "PT_TRAIN_TEST_STALL"
EXIT_GRACE_S = 10.0
BACKSTOP_S = 30.0
# Both are capped by the window (exit_grace_s, backstop_s): a dump takes milliseconds, and a window of seconds (as in
# the tests) would otherwise end in fixed waits several times its length.


def exit_grace_s(window_s: float) -> float:
    """Seconds between a rank's dump and its exit, for a window of ``window_s``."""
    return min(EXIT_GRACE_S, window_s)


def backstop_s(window_s: float) -> float:
    """Seconds after the window and the grace at which faulthandler ends a rank."""
    return min(BACKSTOP_S, window_s)


class Watchdog:
    """``with Watchdog(run_dir, rank, minutes, first_step_minutes) as dog: ... dog.beat()``.

    ``minutes=None`` turns it off: :meth:`beat` then does nothing.
    """

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        minutes: float | None,
        first_step_minutes: float | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.window_s: float | None = None  # None: the watchdog is off
        self.first_window_s: float | None = None
        if minutes is not None:
            self.window_s = minutes * 60.0
            first = first_step_minutes if first_step_minutes is not None else minutes
            self.first_window_s = max(first, minutes) * 60.0
        self.last_step: int | None = None  # the last step completed in this process
        self._deadline = math.inf
        self._lock = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.window_s is not None

    def __enter__(self) -> Watchdog:
        if self.first_window_s is not None:  # enabled
            self._arm(self.first_window_s)
            self._thread = threading.Thread(target=self._run, name="pt-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is None:  # not enabled
            return
        with self._lock:
            self._stopped = True
            self._lock.notify()
        faulthandler.cancel_dump_traceback_later()
        self._thread.join()

    def beat(self, step: int) -> None:
        """Optimizer step ``step`` (and the save after it) is done: a new window starts."""
        if self.window_s is None:  # not enabled
            return
        self.last_step = step
        self._arm(self.window_s)

    def _arm(self, seconds: float) -> None:
        with self._lock:
            self._window = seconds
            self._deadline = time.monotonic() + seconds
            self._lock.notify()  # the thread may be waiting for a later deadline
        faulthandler.dump_traceback_later(
            seconds + exit_grace_s(seconds) + backstop_s(seconds), exit=True, file=sys.stderr
        )

    def _run(self) -> None:
        with self._lock:
            while not self._stopped:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._lock.wait(remaining)
            if self._stopped:
                return
            window = self._window
        self._fire(window)

    def _fire(self, window: float) -> None:
        """Dump every thread's stack to the run dir and stderr, then end the process."""
        now = datetime.now(UTC)
        what = (
            "the first optimizer step of this process"
            if self.last_step is None
            else f"the optimizer step after step {self.last_step}"
        )
        header = (
            f"pt-train watchdog: rank {self.rank} (pid {os.getpid()}) waited {window / 60:g} "
            f"min for {what}; Python stacks of every thread (the main thread is "
            f"{threading.main_thread().ident:#018x}) at {now.isoformat(timespec='seconds')}:\n"
        )
        path = self.run_dir / HANG_DIR / f"rank-{self.rank}-{now:%Y%m%dT%H%M%S}Z.txt"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w") as fh:
                fh.write(header)
                fh.flush()
                faulthandler.dump_traceback(fh, all_threads=True)
        except OSError as exc:  # the stacks still go to stderr below
            path = f"nowhere ({exc})"
        sys.stderr.flush()
        sys.stderr.write(header)
        sys.stderr.flush()
        faulthandler.dump_traceback(sys.stderr, all_threads=True)
        log.error(
            "watchdog: no optimizer step completed in %g min on rank %d; stacks written to "
            "%s; exiting with %d in %g s",
            window / 60,
            self.rank,
            path,
            HANG_EXIT_CODE,
            exit_grace_s(window),
        )
        sys.stderr.flush()
        time.sleep(exit_grace_s(window))
        os._exit(HANG_EXIT_CODE)


def hang_dumps(run_dir: Path) -> list[Path]:
    """The stack dumps the watchdog left in a run directory, oldest first."""
    return sorted((Path(run_dir) / HANG_DIR).glob("rank-*.txt"))


class TestStall:
    """A test hook: ``PT_TRAIN_TEST_STALL="at=step,rank=1,step=3,seconds=inf"`` makes rank 1
    sleep for ever before optimizer step 3 (0-based: the step that ``step-4`` follows).

    Keys: ``at`` (``step``: before an optimizer step; ``write``: before a background
    checkpoint write; ``half_written``: in one, after its first file; ``step`` then names
    the checkpoint's step), ``rank`` and ``step``
    (a number, or ``all``, the default), ``seconds`` (a number or ``inf``) and ``gil``
    (``1``: sleep in a C call that keeps the GIL, as a stuck extension would). A stall
    happens only while the run directory holds no stack dump of the watchdog, so a run
    that hung once runs through when it is retried.
    """

    __test__ = False  # not a pytest class

    def __init__(self, spec: str | None, rank: int, run_dir: Path):
        self.rank = rank
        self.run_dir = Path(run_dir)
        self.at: str | None = None
        if not spec:
            return
        fields = dict(item.split("=", 1) for item in spec.replace(",", " ").split() if item)
        unknown = set(fields) - {"at", "rank", "step", "seconds", "gil"}
        if unknown or fields.get("at") not in ("step", "write", "half_written"):
            raise ConfigError(
                f"{STALL_VARIABLE}={spec!r} is not a stall: unknown keys "
                f"{sorted(unknown) or 'none'}, at={fields.get('at')!r}",
                hint=f"e.g. {STALL_VARIABLE}='at=step,rank=1,step=3,seconds=inf' (a test hook)",
            )
        self.at = fields["at"]
        self.ranks = fields.get("rank", "all")
        self.steps = fields.get("step", "all")
        self.seconds = float(fields.get("seconds", "inf"))
        self.hold_gil = fields.get("gil", "0") == "1"

    @classmethod
    def from_env(cls, rank: int, run_dir: Path) -> TestStall:
        return cls(os.environ.get(STALL_VARIABLE), rank, run_dir)

    def __call__(self, at: str, step: int) -> None:
        if self.at != at:
            return
        if self.ranks != "all" and int(self.ranks) != self.rank:
            return
        if self.steps != "all" and int(self.steps) != step:
            return
        if hang_dumps(self.run_dir):
            return
        log.warning(
            "%s: rank %d stalls %g s at %s %d",
            STALL_VARIABLE,
            self.rank,
            self.seconds,
            at,
            step,
        )
        deadline = time.monotonic() + self.seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.hold_gil:
                # A foreign call through PyDLL keeps the GIL while libc's sleep runs.
                ctypes.PyDLL(None).sleep(int(min(left, 3600)) or 1)
            else:
                time.sleep(min(left, 60.0))
