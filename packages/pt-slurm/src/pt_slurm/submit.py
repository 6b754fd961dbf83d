"""Submit a run (or a pipeline of stages), and look after it: status, logs, cancel.

``submit("train.yaml", ["slurm.nodes=2"])`` checks the stage's config at the job's
world size, freezes it into ``runs/<run_name>/config.yaml``, writes ``slurm/job.sh``,
sbatches it and records the job in ``slurm/events.jsonl``; it returns the job manifest.
``submit("pipeline.yaml")`` does the same for every stage, chaining the jobs with
``--dependency=afterok``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import yaml

from pt_core.config import changed_keys
from pt_core.config import freeze_config as pt_freeze_config
from pt_core.errors import ConfigError, InputError, PtError
from pt_core.files import atomic_write_json, atomic_write_text
from pt_core.log import get_logger
from pt_slurm import slurmcli, state
from pt_slurm.config import check_stage, load_run_config
from pt_slurm.pipeline import (
    Stage,
    is_pipeline_file,
    load_pipeline,
    stages_of_one_config,
    without_other_options,
)
from pt_slurm.render import INPUT_WORD, render_script
from pt_slurm.validate import validate_stage

log = get_logger(__name__)

_SBATCH_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+@:=,-]+$")
PIPELINE = "pipeline.json"


def plan(
    config: str | Path, overrides: list[str] | None = None, stages: list[str] | None = None
) -> tuple[list[Stage], Path | None]:
    """The stages to submit, and the pipeline's directory (None for a single run)."""
    overrides = list(overrides or [])
    if Path(config).is_dir():
        raise ConfigError(
            f"{config} is a directory, not a config file",
            hint="pass the run's YAML file (status, logs and cancel take the run directory)",
        )
    if not Path(config).is_file():
        raise ConfigError(f"{config}: config file not found")
    if is_pipeline_file(config):
        if stages:
            raise ConfigError(
                f"{config} is a pipeline (it has stages:); --stage does not apply to it",
                hint="leave out --stage; each entry of stages: names its stage",
            )
        planned = load_pipeline(config, overrides)
        return planned, planned[0].run_dir.parent
    kinds = list(stages or ["train"])
    if len(kinds) > 1:
        planned = stages_of_one_config(config, overrides, kinds)
        return planned, planned[0].run_dir.parent
    run, data = load_run_config(config, overrides)
    check_stage(kinds[0], run, data)
    data = without_other_options(kinds[0], data)
    stage = Stage(
        name=run.run_name,
        stage=kinds[0],
        run=run,
        data=data,
        run_dir=run.run_dir.absolute(),
        config=Path(config),
        overrides=overrides,
    )
    return [stage], None


def prepare(
    config: str | Path, overrides: list[str] | None = None, stages: list[str] | None = None
) -> tuple[list[tuple[Stage, str]], Path | None]:
    """Validate every stage (its own config too) and render its script; write nothing."""
    planned, root = plan(config, overrides, stages)
    workdir = Path.cwd()
    rendered = []
    for stage in planned:
        for what, path in (("run directory", stage.run_dir), ("working directory", workdir)):
            if not _SBATCH_SAFE_PATH.match(str(path)):
                raise ConfigError(
                    f"the {what} {path} has characters an #SBATCH line cannot carry",
                    hint="use a path of letters, digits and ._-/ only (no spaces)",
                )
        command = stage.run.slurm.command
        if command is not None and INPUT_WORD in command and stage.input is None:
            raise ConfigError(
                f"stage {stage.name!r}: slurm.command uses {INPUT_WORD}, and no stage before "
                "it gives one",
                hint="run it in a pipeline after the stage whose result it takes",
            )
        note = validate_stage(
            stage.stage,
            stage.run,
            stage.data,
            config=stage.config,
            overrides=stage.overrides,
            has_input=stage.input is not None,
        )
        log.info("%s: %s", stage.name, note)
        script = render_script(
            stage.run,
            stage.data,
            stage=stage.stage,
            run_dir=stage.run_dir,
            workdir=workdir,
            input_manifest=state.manifest_path(stage.input.run_dir) if stage.input else None,
            input_stage=stage.input.name if stage.input else None,
        )
        rendered.append((stage, script))
    return rendered, root


