"""The run's SLURM bookkeeping, ``<run_dir>/slurm/state.json``, and the one decision the
job script asks for when its step ends: finish, requeue, or stop.

    {"job_id": "42", "job_ids": ["42"], "status": "running", "stage": "train",
     "requeues": 1, "failures": 0, "max_failures": 3,
     "runs": [{"job_id": "42", "restart": 0, "exit_code": 85, "signals": ["USR1"],
               "outcome": "requeue", ...}, ...]}

The rules, in the order they are checked:

* exit 0: the stage finished; ``failures`` goes back to 0.
* the job was cancelled (``pt-slurm cancel``) or its batch shell got SIGTERM
  (``scancel``, or the wall time reached without the early signal): stop.
* exit 85 (:data:`pt_core.contracts.REQUEUE_EXIT_CODE`), or any non-zero exit after the
  early signal (torchrun and accelerate report a rank's 85 as 1): a requeue, which is
  not a failure.
* any other exit: a failure; requeue while ``failures < max_failures``, else stop.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pt_core.contracts import REQUEUE_EXIT_CODE
from pt_core.errors import InputError
from pt_core.files import atomic_write_json

Action = Literal["done", "requeue", "stop"]
FINAL_STATUSES = ("completed", "failed", "stopped", "cancelled")


def slurm_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "slurm"


def state_path(run_dir: str | Path) -> Path:
    return slurm_dir(run_dir) / "state.json"


def read_state(run_dir: str | Path) -> dict[str, Any]:
    path = state_path(run_dir)
    if not path.exists():
        raise InputError(
            f"{path}: no such file; {run_dir} was not submitted with pt-slurm",
            hint="pass the run directory that `pt-slurm submit` printed",
        )
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None


def write_state(run_dir: str | Path, state: dict[str, Any]) -> None:
    state["updated_at"] = _now()
    atomic_write_json(state_path(run_dir), state)


@contextlib.contextmanager
def updating(run_dir: str | Path, *, create: bool = False) -> Iterator[dict[str, Any]]:
    """Read, change and write the state under a lock: the submitting process and the
    job's batch shell may write at the same moment."""
    slurm_dir(run_dir).mkdir(parents=True, exist_ok=True)
    with open(slurm_dir(run_dir) / ".state.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if create and not state_path(run_dir).exists():
            state: dict[str, Any] = {"job_ids": [], "runs": []}
        else:
            state = read_state(run_dir)
        yield state
        write_state(run_dir, state)


def begin_submission(run_dir: str | Path, *, stage: str, max_failures: int, job_name: str) -> None:
    """Before ``sbatch``, so that the job always finds its state file: failures start
    from 0, the history of earlier submissions stays."""
    with updating(run_dir, create=True) as state:
        state.update(
            job_id=None,
            job_name=job_name,
            stage=stage,
            status="submitting",
            requeues=0,
            failures=0,
            max_failures=max_failures,
            submitted_at=_now(),
        )
        state.pop("reason", None)


def record_job_id(run_dir: str | Path, job_id: str | None, *, error: str | None = None) -> None:
    """After ``sbatch``: the job id (the job may already be running), or why there is none."""
    with updating(run_dir) as state:
        if job_id is None:
            state.update(status="failed", reason=f"sbatch failed: {error}")
            return
        state["job_id"] = job_id
        state["job_ids"] = [*state.get("job_ids", []), job_id]
        if state["status"] == "submitting":
            state["status"] = "submitted"


def record_start(
    run_dir: str | Path, *, job_id: str, restart: int, nodes: str | None = None
) -> None:
    """The batch script began (again): one more entry in ``runs``."""
    with updating(run_dir) as state:
        state["status"] = "running"
        state["job_id"] = job_id
        state["runs"].append(
            {"job_id": job_id, "restart": restart, "nodes": nodes, "started_at": _now()}
        )


def decide(
    state: dict[str, Any], exit_code: int, signals: list[str] | tuple[str, ...] = ()
) -> tuple[Action, str, str]:
    """(action, new status, why) for a step that ended with ``exit_code`` after the batch
    shell received ``signals`` ("USR1", "TERM"); pure."""
    if exit_code == 0:
        return "done", "completed", "the stage finished"
    if state.get("status") == "cancelled":
        return "stop", "cancelled", "cancelled with pt-slurm cancel"
    if "TERM" in signals:
        why = f"SIGTERM (scancel, or the wall time came without SIGUSR1); exit {exit_code}"
        return "stop", "stopped", why
    if exit_code == REQUEUE_EXIT_CODE:
        return "requeue", "requeued", f"exit {REQUEUE_EXIT_CODE}: checkpoint saved, continuing"
    if "USR1" in signals:
        return "requeue", "requeued", f"stopped on SIGUSR1 (exit {exit_code}), continuing"
    failures = state.get("failures", 0) + 1
    limit = state.get("max_failures", 1)
    if failures < limit:
        return "requeue", "retrying", f"exit {exit_code}: failure {failures} of {limit}, retrying"
    return "stop", "failed", f"exit {exit_code}: failure {failures} of {limit}, giving up"


def record_end(
    run_dir: str | Path, *, exit_code: int, signals: list[str] | tuple[str, ...] = ()
) -> Action:
    """Book the end of a step and say what the job script does next."""
    with updating(run_dir) as state:
        action, status, why = decide(state, exit_code, signals)
        if exit_code == 0:
            state["failures"] = 0
        elif status in ("retrying", "failed"):
            state["failures"] = state.get("failures", 0) + 1
        if status == "requeued":
            state["requeues"] = state.get("requeues", 0) + 1
        state["status"] = status
        state["reason"] = why
        if state.get("runs"):
            state["runs"][-1].update(
                ended_at=_now(), exit_code=exit_code, signals=list(signals), outcome=action
            )
    return action


def record_requeue_refused(run_dir: str | Path, message: str) -> None:
    """`scontrol requeue` failed: the job ends here; say so rather than claim a requeue."""
    with updating(run_dir) as state:
        state["status"] = "failed"
        state["reason"] = f"scontrol requeue failed: {message}"


def mark_cancelled(run_dir: str | Path) -> dict[str, Any]:
    with updating(run_dir) as state:
        state["status"] = "cancelled"
        state["reason"] = "cancelled with pt-slurm cancel"
    return state


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
