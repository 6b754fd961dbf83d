"""Generator processes listening on TCP addresses (``pt-rollout serve --listen``), as a
trainer on another node finds them: started here on 127.0.0.1, each on a free port."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pt_rollout.serve import READY


def start(
    model: Path | str, key_file: Path, *args: str, python: str | None = None
) -> tuple[subprocess.Popen, str]:
    """``pt-rollout serve --listen 127.0.0.1:0 --model MODEL --key-file KEY ARGS`` (with
    ``python``'s pt-rollout, else this environment's); the process and its address, once
    it listens."""
    command = [python or sys.executable, "-m", "pt_rollout.cli", "serve", "--listen",
               "127.0.0.1:0", "--model", str(model), "--key-file", str(key_file), *args]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 600
    for line in proc.stdout:
        if line.startswith(READY):
            return proc, line.split()[1]
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise AssertionError(f"pt-rollout serve did not start: exit {proc.wait()}")


@contextlib.contextmanager
def listening(model: Path | str, key_file: Path, count: int, *args: str, python=None):
    """``count`` generator processes listening (see :func:`start`): yields ``(procs,
    addresses)`` and stops them after."""
    started = []
    try:
        for _ in range(count):
            started.append(start(model, key_file, *args, python=python))
        yield [p for p, _ in started], [a for _, a in started]
    finally:
        for proc, _ in started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)  # one a test stopped
                proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
