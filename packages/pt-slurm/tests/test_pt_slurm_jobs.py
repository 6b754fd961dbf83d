"""The job mechanics on a real local SLURM, with a stand-in stage that counts steps
(tests/standin.py): requeue on the early signal keeps one job id, real failures are
retried up to max_failures, a success resets the count, a cancel is not requeued."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pt_slurm.state import read_state

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_early_signal_checkpoints_requeues_and_resumes_as_one_job(
    slurm_cluster, tmp_path, cli, standin
):
    steps = 40
    config = standin.config(tmp_path, "sig", {"steps": steps, "step_seconds": 0.25})
    manifest = standin.submit(config)
    job_id, run_dir = manifest["job_id"], manifest["path"]
    assert manifest["kind"] == "job" and Path(run_dir) == tmp_path / "runs" / "sig"
    follower = subprocess.Popen(
        [standin.pt_slurm, "logs", run_dir, "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )

    slurm_cluster.wait_until(
        lambda: len(standin.steps(run_dir)) >= 3, "the stand-in to make progress"
    )
    slurm_cluster.signal_batch(job_id, "USR1")  # what --signal=B:USR1@N does before the wall time
    st = slurm_cluster.wait_final(job_id, run_dir)

    # Resumed from its checkpoint: every step done exactly once, in order, to the end.
    assert standin.steps(run_dir) == list(range(1, steps + 1))
    assert st["status"] == "completed" and st["requeues"] == 1 and st["failures"] == 0
    assert st["job_ids"] == [job_id]
    assert [r["outcome"] for r in st["runs"]] == ["requeue", "done"]
    assert st["runs"][0]["signals"] == ["USR1"] and st["runs"][0]["exit_code"] == 85
    assert [r["restart"] for r in st["runs"]] == [0, 1]
    # One job throughout: SLURM knows a single job of this name, requeued once.
    assert slurm_cluster.job_ids_named("sig") == [job_id]
    assert {r["JobId"] for r in slurm_cluster.completions("sig")} == {job_id}
    job = slurm_cluster.job(job_id)
    assert job["JobState"] == "COMPLETED" and job["Restarts"] == "1"
    # Both runs appended to the one log of the job; `pt-slurm logs` shows it (stdout log on
    # stdout, stderr log on stderr).
    logs = cli("pt-slurm", "logs", run_dir)
    assert logs.stdout == (Path(run_dir) / "slurm" / f"slurm-{job_id}.out").read_text()
    assert "start restart=0" in logs.stdout and "start restart=1" in logs.stdout
    assert f"job {job_id} got SIGUSR1" in logs.stderr
    # `logs -f`, started before the job ran, followed it through the requeue and ended with it.
    followed, _ = follower.communicate(timeout=30)
    assert followed.decode() == logs.stdout


def test_failures_are_retried_up_to_max_failures_then_the_job_stops(
    slurm_cluster, tmp_path, cli, standin
):
    config = standin.config(tmp_path, "fail", {"steps": 3, "fail_first": 99}, max_failures=3)
    manifest = standin.submit(config)
    job_id, run_dir = manifest["job_id"], manifest["path"]
    st = slurm_cluster.wait_final(job_id, run_dir)

    assert st["status"] == "failed" and st["failures"] == 3 and st["requeues"] == 0
    assert [r["exit_code"] for r in st["runs"]] == [3, 3, 3]
    assert [r["outcome"] for r in st["runs"]] == ["requeue", "requeue", "stop"]
    assert (Path(run_dir) / "starts").read_text() == "3"  # tried 3 times, not once more
    job = slurm_cluster.job(job_id)
    assert job["JobState"] == "FAILED" and job["Restarts"] == "2"
    assert job["ExitCode"] == "3:0"  # the stage's own exit code, for sacct and the user
    assert slurm_cluster.job_ids_named("fail") == [job_id]

    status = json.loads(cli("pt-slurm", "status", run_dir).stdout)
    assert status["status"] == "failed" and status["failures"] == 3


def test_a_success_resets_the_failure_count(slurm_cluster, tmp_path, cli, standin):
    config = standin.config(tmp_path, "flaky", {"steps": 3, "fail_first": 2}, max_failures=3)
    manifest = standin.submit(config)
    job_id, run_dir = manifest["job_id"], manifest["path"]
    st = slurm_cluster.wait_final(job_id, run_dir)

    # Two failures counted (1, then 2 of 3 allowed), then the third start succeeds.
    assert [r["exit_code"] for r in st["runs"]] == [3, 3, 0]
    assert st["status"] == "completed" and st["failures"] == 0
    assert standin.steps(run_dir) == [1, 2, 3]
    assert slurm_cluster.job(job_id)["JobState"] == "COMPLETED"


def test_cancel_stops_the_job_without_a_requeue(slurm_cluster, tmp_path, cli, standin):
    """The stand-in saves and exits 85 on SIGTERM too; a cancel must still not requeue."""
    config = standin.config(tmp_path, "cancel", {"steps": 400, "step_seconds": 0.25})
    manifest = standin.submit(config)
    job_id, run_dir = manifest["job_id"], manifest["path"]
    slurm_cluster.wait_until(
        lambda: len(standin.steps(run_dir)) >= 2, "the stand-in to make progress"
    )

    # A second job on the same run dir would write the same checkpoints: refused.
    again = cli("pt-slurm", "submit", config, check=False)
    assert again.returncode == 2 and f"already has job {job_id}" in again.stderr

    out = json.loads(cli("pt-slurm", "cancel", run_dir).stdout)
    assert out["status"] == "cancelled" and out["job_id"] == job_id
    st = slurm_cluster.wait_final(job_id, run_dir)

    assert st["status"] == "cancelled" and st["requeues"] == 0
    assert len(st["runs"]) == 1 and st["runs"][0]["outcome"] == "stop"
    assert slurm_cluster.job(job_id)["JobState"] == "CANCELLED"
    assert slurm_cluster.job(job_id)["Restarts"] == "0"


def test_a_signal_before_the_step_starts_requeues_without_starting_it(
    slurm_cluster, tmp_path, cli, standin
):
    """The traps are set first thing: a USR1 while the environment is being set up
    (here a slow setup line) requeues the job instead of killing the batch shell. Nothing
    was saved, so the requeue counts as a failure (1 of 3), not as progress."""
    config = standin.config(
        tmp_path, "early", {"steps": 3}, setup=["echo setting-up >&2", "sleep 3"]
    )
    manifest = standin.submit(config)
    job_id, run_dir = manifest["job_id"], manifest["path"]
    err = Path(run_dir) / "slurm" / f"slurm-{job_id}.err"
    slurm_cluster.wait_until(
        lambda: err.exists() and "setting-up" in err.read_text(), "the setup to begin"
    )
    slurm_cluster.signal_batch(job_id, "USR1")
    st = slurm_cluster.wait_final(job_id, run_dir)

    assert [r["outcome"] for r in st["runs"]] == ["requeue", "done"]
    first = st["runs"][0]
    assert first["phase"] == "setup" and first["signals"] == ["USR1"]
    assert "without progress" in first["reason"] and "failure 1 of 3" in first["reason"]
    assert (Path(run_dir) / "starts").read_text() == "1"  # the stage ran once, after the requeue
    assert st["status"] == "completed" and slurm_cluster.job(job_id)["Restarts"] == "1"
    assert st["failures"] == 0  # the run that finished reset the count


def test_wall_time_signal_requeues_before_the_limit(slurm_cluster, tmp_path, cli, standin):
    """The real path: SLURM itself sends SIGUSR1 signal_seconds before --time runs out.
    (SLURM checks limits about every 30 s, so the run is given a 2-minute limit and
    the signal 100 s before it.)"""
    config = standin.config(
        tmp_path,
        "walltime",
        {"steps": 2000, "step_seconds": 0.25},
        time="2",
        signal_seconds=100,
        max_failures=1,
    )
    manifest = standin.submit(config)
    job_id, run_dir = manifest["job_id"], manifest["path"]
    st = slurm_cluster.wait_until(
        lambda: (s := read_state(run_dir))["requeues"] >= 1 and s["status"] == "running" and s,
        "the job to be signalled and started again",
        timeout=150,
    )
    assert st["runs"][0]["signals"] == ["USR1"] and st["runs"][0]["outcome"] == "requeue"
    assert st["job_ids"] == [job_id] and st["failures"] == 0
    done = standin.steps(run_dir)
    assert done == list(range(1, len(done) + 1))  # resumed after the checkpoint, no step twice
    cli("pt-slurm", "cancel", run_dir)
    slurm_cluster.wait_final(job_id, run_dir)
    assert slurm_cluster.job_ids_named("walltime") == [job_id]
