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
    """sbatch each stage, each after the one before it; on a failure, cancel the ones
    already submitted, so that no half of a pipeline runs."""
    job_ids: dict[str, str] = {}
    previous: str | None = None
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
            job_id = slurmcli.sbatch(scripts[stage.name], after=previous)
        except PtError as exc:
            state.record_sbatch_failed(stage.run_dir, exc.message)
            for earlier in stages[: len(job_ids)]:
                state.mark_cancelled(earlier.run_dir)
                with contextlib.suppress(PtError):
                    slurmcli.scancel(job_ids[earlier.name])
            if job_ids:
                raise PtError(
                    f"sbatch of stage {stage.name!r} failed: {exc.message}; the stage(s) "
                    f"submitted before it ({', '.join(job_ids)}) were cancelled",
                    hint=exc.hint,
                ) from None
            raise
        state.record_job_id(stage.run_dir, job_id)
        job_ids[stage.name] = job_id
        previous = job_id
    return job_ids


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
    infos = [{"name": s["name"], **stage_status(Path(s["run_dir"]), s)} for s in stages]
    first_open = next((i for i in infos if i["status"] != "completed"), None)
    return {
        "kind": "job",
        "path": path,
        "job_id": infos[-1]["job_id"],
        "status": first_open["status"] if first_open else "completed",
        "stages": infos,
    }


def stage_status(run_dir: Path, stage: dict | None = None) -> dict[str, Any]:
    """One run's status; ``stage``: its record in a pipeline, whose later stages have no
    events when an earlier stage's sbatch failed."""
    if stage is not None and not state.events_path(run_dir).exists():
        st = {"job_id": None, "status": "not submitted", "stage": stage.get("stage")}
        st["reason"] = "a stage before it was not submitted"
    else:
        st = state.read_state(run_dir)
    fields: dict[str, str] = {}
    slurm_error = None
    if st["job_id"] and slurmcli.available():
        try:
            fields = slurmcli.job_fields(st["job_id"])
        except slurmcli.SlurmUnavailable as exc:
            slurm_error = exc.message
    reason = fields.get("Reason")
    result = None
    if state.manifest_path(run_dir).exists() and st["status"] == "completed":
        with contextlib.suppress(ValueError, KeyError, TypeError):
            result = json.loads(state.manifest_path(run_dir).read_text())["path"]
    return {
        "kind": "job",
        "path": run_dir,
        "job_id": st["job_id"],
        "status": st["status"],
        "slurm_state": fields.get("JobState"),
        "slurm_reason": reason if reason not in (None, "None") else None,
        "slurm_error": slurm_error,
        "stage": st.get("stage"),
        "requeues": st.get("requeues", 0),
        "max_requeues": st.get("max_requeues"),
        "failures": st.get("failures", 0),
        "max_failures": st.get("max_failures"),
        "reason": st.get("reason"),
        "result": result,
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
    if st["status"] in state.FINAL_STATUSES or st["job_id"] is None:
        return True
    if not slurmcli.available():
        return False
    # A job killed outright (SIGKILL, a dependency that failed) never books its end.
    try:
        return not slurmcli.is_active(slurmcli.job_fields(st["job_id"]).get("JobState"))
    except slurmcli.SlurmUnavailable:
        return False


def cancel(path: str | Path) -> dict[str, Any]:
    """Cancel the run's job (every open stage of a pipeline); it will not requeue itself.
    A run that has ended is left as it is."""
    path = Path(path)
    stages = pipeline_stages(path)
    if stages is None:
        return cancel_stage(path)
    infos = [
        {"name": s["name"], **cancel_stage(Path(s["run_dir"]))}
        if state.events_path(s["run_dir"]).exists()
        else {"name": s["name"], "job_id": None, "status": "not submitted", "cancelled": False,
              "message": "nothing to cancel: not submitted"}
        for s in stages
    ]  # fmt: skip
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
