"""`pt-slurm`: Render, submit and watch self-requeueing SLURM jobs.

    pt-slurm submit train.yaml slurm.nodes=2 slurm.time=04:00:00
    pt-slurm submit train.yaml --dry-run          # print the script, submit nothing
    pt-slurm status runs/sft-8b
    pt-slurm logs runs/sft-8b -f
    pt-slurm cancel runs/sft-8b

This module only parses arguments and calls library functions.
"""

from __future__ import annotations

from pathlib import Path

import typer

from pt_core.cli import make_app, make_main, split_overrides
from pt_core.log import console
from pt_core.manifest import emit_manifest
from pt_slurm import __version__

app = make_app("pt-slurm", "Render, submit and watch self-requeueing SLURM jobs.", __version__)


@app.command()
def submit(
    config: Path = typer.Argument(..., help="Run config (YAML) with a slurm: section."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides."),
    stage: str = typer.Option("train", "--stage", help="train, rollout or eval."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the sbatch script on stdout; write and submit nothing."
    ),
    force: bool = typer.Option(
        False, "--force", help="Replace a frozen config.yaml whose values differ."
    ),
) -> None:
    """Freeze the config into the run dir, write slurm/job.sh and sbatch it; print the
    job manifest."""
    from pt_slurm.submit import prepare
    from pt_slurm.submit import submit as submit_run

    overrides = split_overrides(overrides)
    if dry_run:
        _run, _run_dir, script, _data = prepare(config, overrides, stage=stage)
        typer.echo(script, nl=False)
        return
    manifest = submit_run(config, overrides, stage=stage, force=force)
    console.print(f"submitted job {manifest['job_id']}: {manifest['path']}")
    emit_manifest(**manifest)


@app.command()
def status(run_dir: Path = typer.Argument(..., help="Run directory.")) -> None:
    """The run's state, job id, requeues, failures and last metrics line."""
    from pt_slurm.submit import status as run_status

    info = run_status(run_dir)
    console.print(
        f"job {info['job_id']}: {info['status']} (SLURM: {info['slurm_state'] or 'unknown'}), "
        f"{info['requeues']} requeue(s), {info['failures']} failure(s) of "
        f"{info['max_failures']} allowed"
    )
    if info["reason"]:
        console.print(f"  {info['reason']}", highlight=False)
    if info["last_metrics"]:
        console.print(f"  last metrics: {info['last_metrics']}", highlight=False)
    emit_manifest(**info)


@app.command()
def logs(
    run_dir: Path = typer.Argument(..., help="Run directory."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the run ends."),
    job: str = typer.Option(None, "--job", help="Job id (default: the latest)."),
) -> None:
    """The job's logs: slurm-<id>.out on stdout, slurm-<id>.err on stderr."""
    from pt_slurm.submit import follow_logs

    follow_logs(run_dir, follow=follow, job_id=job)


@app.command()
def cancel(run_dir: Path = typer.Argument(..., help="Run directory.")) -> None:
    """Cancel the run's job; it will not requeue itself."""
    from pt_slurm.submit import cancel as cancel_run

    emit_manifest(**cancel_run(run_dir))


@app.command("job-event", hidden=True)
def job_event(
    event: str = typer.Argument(..., help="start, end or requeue-failed"),
    run_dir: Path = typer.Argument(...),
    exit_code: int = typer.Option(0, "--exit-code"),
    signals: str = typer.Option("", "--signals", help="Comma-separated, e.g. USR1,TERM."),
    message: str = typer.Option("", "--message"),
) -> None:
    """Bookkeeping called by job.sh; `end` prints what the script does next."""
    import os

    from pt_slurm import state

    if event == "start":
        state.record_start(
            run_dir,
            job_id=os.environ.get("SLURM_JOB_ID", "?"),
            restart=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
            nodes=os.environ.get("SLURM_JOB_NODELIST"),
        )
    elif event == "end":
        sigs = [s for s in signals.split(",") if s]
        typer.echo(state.record_end(run_dir, exit_code=exit_code, signals=sigs))
    elif event == "requeue-failed":
        state.record_requeue_refused(run_dir, message)
    else:
        raise typer.BadParameter(f"unknown event {event!r}")


main = make_main(app)

if __name__ == "__main__":
    main()
