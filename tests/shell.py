"""Run a documented command line as a user types it: bash with pipefail, in ``cwd``;
it must exit 0 without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def tools_path() -> str:
    """``PATH`` with this environment's console scripts first, behind the suite's
    stand-ins for them where its commands are forked (tests/zygote.py)."""
    first = [str(Path(sys.executable).parent)]
    socket = os.environ.get("PT_TEST_ZYGOTE")
    if socket:
        first.insert(0, str(Path(socket).parent / "bin"))
    return os.pathsep.join([*first, os.environ["PATH"]])


def sh(command: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"{command}\nexit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr, f"{command}\n{proc.stderr}"
    return proc
