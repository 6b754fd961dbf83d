"""Submit a run, and look after it: status, logs, cancel.

``submit("train.yaml", ["slurm.nodes=2"])`` freezes the config into
``runs/<run_name>/config.yaml``, writes ``slurm/job.sh``, sbatches it and starts
``slurm/state.json``; it returns the job manifest.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import yaml

from pt_core.errors import ConfigError, PtError
from pt_core.files import atomic_write_text
from pt_slurm import slurmcli, state
from pt_slurm.config import RunFile, check_stage, load_run_config
from pt_slurm.render import render_script

_SBATCH_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+@:=,-]+$")


def prepare(
    config: str | Path, overrides: list[str] | None, *, stage: str = "train"
) -> tuple[RunFile, Path, str, dict]:
    """Validate the config and render the script; write nothing.

    Returns the run keys, the absolute run dir, the script and the whole config."""
    run, data = load_run_config(config, overrides)
    check_stage(stage, run, data)
    run_dir = run.run_dir.absolute()
    workdir = Path.cwd()
    for what, path in (("run directory", run_dir), ("working directory", workdir)):
        if not _SBATCH_SAFE_PATH.match(str(path)):
            raise ConfigError(
                f"the {what} {path} has characters an #SBATCH line cannot carry",
                hint="use a path of letters, digits and ._-/ only (no spaces)",
            )
    script = render_script(run, data, stage=stage, run_dir=run_dir, workdir=workdir)
    return run, run_dir, script, data


def submit(
    config: str | Path,
    overrides: list[str] | None = None,
    *,
    stage: str = "train",
    force: bool = False,
) -> dict[str, Any]:
    """Freeze the config into the run dir, write slurm/job.sh, sbatch it, record the job."""
    run, run_dir, script, data = prepare(config, overrides, stage=stage)
    _refuse_second_job(run_dir)
    freeze_config(run_dir, data, force=force)
    sdir = state.slurm_dir(run_dir)
    sdir.mkdir(parents=True, exist_ok=True)
    job_sh = sdir / "job.sh"
    atomic_write_text(job_sh, script)
    job_sh.chmod(0o755)
    job_name = run.slurm.job_name or run.run_name
    state.begin_submission(
        run_dir, stage=stage, max_failures=run.slurm.max_failures, job_name=job_name
    )
    try:
        job_id = slurmcli.sbatch(job_sh)
    except PtError as exc:
        state.record_job_id(run_dir, None, error=exc.message)
        raise
    state.record_job_id(run_dir, job_id)
    return {"kind": "job", "path": run_dir, "job_id": job_id, "stage": stage, "script": job_sh}


def _refuse_second_job(run_dir: Path) -> None:
    """One run directory, one live job: two would write the same checkpoints."""
    if not state.state_path(run_dir).exists():
        return
    job_id = state.read_state(run_dir).get("job_id")
    slurm_state = slurmcli.job_state(job_id) if job_id else None
    if slurmcli.is_active(slurm_state):
        raise PtError(
            f"{run_dir} already has job {job_id} ({slurm_state})",
            hint=f"wait for it, or stop it first: pt-slurm cancel {run_dir}",
        )


def freeze_config(run_dir: Path, data: dict, *, force: bool = False) -> Path:
    """Write ``config.yaml`` into the run dir.

    A run dir that already holds a config (an earlier submission, or the stage's own
    fuller copy) keeps it, with only the ``slurm:`` section replaced, provided every
    other key given now has the same value there; otherwise this refuses, so that a
    resubmission cannot quietly change a run half way (``force`` replaces the file).
    """
    path = run_dir / "config.yaml"
    if path.exists() and not force:
        frozen = yaml.safe_load(path.read_text()) or {}
        differing = _differing_keys(
            {k: v for k, v in data.items() if k != "slurm"},
            {k: v for k, v in frozen.items() if k != "slurm"},
        )
        if differing:
            raise ConfigError(
                f"{path} holds this run with other values for: {', '.join(differing)}",
                hint="use a new run_name, restore those values, or pass --force to replace "
                "the frozen config",
            )
        data = {**frozen, "slurm": data.get("slurm", {})}
    return atomic_write_text(path, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def _differing_keys(new: dict, old: dict, prefix: str = "") -> list[str]:
    """Dotted keys of ``new`` whose value in ``old`` differs (keys only in ``old`` are fine:
    a stage writes its defaults into the frozen copy)."""
    out = []
    for key, value in new.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(old.get(key), dict):
            out += _differing_keys(value, old[key], dotted + ".")
        elif key not in old or old[key] != value:
            out.append(dotted)
    return out


# --------------------------------------------------------------------------- watching


def status(run_dir: str | Path) -> dict[str, Any]:
    """What the state file, SLURM and the run's last metrics line say about the run."""
    run_dir = Path(run_dir)
    st = state.read_state(run_dir)
    fields = slurmcli.job_fields(st["job_id"]) if slurmcli.available() else {}
    return {
        "kind": "job",
        "path": run_dir,
        "job_id": st["job_id"],
        "status": st["status"],
        "slurm_state": fields.get("JobState"),
        "stage": st.get("stage"),
        "requeues": st.get("requeues", 0),
        "failures": st.get("failures", 0),
        "max_failures": st.get("max_failures"),
        "reason": st.get("reason"),
        "last_metrics": last_metrics(run_dir),
    }


def last_metrics(run_dir: Path) -> dict | None:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - 65536))
        lines = [x for x in fh.read().decode("utf-8", "replace").splitlines() if x.strip()]
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def log_paths(run_dir: str | Path, job_id: str | None = None) -> tuple[Path, Path]:
    run_dir = Path(run_dir)
    job_id = job_id or state.read_state(run_dir)["job_id"]
    sdir = state.slurm_dir(run_dir)
    return sdir / f"slurm-{job_id}.out", sdir / f"slurm-{job_id}.err"


def follow_logs(
    run_dir: str | Path,
    *,
    follow: bool = False,
    job_id: str | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    poll_seconds: float = 1.0,
) -> None:
    """Copy the job's stdout log to ``out`` and its stderr log to ``err``; with ``follow``,
    keep copying until the run is over (a final status, or SLURM no longer runs the job)."""
    out, err = out or sys.stdout, err or sys.stderr
    out_path, err_path = log_paths(run_dir, job_id)
    offsets = {out_path: 0, err_path: 0}
    while True:
        over = not follow or _job_over(run_dir)  # checked before reading: nothing is missed
        for path, stream in ((out_path, out), (err_path, err)):
            if path.exists():
                with open(path, encoding="utf-8", errors="replace") as fh:
                    fh.seek(offsets[path])
                    chunk = fh.read()
                    offsets[path] = fh.tell()
                if chunk:
                    stream.write(chunk)
                    stream.flush()
        if over:
            return
        time.sleep(poll_seconds)


def _job_over(run_dir: str | Path) -> bool:
    st = state.read_state(run_dir)
    if st["status"] in state.FINAL_STATUSES:
        return True
    # A job killed outright (node failure, SIGKILL) never books its end; SLURM knows.
    return slurmcli.available() and not slurmcli.is_active(slurmcli.job_state(st["job_id"]))


def cancel(run_dir: str | Path) -> dict[str, Any]:
    """Mark the run cancelled (so the job does not requeue itself) and scancel it."""
    run_dir = Path(run_dir)
    st = state.mark_cancelled(run_dir)
    slurmcli.scancel(st["job_id"])
    return {"kind": "job", "path": run_dir, "job_id": st["job_id"], "status": "cancelled"}
