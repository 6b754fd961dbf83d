"""A pipeline never half-runs and its status never lies, on the real local SLURM: its
stages are submitted held and released together, so none runs when sbatch refuses a
later one; cancel marks every stage; a stage behind one that ended unfinished reads
"will not run"; and a job SLURM ended or forgot without its end being booked takes
SLURM's word, with the source of each field named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pt_slurm import state

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def pipeline(tmp_path: Path, standin, stages: list[dict], **slurm) -> Path:
    """A pipeline of stand-in stages, each ``{"name": ..., "standin": {...}, "slurm": {...}}``."""
    specs = []
    for spec in stages:
        config = standin.config(tmp_path, spec["name"], spec.get("standin", {}))
        specs.append(
            {
                "name": spec["name"],
                "stage": "data",
                "config": str(config),
                "slurm": {"job_name": f"{tmp_path.name}-{spec['name']}", **spec.get("slurm", {})},
            }
        )
    path = tmp_path / "pipeline.yaml"
    spec = {"name": "p", "output_dir": str(tmp_path / "runs"), "slurm": slurm, "stages": specs}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def stage_states(cli, root: Path) -> dict[str, tuple]:
    info = json.loads(cli("pt-slurm", "status", root).stdout)
    return {s["name"]: (s["status"], s["slurm_state"]) for s in info["stages"]}


def test_when_a_later_stage_cannot_be_submitted_none_of_the_pipeline_runs(
    slurm_cluster, tmp_path, cli, standin
):
    """sbatch refuses the second stage (no such partition), three seconds after it took the
    first (a slow controller): the first was held, so it is cancelled before it ran, and
    status says what became of each stage."""
    path = pipeline(
        tmp_path,
        standin,
        [
            {"name": "first"},
            {"name": "second", "slurm": {"partition": "nosuch"}},
            {"name": "third"},
        ],
    )
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sbatch").write_text(
        f'#!/bin/bash\ncase "$*" in *second*) sleep 3 ;; esac\nexec {_which("sbatch")} "$@"\n'
    )
    (shim / "sbatch").chmod(0o755)
    proc = cli(
        "pt-slurm", "submit", path, check=False, env={"PATH": f"{shim}:{os.environ['PATH']}"}
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    said = " ".join(proc.stderr.split())
    assert "sbatch of stage 'second' failed" in said
    assert "were held, and were cancelled before they ran" in said

    root = tmp_path / "runs" / "p"
    first = state.read_state(root / "first")
    slurm_cluster.wait_until(
        lambda: slurm_cluster.job(first["job_id"]).get("JobState") == "CANCELLED",
        "SLURM to cancel the first stage",
    )
    assert first["runs"] == [] and not (root / "first" / "starts").exists()  # it never ran
    assert stage_states(cli, root) == {
        "first": ("cancelled", "CANCELLED"),
        "second": ("failed", None),
        "third": ("not submitted", None),
    }
    assert first["reason"] == "sbatch of stage 'second' failed; cancelled before it ran"


def test_a_pipeline_that_sbatch_accepts_is_released_and_runs(slurm_cluster, tmp_path, cli, standin):
    """Held at submission, the stages are released together: both run and complete."""
    path = pipeline(tmp_path, standin, [{"name": "one"}, {"name": "two"}])
    manifest = json.loads(cli("pt-slurm", "submit", path).stdout)
    for stage in manifest["stages"]:
        slurm_cluster.wait_final(stage["job_id"], stage["path"])
    assert stage_states(cli, Path(manifest["path"])) == {
        "one": ("completed", "COMPLETED"),
        "two": ("completed", "COMPLETED"),
    }


def test_cancel_of_a_pending_pipeline_marks_every_stage(slurm_cluster, tmp_path, cli, standin):
    """Every stage pending (the first held back by --begin, the others by their
    dependency): cancel cancels the last stage first, so SLURM never cancels one of them
    before pt-slurm has marked it."""
    path = pipeline(
        tmp_path,
        standin,
        [{"name": "a"}, {"name": "b"}, {"name": "c"}],
        extra_sbatch=["--begin=now+600"],
    )
    root = Path(json.loads(cli("pt-slurm", "submit", path).stdout)["path"])
    proc = cli("pt-slurm", "cancel", root)
    assert [s["cancelled"] for s in json.loads(proc.stdout)["stages"]] == [True, True, True]
    assert stage_states(cli, root) == dict.fromkeys("abc", ("cancelled", "CANCELLED"))
    for name in "abc":
        assert state.read_state(root / name)["reason"] == "cancelled with pt-slurm cancel"


def test_a_stage_behind_a_failed_stage_reads_will_not_run(slurm_cluster, tmp_path, cli, standin):
    """The first stage fails for good (its one allowed failure): SLURM cancels the stages
    waiting on it, which never start; status says why, naming the stage that failed."""
    path = pipeline(
        tmp_path,
        standin,
        [
            {"name": "build", "standin": {"fail_first": 9}, "slurm": {"max_failures": 1}},
            {"name": "train"},
            {"name": "eval"},
        ],
    )
    manifest = json.loads(cli("pt-slurm", "submit", path).stdout)
    root = Path(manifest["path"])
    jobs = {s["name"]: s["job_id"] for s in manifest["stages"]}
    slurm_cluster.wait_final(jobs["build"], root / "build")
    proc = cli("pt-slurm", "status", root)
    info = json.loads(proc.stdout)
    assert info["status"] == "failed"
    stages = {s["name"]: s for s in info["stages"]}
    for name in ("train", "eval"):
        assert stages[name]["status"] == "will not run"
        assert stages[name]["reason"] == "will not run: stage build failed"
        assert stages[name]["recorded_status"] == "submitted"  # the job never booked a start
        assert stages[name]["sources"]["status"] == "pipeline"
    assert "will not run: stage build failed" in proc.stderr


def test_a_pipeline_cancelled_with_plain_scancel_does_not_read_submitted(
    slurm_cluster, tmp_path, cli, standin
):
    """scancel of the first stage while every stage is pending: no job ever started to
    book an end, so the first stage takes SLURM's CANCELLED (scontrol, said so in
    sources) and the others will not run."""
    path = pipeline(
        tmp_path, standin, [{"name": "a"}, {"name": "b"}], extra_sbatch=["--begin=now+600"]
    )
    manifest = json.loads(cli("pt-slurm", "submit", path).stdout)
    root = Path(manifest["path"])
    subprocess.run(["scancel", manifest["stages"][0]["job_id"]], check=True)
    slurm_cluster.wait_until(
        lambda: slurm_cluster.job(manifest["stages"][0]["job_id"]).get("JobState") == "CANCELLED",
        "SLURM to cancel the first stage",
    )
    info = json.loads(cli("pt-slurm", "status", root).stdout)
    assert info["status"] == "cancelled"
    a, b = info["stages"]
    assert (a["status"], a["recorded_status"]) == ("cancelled", "submitted")
    assert (a["sources"]["status"], a["sources"]["slurm_state"]) == ("scontrol", "scontrol")
    assert a["sources"]["requeues"] == "events"  # what SLURM cannot know stays the events' word
    assert "booked no end" in a["reason"]
    assert (b["status"], b["reason"]) == ("will not run", "will not run: stage a cancelled")


def test_a_job_slurm_has_forgotten_reads_unknown_not_submitted(slurm_cluster, tmp_path, cli):
    """A job id SLURM no longer knows (it forgets ended jobs after MinJobAge; this cluster
    has no accounting for sacct to fall back on): the run's recorded "submitted" is
    not repeated as if the job were waiting."""
    run_dir = tmp_path / "gone"
    state.begin_submission(run_dir, stage="data", max_failures=3, max_requeues=5, job_name="g")
    state.record_job_id(run_dir, "987654")
    proc = cli("pt-slurm", "status", run_dir)
    info = json.loads(proc.stdout)
    assert (info["status"], info["recorded_status"], info["slurm_forgot"]) == (
        "unknown",
        "submitted",
        True,
    )
    assert "SLURM no longer knows job 987654" in info["reason"]
    assert "job 987654: unknown (SLURM: no longer knows the job)" in proc.stderr


def _which(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} not on PATH"
    return found
