"""What the pt-train tests that run ``pt-train run`` as a user does share."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pt_train.watchdog import STALL_VARIABLE


class PtTrainRun:
    """``pt-train run CONFIG run_name=NAME OVERRIDES...`` started in the background, with
    one thread for torch and, if given, the ``PT_TRAIN_TEST_STALL`` test hook; its stderr
    goes to a file (a pipe nobody reads could fill up and stop it)."""

    def __init__(self, config: Path, name: str, *overrides: str, stall: str | None = None):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop(STALL_VARIABLE, None)
        if stall is not None:
            env[STALL_VARIABLE] = stall
        root = Path(config).parent
        self.run_dir = root / "runs" / name
        self.log = root / f"{name}-{time.monotonic_ns()}.err"
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [shutil.which("pt-train", path=os.path.dirname(sys.executable)), "run",
                 config, f"run_name={name}", *overrides],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )  # fmt: skip

    def stderr(self) -> str:
        """What it printed on stderr so far, its lines joined (rich wraps long ones)."""
        return " ".join(self.log.read_text().split())

    def finish(self, timeout: float = 600) -> tuple[int, str, str]:
        """Wait for the end: (exit code, stdout, stderr with its lines joined)."""
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, self.stderr()


@pytest.fixture(scope="session")
def pt_train_run():
    return PtTrainRun
