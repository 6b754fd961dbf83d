"""Run a documented command line as a user types it: bash with pipefail, in ``cwd``;
it must exit 0 without a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path


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
