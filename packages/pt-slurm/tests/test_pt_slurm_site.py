"""What a real site throws at a job, where the local SLURM can show it: a launcher that
turns a rank's exit 85/86 into its own exit 1, a rendezvous port already taken, a module
system that a batch shell has not initialised, a controller that stops answering, and a
stage whose metrics stop coming; and what `pt-slurm status` tells of the run's history."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from pt_slurm.state import read_state

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_a_ranks_exit_intent_survives_torchrun(slurm_cluster, tmp_path, cli, standin):
    """Under torchrun a rank's exit 85 (saved, requeue me) and 86 (the hang watchdog
    ended me) both arrive as exit 1; the job books each for what the rank meant, and
    status tells the history."""
    pytest.importorskip("torch.distributed.run", reason="torchrun comes with torch")
    saving = standin.config(
        tmp_path, "saving", {"steps": 3, "save_and_requeue": 1}, launcher="torchrun"
    )
    hung = standin.config(
        tmp_path,
        "hung",
        {},
        launcher="torchrun",
        command="bash -c 'exit 86'",
        completion="exit_code",
        progress=None,
        max_failures=2,
    )
    jobs = [standin.submit(saving), standin.submit(hung)]
    for manifest in jobs:
        slurm_cluster.wait_final(manifest["job_id"], manifest["path"], timeout=300)

    st = read_state(jobs[0]["path"])
    assert st["status"] == "completed" and (st["requeues"], st["failures"]) == (1, 0)
    assert st["runs"][0]["exit_code"] == 1  # torchrun's, not the rank's
    assert st["runs"][0]["reason"].startswith("exit 1 (a rank exited 85): checkpoint now 1,")

    proc = cli("pt-slurm", "status", jobs[1]["path"])
    info = json.loads(proc.stdout)
    assert (info["status"], info["failures"], info["requeues"]) == ("failed", 2, 0)
    assert [run["outcome"] for run in info["history"]] == ["requeue", "stop"]
    for run in info["history"]:
        assert run["reason"].startswith(
            "the hang watchdog ended the step: exit 1 (a rank exited 86)"
        )
    text = " ".join(proc.stderr.split())
    assert f"run 0 of job {jobs[1]['job_id']}: requeue: the hang watchdog ended the step" in text
    assert "failure 2 of 2, giving up" in text


def test_a_taken_rendezvous_port_is_passed_over(slurm_cluster, tmp_path, standin):
    """Something already listens on the port the job id gives: the job takes the next."""
    config = standin.config(
        tmp_path,
        "port",
        {},
        launcher="none",
        command="bash -c 'echo port=$MASTER_PORT'",
        completion="exit_code",
        extra_sbatch=["--hold"],  # released once the port is taken
    )
    manifest = standin.submit(config)
    job_id, run_dir = manifest["job_id"], Path(manifest["path"])
    port = 10000 + int(job_id) % 20000
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("0.0.0.0", port))
        taken.listen()
        subprocess.run(["scontrol", "release", job_id], check=True)
        st = slurm_cluster.wait_final(job_id, run_dir)
    assert st["status"] == "completed"
    log = (run_dir / "slurm" / f"slurm-{job_id}.out").read_text()
    assert re.search(rf"^0: port={port + 1}$", log, re.M), log
    err = (run_dir / "slurm" / f"slurm-{job_id}.err").read_text()
    assert f"port {port} is taken" in err


def test_modules_load_in_a_batch_shell_without_the_module_function(
    slurm_cluster, tmp_path, cli, standin
):
    """A batch shell is no login shell: `module` is undefined until the module system's
    init is sourced (here one found through MODULESHOME, which reads an unset variable,
    as Lmod's does)."""
    home = tmp_path / "modules"
    (home / "init").mkdir(parents=True)
    loaded = tmp_path / "loaded.txt"
    (home / "init" / "bash").write_text(
        ': "$PT_TEST_UNSET_IN_INIT"\n'
        f'module() {{ echo "module $*" >>{loaded}; [ "$2" = pt-test/1.0 ]; }}\n'
    )
    config = standin.config(
        tmp_path,
        "modules",
        {},
        launcher="none",
        command="true",
        completion="exit_code",
        modules=["pt-test/1.0"],
        max_failures=1,
    )
    env = {k: v for k, v in os.environ.items() if k != "PT_TEST_UNSET_IN_INIT"}
    manifest = standin.submit(config, env={**env, "MODULESHOME": str(home)})
    st = slurm_cluster.wait_final(manifest["job_id"], manifest["path"])
    assert st["status"] == "completed", st["reason"]
    assert loaded.read_text() == "module load pt-test/1.0\n"


def test_logs_follow_gives_up_on_a_job_that_never_started_when_slurm_is_silent(
    slurm_cluster, tmp_path, cli, standin
):
    config = standin.config(tmp_path, "silent", {}, extra_sbatch=["--begin=now+3600"])
    manifest = standin.submit(config)
    dead = slurm_cluster.dead_conf(tmp_path / "dead.conf")
    proc = cli(
        "pt-slurm",
        "logs",
        manifest["path"],
        "-f",
        "--wait",
        "2",
        env={"SLURM_CONF": str(dead)},
        check=False,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "the job has not started, and SLURM has not answered for" in " ".join(
        proc.stderr.split()
    )
    cli("pt-slurm", "cancel", manifest["path"])


def test_status_says_when_a_running_stages_metrics_are_stale(slurm_cluster, tmp_path, cli, standin):
    """No metrics line for ten minutes while the job runs: status says so (a hang shows
    as a run whose last step is old, however alive SLURM thinks it is)."""
    config = standin.config(tmp_path, "stale", {"steps": 400, "step_seconds": 0.25})
    manifest = standin.submit(config)
    run_dir = Path(manifest["path"])
    slurm_cluster.wait_until(lambda: standin.steps(run_dir), "the stand-in to start")
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "loss": 2.5}) + "\n")
    ten_minutes_ago = metrics.stat().st_mtime - 600
    os.utime(metrics, (ten_minutes_ago, ten_minutes_ago))
    proc = cli("pt-slurm", "status", run_dir)
    info = json.loads(proc.stdout)
    assert (info["status"], info["metrics_stale_minutes"]) == ("running", 10)
    assert "metrics stale: no step for 10 minutes" in proc.stderr
    cli("pt-slurm", "cancel", run_dir)
    slurm_cluster.wait_final(manifest["job_id"], run_dir)


