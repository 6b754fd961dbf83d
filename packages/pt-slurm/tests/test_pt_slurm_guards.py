"""No double jobs, no endless loops, honest states, on the real local SLURM: concurrent
submits give one job, a check SLURM cannot answer refuses, requeues are bounded and need
progress, a failed setup is a counted failure, a step is finished only when the stage says
so (its manifest), a node set down is booked as such, a finished run stays finished when
cancelled, and a pending job shows SLURM's reason."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pt_slurm.state import events_path, read_state

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

UNSET = "PT_TEST_UNSET_VARIABLE"

# Jobs that end by themselves in a few runs each, submitted together (the cluster runs
# four at once) and checked one by one below.
BATCH = {
    # exits 85 at once, saving nothing, every time
    "stuck": ({"requeue_first": 99}, {"max_failures": 2}),
    # saves a step and asks for a requeue every time: progress, but without end
    "endless": ({"save_and_requeue": 99}, {"max_requeues": 2}),
    "unset": (
        {"steps": 2},
        {"max_failures": 1, "setup": ["echo setting-up >&2", f"echo ${UNSET}"]},
    ),
    "module": ({"steps": 2}, {"max_failures": 2, "modules": ["no-such-module/1.0"]}),
    # exits 0 without its manifest once (what a step on a failed node can look like)
    "nomanifest": ({"steps": 2, "exit_zero_first": 1}, {}),
    "finished": ({"steps": 2}, {}),
    # an eval stage (no progress file of its own) that exits 85 at once, every time
    "eval85": ({"requeue_first": 99}, {"max_failures": 2, "progress": None}, "eval"),
}


@pytest.fixture(scope="module")
def batch(slurm_cluster, tmp_path_factory, standin):
    root = tmp_path_factory.mktemp("guards")
    env = {k: v for k, v in os.environ.items() if k != UNSET}
    jobs = {}
    for name, (options, slurm, *stage) in BATCH.items():
        config = standin.config(root, name, options, **slurm)
        jobs[name] = standin.submit(config, *(["--stage", *stage] if stage else []), env=env)
    for manifest in jobs.values():
        slurm_cluster.wait_final(manifest["job_id"], manifest["path"])
    return {name: (m["job_id"], Path(m["path"])) for name, m in jobs.items()}


def test_a_stage_that_always_asks_for_a_requeue_without_progress_stops(batch, slurm_cluster):
    """Each exit 85 with the checkpoint unchanged since the run started is a failure:
    max_failures=2 runs, then a clear stop, not Restarts rising without end."""
    job_id, run_dir = batch["stuck"]
    st = read_state(run_dir)
    assert st["status"] == "failed" and st["failures"] == 2 and st["requeues"] == 0
    assert [r["exit_code"] for r in st["runs"]] == [85, 85]
    assert [r["outcome"] for r in st["runs"]] == ["requeue", "stop"]
    assert st["reason"] == (
        "exit 85 without progress (checkpoint still absent): failure 2 of 2, giving up"
    )
    job = slurm_cluster.job(job_id)
    assert job["JobState"] == "FAILED" and job["Restarts"] == "1"


def test_a_requeue_asked_by_a_stage_without_a_progress_file_is_a_failure(batch):
    """Not only train stages: an eval stage that always exits 85 saves nothing anyone can
    see, so each run is a failure and it stops after max_failures=2, not 50 requeues."""
    _job_id, run_dir = batch["eval85"]
    st = read_state(run_dir)
    assert (st["stage"], st["status"], st["failures"], st["requeues"]) == ("eval", "failed", 2, 0)
    assert [r["exit_code"] for r in st["runs"]] == [85, 85]
    assert "without a progress file" in st["reason"]


def test_requeues_are_bounded_even_when_each_makes_progress(batch, slurm_cluster):
    """max_requeues=2: two requeues, and the third asked for stops the job."""
    job_id, run_dir = batch["endless"]
    st = read_state(run_dir)
    assert st["status"] == "failed" and st["requeues"] == 2 and st["failures"] == 0
    assert [r["outcome"] for r in st["runs"]] == ["requeue", "requeue", "stop"]
    assert "requeued 2 times (max_requeues=2): giving up" in st["reason"]
    assert (run_dir / "checkpoint").read_text() == "3"  # one step saved by each of 3 runs
    assert slurm_cluster.job(job_id)["Restarts"] == "2"


def test_an_unset_variable_in_the_setup_is_a_counted_failure_named_in_the_log(batch):
    job_id, run_dir = batch["unset"]
    st = read_state(run_dir)
    assert st["status"] == "failed" and st["failures"] == 1
    (run,) = st["runs"]
    assert run["phase"] == "setup" and run["outcome"] == "stop"
    assert run["reason"] == f"setup failed (exit 1) at: echo ${UNSET}: failure 1 of 1, giving up"
    err = (run_dir / "slurm" / f"slurm-{job_id}.err").read_text()
    assert "setting-up" in err  # the lines before it ran
    assert f"{UNSET}: unbound variable" in err
    assert f"pt-slurm: setup failed (exit 1) at: echo ${UNSET}" in err
    assert not (run_dir / "starts").exists()  # the stage itself never started


def test_a_failed_module_load_is_a_counted_failure_and_retried(batch):
    """This cluster has no module system, so `module` itself fails (127), as a missing
    module makes Lmod's `module load` fail: the job does not run on without it."""
    job_id, run_dir = batch["module"]
    st = read_state(run_dir)
    assert st["status"] == "failed" and st["failures"] == 2
    assert [(r["phase"], r["exit_code"]) for r in st["runs"]] == [("setup", 127)] * 2
    assert "at: module load no-such-module/1.0" in st["reason"]
    assert not (run_dir / "starts").exists()


