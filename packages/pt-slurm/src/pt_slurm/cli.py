"""`pt-slurm`: Render, submit and watch self-requeueing SLURM jobs.

    pt-slurm submit train.yaml slurm.nodes=2 slurm.time=04:00:00
    pt-slurm submit train.yaml --dry-run          # print the script, submit nothing
    pt-slurm submit pipeline.yaml                 # stages chained with afterok
    pt-slurm status runs/sft-8b
    pt-slurm logs runs/sft-8b -f
    pt-slurm cancel runs/sft-8b

This module only parses arguments and calls library functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from pt_core.cli import make_app, make_main, split_overrides
from pt_core.log import console
from pt_core.manifest import emit_manifest
from pt_slurm import __version__

app = make_app("pt-slurm", "Render, submit and watch self-requeueing SLURM jobs.", __version__)


def _flag(name: str, help: str, *short: str) -> Any:
    """An on/off flag that takes no value (shown without a type, so that no one writes
    `--dry-run true` and has `true` read as an override)."""
    return typer.Option(False, name, *short, metavar="", help=help)


@app.command()
def submit(
    config: Path = typer.Argument(
        ..., help="Run config (YAML) with a slurm: section, or a pipeline file (stages:)."
    ),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides."),
    stage: list[str] = typer.Option(
        None,
        "--stage",
        help="data, train, rollout or eval (default: train); repeat it to chain stages of "
        "this config, each after the one before.",
    ),
    dry_run: bool = _flag(
        "--dry-run", "Print the sbatch script(s) on stdout; write and submit nothing."
    ),
    force: bool = _flag("--force", "Replace a frozen config.yaml whose values differ."),
) -> None:
    """Check each stage's config at the job's world size, freeze it into the run dir,
    write slurm/job.sh and sbatch it; print the job manifest."""
    from pt_slurm.submit import dry_run_text, prepare
    from pt_slurm.submit import submit as submit_run

    overrides = split_overrides(overrides)
    if dry_run:
        rendered, _root = prepare(config, overrides, list(stage or []))
        typer.echo(dry_run_text(rendered), nl=False)
        return
    manifest = submit_run(config, overrides, stages=list(stage or []), force=force)
    for item in manifest.get("stages", []):
        console.print(
            f"submitted job {item['job_id']}: stage {item['name']} in {item['path']}",
            soft_wrap=True,
        )
    if "stages" not in manifest:
        console.print(f"submitted job {manifest['job_id']}: {manifest['path']}", soft_wrap=True)
    emit_manifest(**manifest)


def _describe(info: dict) -> str:
    if info["slurm_error"]:
        slurm = "unknown: " + info["slurm_error"]
    elif info["slurm_forgot"]:
        slurm = "no longer knows the job"
    else:
        slurm = info["slurm_state"] or "unknown"
        if info["sources"]["slurm_state"] == "sacct":
            slurm += " in sacct"
    if info["slurm_reason"]:
        slurm += f", reason {info['slurm_reason']}"
    limits = ""
    if info["max_failures"] is not None:
        limits = (
            f", {info['requeues']} requeue(s) of at most {info['max_requeues']}, "
            f"{info['failures']} failure(s) of {info['max_failures']} allowed"
        )
    return f"job {info['job_id'] or '-'}: {info['status']} (SLURM: {slurm}){limits}"


@app.command()
def status(
    path: Path = typer.Argument(..., help="Run directory, or a pipeline's directory."),
) -> None:
    """The run's state (checked against SLURM's), job id, SLURM's state and reason,
    requeues, failures, each run of the job and the last metrics line; for a pipeline,
    the same per stage."""
    from pt_slurm.submit import status as run_status

    info = run_status(path)
    for item in info.get("stages", [info]):
        head = f"{item['name']}: " if "stages" in info else ""
        console.print(head + _describe(item), highlight=False)
        if item["reason"]:
            console.print(f"  {item['reason']}", highlight=False, soft_wrap=True)
        if item["result"]:
            console.print(f"  result: {item['result']}", highlight=False, soft_wrap=True)
        for run in item["history"]:
            console.print(
                f"  run {run['restart']} of job {run['job_id']}: {run['outcome']}"
                + (f": {run['reason']}" if run["reason"] else ""),
                highlight=False,
            )
        if item["last_metrics"]:
            console.print(
                f"  last metrics: {item['last_metrics']}", highlight=False, soft_wrap=True
            )
        if item["metrics_stale_minutes"]:
            console.print(
                f"  metrics stale: no step for {item['metrics_stale_minutes']} minutes "
                "(a hang? see the watchdog: training.watchdog_minutes)",
                highlight=False,
            )
    emit_manifest(**info)


@app.command()
def logs(
    path: Path = typer.Argument(..., help="Run directory, or a pipeline's directory."),
    follow: bool = _flag("--follow", "Keep printing until the run ends.", "-f"),
    job: str = typer.Option(None, "--job", help="Job id (default: the latest)."),
    stage: str = typer.Option(
        None, "--stage", help="A pipeline's stage (default: the last one that started)."
    ),
    wait: float = typer.Option(
        60.0,
        "--wait",
        min=0,
        help="With -f: seconds to wait for a SLURM controller that does not answer about a "
        "job that has not started, before giving up.",
    ),
) -> None:
    """The job's logs: slurm-<id>.out on stdout, slurm-<id>.err on stderr; every line of
    the step starts with its node's number ("0: ")."""
    from pt_slurm.submit import choose_stage, follow_logs

    follow_logs(choose_stage(path, stage), follow=follow, job_id=job, wait_seconds=wait)


@app.command()
def cancel(
    path: Path = typer.Argument(..., help="Run directory, or a pipeline's directory."),
) -> None:
    """Cancel the run's job (every open stage of a pipeline); it will not requeue itself.
    A run that has ended keeps its status."""
    from pt_slurm.submit import cancel as cancel_run

    result = cancel_run(path)
    for item in result.get("stages", [result]):
        head = f"{item['name']}: " if "stages" in result else ""
        if item["cancelled"]:
            console.print(f"{head}cancelled job {item['job_id']}", highlight=False, soft_wrap=True)
        else:
            console.print(f"{head}{item['message']}", highlight=False, soft_wrap=True)
    emit_manifest(**result)


main = make_main(app)

if __name__ == "__main__":
    main()