DOCS = Path(__file__).resolve().parents[3] / "docs" / "pt-slurm.md"


def test_the_site_checks_in_the_docs_pass_on_the_local_cluster(slurm_cluster, tmp_path):
    """Every line of the docs' "Running on a real site" checks, run as a user would."""
    section = DOCS.read_text().split("## Running on a real site\n")[1].split("\n## ")[0]
    lines = section.split("```bash\n")[1].split("```")[0].strip().splitlines()
    assert len(lines) == 5
    said = []
    for line in lines:
        proc = subprocess.run(
            ["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, (line, proc.stderr)
        said.append(proc.stdout)
    assert said[0].count("writable") == 2 and said[1] == "flock works here\n"
    assert said[2].split("\n")[0].endswith("bash")
    assert re.search(r"^JobRequeue\s+= 1$", said[3], re.M)
    assert said[4].startswith("memlock: ")


def test_a_preempted_job_saves_and_is_requeued_once(slurm_cluster, tmp_path, cli, standin):
    """PreemptMode=REQUEUE with GraceTime: a job of the higher partition needs both nodes
    whole; SLURM sends SIGTERM to the step, the stand-in saves and exits 85, and the job
    requeues itself, booked as a preemption. SLURM's own requeue then finds the job
    pending: one restart, not two, and the same job id resumes from its checkpoint."""
    steps = 60
    config = standin.config(tmp_path, "preempted", {"steps": steps, "step_seconds": 0.25})
    manifest = standin.submit(config)
    job_id, run_dir = manifest["job_id"], Path(manifest["path"])
    slurm_cluster.wait_until(lambda: len(standin.steps(run_dir)) >= 3, "the stand-in to step")
    subprocess.run(
        ["sbatch", "-p", "high", "-N2", "--exclusive", "-J", "preemptor", "-o", "/dev/null"]
        + ["--wrap", "sleep 1"],
        check=True,
        capture_output=True,
    )
    st = slurm_cluster.wait_final(job_id, run_dir, timeout=300)
    assert st["status"] == "completed" and (st["requeues"], st["failures"]) == (1, 0)
    first = st["runs"][0]
    assert (first["outcome"], first["exit_code"]) == ("requeue", 85)
    assert first["reason"].startswith("preempted by SLURM, exit 85: checkpoint now ")
    assert standin.steps(run_dir) == list(range(1, steps + 1))  # resumed, no step twice
    assert slurm_cluster.job(job_id)["Restarts"] == "1"
    assert len(slurm_cluster.completions("preempted")) == 2  # the preempted run, the last
    history = json.loads(cli("pt-slurm", "status", run_dir).stdout)["history"]
    assert [run["outcome"] for run in history] == ["requeue", "done"]