def test_exit_0_without_the_manifest_is_a_failure_not_a_finish(batch, standin):
    job_id, run_dir = batch["nomanifest"]
    st = read_state(run_dir)
    first, second = st["runs"]
    assert first["exit_code"] == 0 and first["manifest"] is False
    assert first["reason"].startswith("exit 0 without the stage's manifest")
    assert first["outcome"] == "requeue"
    assert second["manifest"] is True and second["outcome"] == "done"
    assert st["status"] == "completed" and standin.steps(run_dir) == [1, 2]
    # the stage's manifest, kept for the stage after it
    manifest = json.loads((run_dir / "slurm" / "manifest.json").read_text())
    assert manifest == {"kind": "checkpoint", "path": str(run_dir), "step": 2}


def test_cancel_of_a_finished_run_keeps_completed(batch, cli):
    job_id, run_dir = batch["finished"]
    proc = cli("pt-slurm", "cancel", run_dir)
    out = json.loads(proc.stdout)
    assert out["status"] == "completed" and out["cancelled"] is False
    assert "nothing to cancel: completed" in proc.stderr
    assert read_state(run_dir)["status"] == "completed"
    assert json.loads(cli("pt-slurm", "status", run_dir).stdout)["status"] == "completed"


def test_twenty_submits_at_once_to_one_run_dir_give_one_job(slurm_cluster, tmp_path, cli, standin):
    config = standin.config(tmp_path, "twenty", {"steps": 400, "step_seconds": 0.25})
    procs = [
        subprocess.Popen(
            [standin.pt_slurm, "submit", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(20)
    ]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    accepted = [json.loads(out) for code, out, _ in results if code == 0]
    assert len(accepted) == 1, [err for _, _, err in results]
    job_id, run_dir = accepted[0]["job_id"], accepted[0]["path"]
    refused = [err for code, _, err in results if code != 0]
    assert len(refused) == 19
    assert all(f"already has job {job_id}" in err for err in refused), refused
    assert slurm_cluster.job_ids_named("twenty") == [job_id]
    events = events_path(run_dir).read_text().splitlines()
    assert sum('"event":"submit"' in x for x in events) == 1  # the refused wrote nothing
    cli("pt-slurm", "cancel", run_dir)
    slurm_cluster.wait_final(job_id, run_dir)


def test_submit_refuses_when_slurm_cannot_say_whether_a_job_is_live(
    slurm_cluster, tmp_path, cli, standin
):
    """The controller does not answer (here: a slurm.conf naming a port nobody listens on):
    the check fails closed, and nothing is written."""
    dead = slurm_cluster.dead_conf(tmp_path / "dead.conf")
    config = standin.config(tmp_path, "dead", {"steps": 2})
    proc = cli("pt-slurm", "submit", config, env={"SLURM_CONF": str(dead)}, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "cannot tell whether" in proc.stderr and "nothing was submitted" in proc.stderr
    assert "Unable to contact slurm controller" in proc.stderr
    run_dir = tmp_path / "runs" / "dead"
    for name in ("config.yaml", "slurm/job.sh", "slurm/events.jsonl"):
        assert not (run_dir / name).exists(), name
    assert slurm_cluster.job_ids_named("dead") == []


def test_status_shows_slurms_reason_for_a_pending_job(slurm_cluster, tmp_path, cli, standin):
    config = standin.config(tmp_path, "later", {"steps": 2}, extra_sbatch=["--begin=now+3600"])
    manifest = standin.submit(config)
    proc = cli("pt-slurm", "status", manifest["path"])
    info = json.loads(proc.stdout)
    assert (info["slurm_state"], info["slurm_reason"]) == ("PENDING", "BeginTime")
    assert f"job {manifest['job_id']}: submitted (SLURM: PENDING, reason BeginTime)" in " ".join(
        proc.stderr.split()
    )
    out = json.loads(cli("pt-slurm", "cancel", manifest["path"]).stdout)
    assert (
        out["cancelled"] is True
        and slurm_cluster.job(manifest["job_id"])["JobState"] == "CANCELLED"
    )


def test_a_node_set_down_is_booked_as_slurms_requeue_and_the_job_resumes(
    slurm_cluster, tmp_path, cli, standin
):
    """A two-node job whose second node is set down: SLURM ends the step (SIGTERM) and
    requeues the job itself. The batch shell books that end (it is not "completed", and
    not a second requeue), and the job then finishes from its checkpoints."""
    if len(slurm_cluster.nodes) < 2:
        pytest.skip("the local cluster has one node (this machine's hostname is localhost)")
    steps = 40
    config = standin.config(
        tmp_path,
        "nodedown",
        {"steps": steps, "step_seconds": 0.25, "per_node": True},
        nodes=2,
        progress="node-0/checkpoint",
    )
    manifest = standin.submit(config)
    job_id, run_dir = manifest["job_id"], Path(manifest["path"])
    slurm_cluster.wait_until(
        lambda: len(standin.steps(run_dir / "node-1")) >= 3, "both nodes to make progress"
    )
    job = slurm_cluster.job(job_id)
    other = next(n for n in slurm_cluster.nodes if n != job["BatchHost"])
    try:
        subprocess.run(
            ["scontrol", "update", f"nodename={other}", "state=down", "reason=pt-slurm-test"],
            check=True,
        )
        st = slurm_cluster.wait_final(job_id, run_dir, timeout=240)
    finally:
        subprocess.run(["scontrol", "update", f"nodename={other}", "state=resume"], check=False)
    first = st["runs"][0]
    assert first["signals"] == ["TERM"] and first["outcome"] == "slurm-requeue"
    assert first["manifest"] is False and "SLURM requeued the job" in first["reason"]
    assert [r["outcome"] for r in st["runs"]] == ["slurm-requeue", "done"]
    assert st["status"] == "completed" and st["job_ids"] == [job_id]
    assert slurm_cluster.job(job_id)["Restarts"] == "1"
    for node in ("node-0", "node-1"):  # every step once on each node, through the requeue
        assert standin.steps(run_dir / node) == list(range(1, steps + 1))
    # the end was booked by the batch shell, though SLURM was ending the job at the time
    err = (run_dir / "slurm" / f"slurm-{job_id}.err").read_text()
    assert "pt-slurm: SLURM requeued the job" in err