def dry_run_text(rendered: list[tuple[Stage, str]]) -> str:
    if len(rendered) == 1:
        return rendered[0][1]
    parts = []
    for index, (stage, script) in enumerate(rendered, start=1):
        after = f", after stage {rendered[index - 2][0].name!r} succeeds" if index > 1 else ""
        parts.append(f"# ===== stage {index} of {len(rendered)}: {stage.name}{after}\n{script}")
    return "\n".join(parts)


def submit(
    config: str | Path,
    overrides: list[str] | None = None,
    *,
    stages: list[str] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Check, freeze, write and sbatch every stage; record each job; return the manifest.

    From the live-job check to the recorded job id, each run directory's submission
    lock is held: of two submits to one run directory, the second finds the first's job.
    """
    rendered, root = prepare(config, overrides, stages)
    with contextlib.ExitStack() as held:
        for run_dir in sorted({stage.run_dir for stage, _ in rendered}):
            held.enter_context(state.submission_lock(run_dir))
        for stage, _ in rendered:
            _refuse_second_job(stage.run_dir)
        scripts = {}
        for stage, script in rendered:
            freeze_config(stage.run_dir, stage.data, force=force)
            job_sh = state.slurm_dir(stage.run_dir) / "job.sh"
            atomic_write_text(job_sh, script)
            job_sh.chmod(0o755)
            scripts[stage.name] = job_sh
        if root is not None:
            atomic_write_json(
                root / PIPELINE,
                {
                    "stages": [
                        {
                            "name": stage.name,
                            "stage": stage.stage,
                            "run_dir": str(stage.run_dir),
                            "input": stage.input.name if stage.input else None,
                        }
                        for stage, _ in rendered
                    ]
                },
            )
        job_ids = _sbatch_chain([stage for stage, _ in rendered], scripts)
    if root is None:
        stage = rendered[0][0]
        return {
            "kind": "job",
            "path": stage.run_dir,
            "job_id": job_ids[stage.name],
            "stage": stage.stage,
            "script": scripts[stage.name],
        }
    return {
        "kind": "job",
        "path": root,
        "job_id": job_ids[rendered[-1][0].name],
        "stages": [
            {"name": s.name, "stage": s.stage, "job_id": job_ids[s.name], "path": str(s.run_dir)}
            for s, _ in rendered
        ],
    }


def _sbatch_chain(stages: list[Stage], scripts: dict[str, Path]) -> dict[str, str]:
    """sbatch each stage, each after the one before it. A pipeline's stages are submitted
    held and released together once sbatch has accepted every one; if sbatch refuses one
    (or the release fails), the ones already submitted are cancelled before any ran."""
    job_ids: dict[str, str] = {}
    previous: str | None = None
    hold = len(stages) > 1
    for stage in stages:
        slurm = stage.run.slurm
        state.begin_submission(
            stage.run_dir,
            stage=stage.stage,
            max_failures=slurm.max_failures,
            max_requeues=slurm.max_requeues,
            job_name=slurm.job_name or stage.run.run_name,
            input_stage=stage.input.name if stage.input else None,
        )
        try:
            job_id = slurmcli.sbatch(scripts[stage.name], after=previous, hold=hold)
        except PtError as exc:
            state.record_sbatch_failed(stage.run_dir, exc.message)
            why = f"sbatch of stage {stage.name!r} failed"
            _cancel_held(stages, job_ids, why)
            if job_ids:
                raise PtError(
                    f"{why}: {exc.message}; the stage(s) submitted before it "
                    f"({', '.join(job_ids)}) were held, and were cancelled before they ran",
                    hint=exc.hint,
                ) from None
            raise
        state.record_job_id(stage.run_dir, job_id)
        job_ids[stage.name] = job_id
        previous = job_id
    if hold:
        try:
            slurmcli.release(list(job_ids.values()))
        except PtError as exc:
            _cancel_held(stages, job_ids, "the release of the held stages failed")
            raise PtError(
                f"every stage was submitted held, and releasing them failed: {exc.message}; "
                f"all were cancelled before they ran",
                hint="submit again once `scontrol release` works (check with: squeue --me)",
            ) from None
    return job_ids


def _cancel_held(stages: list[Stage], job_ids: dict[str, str], why: str) -> None:
    """Cancel the held jobs of a pipeline whose submission failed, the last one first."""
    for stage in reversed([s for s in stages if s.name in job_ids]):
        state.mark_cancelled(stage.run_dir, reason=f"{why}; cancelled before it ran")
        with contextlib.suppress(PtError):
            slurmcli.scancel(job_ids[stage.name])


def _refuse_second_job(run_dir: Path) -> None:
    """One run directory, one live job: two would write the same checkpoints. When SLURM
    cannot say, this refuses too."""
    script = state.slurm_dir(run_dir) / "job.sh"
    try:
        live = slurmcli.live_jobs_running(script)
        if state.events_path(run_dir).exists():
            job_id = state.read_state(run_dir)["job_id"]
            if job_id and job_id not in {j for j, _ in live}:
                job_state = slurmcli.job_fields(job_id).get("JobState")
                if slurmcli.is_active(job_state):
                    live.append((job_id, job_state))
    except slurmcli.SlurmUnavailable as exc:
        raise PtError(
            f"cannot tell whether {run_dir} already has a live job, so nothing was submitted: "
            f"{exc.message}",
            hint="submit again once the SLURM controller answers (check with: squeue --me)",
        ) from None
    if live:
        job_id, job_state = live[0]
        raise PtError(
            f"{run_dir} already has job {job_id} ({job_state})",
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
        try:
            frozen = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise InputError(
                f"{path}: not valid YAML ({exc})", hint="pass --force to replace it"
            ) from None
        if not isinstance(frozen, dict):
            raise InputError(f"{path}: not a mapping of keys", hint="pass --force to replace it")
        differing = changed_keys(frozen, data, ignore=("slurm",), only_new=True)
        if differing:
            raise ConfigError(
                f"{path} holds this run with other values for: {', '.join(differing)}",
                hint="use a new run_name, restore those values, or pass --force to replace "
                "the frozen config",
            )
        data = {**frozen, "slurm": data.get("slurm", {})}
    return pt_freeze_config(data, run_dir)


# --------------------------------------------------------------------------- watching


def pipeline_stages(path: Path) -> list[dict[str, Any]] | None:
    """The stages recorded in a pipeline directory, or None for a single run's directory."""
    file = Path(path) / PIPELINE
    if not file.exists():
        return None
    try:
        stages = json.loads(file.read_text())["stages"]
        if not isinstance(stages, list) or not all("run_dir" in s for s in stages):
            raise ValueError("no list of stages")
    except (ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{file}: not a pipeline record ({exc})") from None
    return stages


def status(path: str | Path) -> dict[str, Any]:
    """What the events, SLURM and the run's last metrics line say about a run, or about
    every stage of a pipeline."""
    path = Path(path)
    stages = pipeline_stages(path)
    if stages is None:
        return stage_status(path)
    infos: list[dict[str, Any]] = []
    for s in stages:
        infos.append({"name": s["name"], **stage_status(Path(s["run_dir"]), s, infos)})
    first_open = next((i for i in infos if i["status"] != "completed"), None)
    return {
        "kind": "job",
        "path": path,
        "job_id": infos[-1]["job_id"],
        "status": first_open["status"] if first_open else "completed",
        "stages": infos,
    }


# How a job SLURM ended without the job booking its end reads (a plain scancel of a
# pending job, a SIGKILL): SLURM's state, in pt-slurm's words.
_UNBOOKED_END = {"CANCELLED": "cancelled", "TIMEOUT": "stopped", "PREEMPTED": "stopped"}
_ENDED_UNFINISHED = ("failed", "stopped", "cancelled")


def stage_status(
    run_dir: Path, stage: dict | None = None, earlier: list[dict] | None = None
) -> dict[str, Any]:
    """One run's status; ``stage``: its record in a pipeline, whose later stages have no
    events when an earlier stage's sbatch failed; ``earlier``: the statuses of the
    stages before it (a stage waits for every one of them to complete).

    The recorded status (``slurm/events.jsonl``) is reconciled with what SLURM says:
    a job SLURM has ended, or forgotten, without booking its end takes SLURM's word, and
    a stage that has not started behind a stage that ended unfinished will not run.
    ``sources`` says where ``status`` and ``slurm_state`` come from.
    """
    if stage is not None and not state.events_path(run_dir).exists():
        st = {"job_id": None, "status": "not submitted", "stage": stage.get("stage")}
        st["reason"] = "a stage before it was not submitted"
    else:
        st = state.read_state(run_dir)
    fields: dict[str, str] = {}
    slurm_state, slurm_source, slurm_error, forgotten = None, None, None, False
    if st["job_id"] and slurmcli.available():
        try:
            fields = slurmcli.job_fields(st["job_id"])
        except slurmcli.SlurmUnavailable as exc:
            slurm_error = exc.message
        else:
            slurm_state, slurm_source = fields.get("JobState"), "scontrol"
            if not fields:
                slurm_state, slurm_source = slurmcli.accounting_state(st["job_id"]), "sacct"
                forgotten = slurm_state is None
    status, reason, status_source = st["status"], st.get("reason"), "events"
    blocker = next((i for i in reversed(earlier or []) if i["status"] in _ENDED_UNFINISHED), None)
    if status in ("submitting", "submitted") and blocker is not None:
        status, status_source = "will not run", "pipeline"
        reason = f"will not run: stage {blocker['name']} {blocker['status']}"
    elif status not in state.FINAL_STATUSES and status != "not submitted" and not slurm_error:
        if forgotten:
            status, status_source = "unknown", "scontrol"
            reason = (
                f"SLURM no longer knows job {st['job_id']} (it forgets ended jobs after "
                f"MinJobAge) and the job booked no end; it was last {st['status']}"
            )
        elif slurm_state is not None and not slurmcli.is_active(slurm_state):
            status, status_source = _UNBOOKED_END.get(slurm_state, "failed"), slurm_source
            reason = (
                f"SLURM ended job {st['job_id']} ({slurm_state}) and the job booked no end "
                f"(scancel outside pt-slurm, a kill before the job could book); it was "
                f"last {st['status']}"
            )
    slurm_reason = fields.get("Reason")
    result = None
    if state.manifest_path(run_dir).exists() and status == "completed":
        with contextlib.suppress(ValueError, KeyError, TypeError):
            result = json.loads(state.manifest_path(run_dir).read_text())["path"]
    return {
        "kind": "job",
        "path": run_dir,
        "job_id": st["job_id"],
        "status": status,
        "recorded_status": st["status"],
        "slurm_state": slurm_state,
        "slurm_reason": slurm_reason if slurm_reason not in (None, "None") else None,
        "slurm_error": slurm_error,
        "slurm_forgot": forgotten,
        "stage": st.get("stage"),
        "requeues": st.get("requeues", 0),
        "max_requeues": st.get("max_requeues"),
        "failures": st.get("failures", 0),
        "max_failures": st.get("max_failures"),
        "reason": reason,
        "result": result,
        "last_metrics": last_metrics(run_dir),
        "metrics_stale_minutes": stale_minutes(run_dir) if status == "running" else None,
        "history": history(st),
        "sources": {
            "status": status_source,
            "reason": status_source,
            "slurm_state": slurm_source,
            "slurm_reason": "scontrol" if fields else None,
            "requeues": "events",
            "failures": "events",
            "history": "events",
            "result": "manifest" if result else None,
            "last_metrics": "metrics.jsonl",
        },
    }


def history(st: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per run of the job, as the job booked it: hangs the watchdog caught,
    failures retried and why, requeues asked for (signal, exit 85) or done by SLURM."""
    return [
        {
            "job_id": run.get("job_id"),
            "restart": run.get("restart"),
            "started_at": run.get("started_at"),
            "ended_at": run.get("ended_at"),
            "outcome": run.get("outcome") or "running",
            "reason": run.get("reason"),
        }
        for run in st.get("runs", [])
    ]


STALE_METRICS_MINUTES = 5


def stale_minutes(run_dir: Path) -> int | None:
    """Minutes since metrics.jsonl last grew, when that is STALE_METRICS_MINUTES or more
    (a running stage that logs nothing for so long may be hung)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    minutes = int((time.time() - path.stat().st_mtime) // 60)
    return minutes if minutes >= STALE_METRICS_MINUTES else None


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


def choose_stage(path: Path, name: str | None) -> Path:
    """The run dir to show: ``path`` itself, or one stage of the pipeline in ``path``
    (``name``, else the last stage that has started)."""
    stages = pipeline_stages(path)
    if stages is None:
        if name is not None:
            raise InputError(f"{path} is a single run, not a pipeline; leave out --stage")
        return path
    if name is not None:
        match = next((s for s in stages if s["name"] == name), None)
        if match is None:
            raise InputError(
                f"{path} has no stage {name!r}",
                hint=f"its stages: {', '.join(s['name'] for s in stages)}",
            )
        return Path(match["run_dir"])
    started = [
        s
        for s in stages
        if state.events_path(s["run_dir"]).exists() and state.read_state(s["run_dir"])["runs"]
    ]
    return Path((started or stages)[-1 if started else 0]["run_dir"])


def log_paths(run_dir: str | Path, job_id: str | None = None) -> tuple[Path, Path]:
    run_dir = Path(run_dir)
    if job_id is None:
        st = state.read_state(run_dir)
        job_id = st["job_id"]
        if job_id is None:
            raise InputError(
                f"{run_dir} has no job to show logs of ({st['status']}: {st['reason']})"
            )
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
    wait_seconds: float = 60.0,
) -> None:
    """Copy the job's stdout log to ``out`` and its stderr log to ``err``; with ``follow``,
    keep copying until the run is over (a final status, or SLURM no longer runs the job).
    A job that has not started, about which SLURM has not answered for ``wait_seconds``,
    is given up on with an error."""
    out_stream: TextIO = out or sys.stdout
    err_stream: TextIO = err or sys.stderr
    out_path, err_path = log_paths(run_dir, job_id)
    offsets = {out_path: 0, err_path: 0}
    unanswered_since: float | None = None
    while True:
        try:
            over = not follow or _job_over(run_dir)  # checked before reading: nothing is missed
            unanswered_since = None
        except slurmcli.SlurmUnavailable as exc:
            over = False
            unanswered_since = unanswered_since or time.monotonic()
            waited = time.monotonic() - unanswered_since
            if waited >= wait_seconds and not state.read_state(run_dir)["runs"]:
                raise PtError(
                    f"{run_dir}: the job has not started, and SLURM has not answered for "
                    f"{waited:.0f} s ({exc.message}); stopped following",
                    hint="follow it again once the controller answers (check with: squeue --me)",
                ) from None
        for path, stream in ((out_path, out_stream), (err_path, err_stream)):
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
    """Whether the run is over; raises :class:`slurmcli.SlurmUnavailable` when that turns
    on SLURM and SLURM does not answer."""
    st = state.read_state(run_dir)
    if st["status"] in state.FINAL_STATUSES or st["job_id"] is None:
        return True
    # A job killed outright (SIGKILL, a dependency that failed) never books its end.
    return not slurmcli.is_active(slurmcli.job_fields(st["job_id"]).get("JobState"))


def cancel(path: str | Path) -> dict[str, Any]:
    """Cancel the run's job (every open stage of a pipeline); it will not requeue itself.
    A run that has ended is left as it is."""
    path = Path(path)
    stages = pipeline_stages(path)
    if stages is None:
        return cancel_stage(path)
    # The last stage first: cancelling a stage makes SLURM cancel the stages after it
    # (their dependency can no longer be met) before pt-slurm could mark them.
    infos = [
        {"name": s["name"], **cancel_stage(Path(s["run_dir"]))}
        if state.events_path(s["run_dir"]).exists()
        else {"name": s["name"], "job_id": None, "status": "not submitted", "cancelled": False,
              "message": "nothing to cancel: not submitted"}
        for s in reversed(stages)
    ][::-1]  # fmt: skip
    return {"kind": "job", "path": path, "job_id": infos[-1]["job_id"], "stages": infos}


def cancel_stage(run_dir: Path) -> dict[str, Any]:
    st = state.read_state(run_dir)
    out = {"kind": "job", "path": run_dir, "job_id": st["job_id"], "status": st["status"]}
    if st["status"] in state.FINAL_STATUSES or st["job_id"] is None:
        why = st["reason"] or "no job was submitted"
        return {**out, "cancelled": False, "message": f"nothing to cancel: {st['status']} ({why})"}
    job_state = slurmcli.job_fields(st["job_id"]).get("JobState")
    if not slurmcli.is_active(job_state):
        return {
            **out,
            "cancelled": False,
            "message": f"nothing to cancel: SLURM no longer runs job {st['job_id']} "
            f"({job_state or 'forgotten'})",
        }
    if not state.mark_cancelled_unless_final(run_dir):
        st = state.read_state(run_dir)
        return {**out, "status": st["status"], "cancelled": False, "message": "it just ended"}
    slurmcli.scancel(st["job_id"])
    return {**out, "status": "cancelled", "cancelled": True}
