"""The run's SLURM bookkeeping: ``<run_dir>/slurm/events.jsonl``, one JSON line per event.

pt-slurm appends ``submit``, ``job_id``, ``sbatch_failed`` and ``cancel``; the job
script appends ``start``, ``end`` and ``requeue_failed`` with shell code alone
(``templates/bookkeeping.sh``), so a compute node needs no Python for it. Both
take the lock ``slurm/.state.lock``. Each ``end`` event carries the decision the
job made (``action``, ``status``, ``reason``) and the counts after it::

    {"event":"submit","time":"...","stage":"train","max_failures":3,"max_requeues":50,...}
    {"event":"job_id","time":"...","job_id":"42"}
    {"event":"start","time":"...","job_id":"42","restart":0,"nodes":"n[1-2]","progress":""}
    {"event":"end","time":"...","job_id":"42","restart":0,"phase":"step","exit_code":85,
     "signals":"USR1","manifest":false,"progress":"step-40","failures":0,"requeues":1,
     "action":"requeue","status":"requeued","reason":"..."}

:func:`read_state` folds the events into the run's state: ``status``, ``reason``,
``job_id``, ``job_ids``, ``requeues``, ``failures`` and one entry per run of the job.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pt_core.errors import InputError

FINAL_STATUSES = ("completed", "failed", "stopped", "cancelled")
EVENTS = "events.jsonl"
MANIFEST = "manifest.json"


def slurm_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "slurm"


def events_path(run_dir: str | Path) -> Path:
    return slurm_dir(run_dir) / EVENTS


def manifest_path(run_dir: str | Path) -> Path:
    """Where the job keeps the manifest line the stage printed when it finished."""
    return slurm_dir(run_dir) / MANIFEST


@contextlib.contextmanager
def locked(run_dir: str | Path, name: str = ".state.lock") -> Iterator[None]:
    """An exclusive lock on ``slurm/<name>`` (flock, which the job script's flock(1) shares)."""
    slurm_dir(run_dir).mkdir(parents=True, exist_ok=True)
    with open(slurm_dir(run_dir) / name, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError as exc:
            raise InputError(
                f"flock does not work on the filesystem of {run_dir} ({exc.strerror})",
                hint="put output_dir on a filesystem where it does (NFS mounted without "
                "nolock, Lustre with -o flock): pt-slurm and the job take turns through it",
            ) from None
        yield


def submission_lock(run_dir: str | Path):
    """Held from the live-job check until the job id is recorded: two submits to one run
    dir take turns, so the second sees the first one's job."""
    return locked(run_dir, ".submit.lock")


def append_event(run_dir: str | Path, event: str, **fields: Any) -> None:
    with locked(run_dir):
        _append(run_dir, event, **fields)


def _append(run_dir: str | Path, event: str, **fields: Any) -> None:
    """One compact line (the job script matches '{"event":"cancel"' and the like)."""
    line = json.dumps(
        {"event": event, "time": _now(), **fields}, separators=(",", ":"), ensure_ascii=False
    )
    with open(events_path(run_dir), "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_events(run_dir: str | Path) -> list[dict[str, Any]]:
    """The events, oldest first; a clear error for a directory pt-slurm did not submit."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise InputError(f"{run_dir}: no such directory")
    if not run_dir.is_dir():
        raise InputError(
            f"{run_dir} is a file, not a run directory",
            hint="pass the run directory that `pt-slurm submit` printed",
        )
    path = events_path(run_dir)
    if not path.exists():
        raise InputError(
            f"{run_dir} is not a run directory of pt-slurm (it has no slurm/{EVENTS})",
            hint="pass the run directory that `pt-slurm submit` printed",
        )
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    events = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
            if not isinstance(event, dict) or "event" not in event:
                raise ValueError("not an event object")
        except ValueError as exc:
            if number == len(lines):  # a last line still being written
                break
            raise InputError(
                f"{path}:{number}: not an event line ({exc})",
                hint="the file is written by pt-slurm and the job only; restore it or "
                "remove that line",
            ) from None
        events.append(event)
    if not events:
        raise InputError(
            f"{path} holds no events",
            hint="submit the run again with pt-slurm submit",
        )
    return events


def fold(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's state after ``events``: the latest submission's counts and status."""
    st: dict[str, Any] = {
        "job_id": None,
        "job_ids": [],
        "status": None,
        "reason": None,
        "stage": None,
        "requeues": 0,
        "failures": 0,
        "max_failures": None,
        "max_requeues": None,
        "runs": [],
    }
    for ev in events:
        kind = ev.get("event")
        st["updated_at"] = ev.get("time")
        if kind == "submit":
            st.update(
                job_id=None,
                status="submitting",
                reason=None,
                requeues=0,
                failures=0,
                submitted_at=ev.get("time"),
                **{k: ev.get(k) for k in ("stage", "job_name", "max_failures", "max_requeues")},
            )
            st["input"] = ev.get("input")
        elif kind == "job_id":
            st["job_id"] = ev.get("job_id")
            st["job_ids"].append(ev.get("job_id"))
            if st["status"] == "submitting":
                st["status"] = "submitted"
        elif kind == "sbatch_failed":
            st.update(status="failed", reason=f"sbatch failed: {ev.get('error')}")
        elif kind == "start":
            st.update(status="running", reason=None, job_id=ev.get("job_id"))
            st["runs"].append(
                {
                    "job_id": ev.get("job_id"),
                    "restart": ev.get("restart"),
                    "nodes": ev.get("nodes"),
                    "started_at": ev.get("time"),
                }
            )
        elif kind == "end":
            st.update({k: ev.get(k) for k in ("status", "reason", "failures", "requeues")})
            if st["runs"]:
                st["runs"][-1].update(
                    ended_at=ev.get("time"),
                    phase=ev.get("phase"),
                    exit_code=ev.get("exit_code"),
                    signals=[s for s in str(ev.get("signals") or "").split(",") if s],
                    manifest=ev.get("manifest"),
                    outcome=ev.get("action"),
                    reason=ev.get("reason"),
                )
        elif kind == "requeue_failed":
            st.update(status="failed", reason=f"scontrol requeue failed: {ev.get('message')}")
        elif kind == "cancel":
            st.update(
                status="cancelled", reason=ev.get("reason") or "cancelled with pt-slurm cancel"
            )
    return st


def read_state(run_dir: str | Path) -> dict[str, Any]:
    return fold(read_events(run_dir))


def begin_submission(
    run_dir: str | Path,
    *,
    stage: str,
    max_failures: int,
    max_requeues: int,
    job_name: str,
    input_stage: str | None = None,
) -> None:
    """Before ``sbatch``, so that the job always finds its submission: failures and
    requeues start from 0, the history of earlier submissions stays."""
    append_event(
        run_dir,
        "submit",
        stage=stage,
        job_name=job_name,
        max_failures=max_failures,
        max_requeues=max_requeues,
        input=input_stage,
    )


def record_job_id(run_dir: str | Path, job_id: str) -> None:
    """After ``sbatch``: the job id (the job may already be running)."""
    append_event(run_dir, "job_id", job_id=job_id)


def record_sbatch_failed(run_dir: str | Path, error: str) -> None:
    append_event(run_dir, "sbatch_failed", error=error)


def mark_cancelled(run_dir: str | Path, *, reason: str | None = None) -> None:
    """The job, when its step ends, reads this and stops instead of requeueing."""
    append_event(run_dir, "cancel", **({"reason": reason} if reason else {}))


def mark_cancelled_unless_final(run_dir: str | Path) -> bool:
    """Mark the run cancelled unless it has ended; under the lock, so that a job booking
    its end at this moment either comes first (and stays completed) or reads the cancel."""
    with locked(run_dir):
        if fold(read_events(run_dir))["status"] in FINAL_STATUSES:
            return False
        _append(run_dir, "cancel")
    return True


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
