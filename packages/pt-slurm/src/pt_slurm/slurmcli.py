"""The SLURM client commands pt-slurm calls (sbatch, squeue, scontrol, scancel)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from pt_core.errors import PtError


def _run(args: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which(args[0]) is None:
        raise PtError(
            f"{args[0]} not found on PATH: this needs a SLURM client",
            hint="run it on a login node of the cluster (or see the script with --dry-run)",
        )
    proc = subprocess.run(args, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise PtError(
            f"{' '.join(args)} failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()}"
        )
    return proc


def sbatch(script: Path) -> str:
    """Submit ``script``; return the job id."""
    out = _run(["sbatch", "--parsable", str(script)]).stdout.strip()
    job_id = out.splitlines()[-1].split(";")[0] if out else ""
    if not job_id.isdigit():
        raise PtError(f"sbatch printed {out!r}, not a job id")
    return job_id


def job_state(job_id: str) -> str | None:
    """SLURM's state of the job (PENDING, RUNNING, COMPLETED, ...), or None once forgotten."""
    return job_fields(job_id).get("JobState")


def job_fields(job_id: str) -> dict[str, str]:
    """``scontrol show job`` as a mapping (JobState, Restarts, NodeList, ...); {} if unknown."""
    proc = _run(["scontrol", "show", "job", "-o", job_id], check=False)
    if proc.returncode != 0:
        return {}
    fields = {}
    for word in proc.stdout.split():
        if "=" in word:
            key, value = word.split("=", 1)
            fields.setdefault(key, value)
    return fields


def is_active(state: str | None) -> bool:
    return state in {
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "RESIZING",
        "STAGE_OUT",
        "SIGNALING",
    }


def available() -> bool:
    return shutil.which("scontrol") is not None


def scancel(job_id: str) -> None:
    _run(["scancel", job_id])
