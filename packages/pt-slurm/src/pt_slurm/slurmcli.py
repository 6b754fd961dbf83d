"""The SLURM client commands pt-slurm calls (sbatch, squeue, scontrol, scancel).

Questions whose answer decides whether a second job may start (is this job still
live?) fail closed: when SLURM cannot answer, they raise rather than guess "not live".
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TypeGuard

from pt_core.errors import PtError

ACTIVE_STATES = frozenset(
    {
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
)


class SlurmUnavailable(PtError):
    """A SLURM command could not answer (no client, controller down, ...)."""


def _run(args: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which(args[0]) is None:
        raise SlurmUnavailable(
            f"{args[0]} not found on PATH: this needs a SLURM client",
            hint="run it on a login node of the cluster (or see the script with --dry-run)",
        )
    proc = subprocess.run(args, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SlurmUnavailable(f"{' '.join(args)} failed (exit {proc.returncode}): {_said(proc)}")
    return proc


def _said(proc: subprocess.CompletedProcess) -> str:
    return " ".join((proc.stderr or proc.stdout or "").split()) or "no message"


def sbatch(script: Path, *, after: str | None = None, hold: bool = False) -> str:
    """Submit ``script``; return the job id. ``after``: a job that must complete
    successfully first (``--dependency=afterok``); if it fails, SLURM cancels this one.
    ``hold``: the job waits (``JobHeldUser``) until :func:`release`."""
    args = ["sbatch", "--parsable"]
    if hold:
        args.append("--hold")
    if after is not None:
        args += [f"--dependency=afterok:{after}", "--kill-on-invalid-dep=yes"]
    out = _run([*args, str(script)]).stdout.strip()
    job_id = out.splitlines()[-1].split(";")[0] if out else ""
    if not job_id.isdigit():
        raise PtError(f"sbatch printed {out!r}, not a job id")
    return job_id


def job_fields(job_id: str) -> dict[str, str]:
    """``scontrol show job`` as a mapping (JobState, Reason, Restarts, ...); {} for a job
    SLURM no longer knows. Raises :class:`SlurmUnavailable` when SLURM cannot answer."""
    proc = _run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
    if proc.returncode != 0:
        if "invalid job id" in _said(proc).lower():
            return {}
        raise SlurmUnavailable(
            f"scontrol show job {job_id} failed (exit {proc.returncode}): {_said(proc)}"
        )
    fields: dict[str, str] = {}
    for word in proc.stdout.split():
        if "=" in word:
            key, value = word.split("=", 1)
            fields.setdefault(key, value)
    return fields


def accounting_state(job_id: str) -> str | None:
    """The job's state in SLURM's accounting (``sacct``), for a job the controller has
    forgotten; None where there is no accounting (no sacct, no slurmdbd) or no record."""
    if shutil.which("sacct") is None:
        return None
    proc = _run(["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State"], check=False)
    words = proc.stdout.split() if proc.returncode == 0 else []
    return words[0] if words else None  # "CANCELLED by 0" -> CANCELLED


def live_jobs_running(script: Path) -> list[tuple[str, str]]:
    """(job id, state) of this user's live jobs whose batch script is ``script``: the jobs
    writing its run directory, whatever the run's own records say."""
    proc = _run(["squeue", "-h", "-t", "all", "-u", str(os.getuid()), "-o", "%i|%T|%o"])
    jobs = []
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) == 3 and parts[1] in ACTIVE_STATES and parts[2] == str(script):
            jobs.append((parts[0], parts[1]))
    return jobs


def is_active(state: str | None) -> TypeGuard[str]:
    return state in ACTIVE_STATES


def available() -> bool:
    return shutil.which("scontrol") is not None


def scancel(job_id: str) -> None:
    _run(["scancel", str(job_id)])


def release(job_ids: list[str]) -> None:
    """Let held jobs start (``scontrol release``), all in one call."""
    _run(["scontrol", "release", ",".join(job_ids)])
