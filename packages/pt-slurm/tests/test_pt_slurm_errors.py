"""Every pt-slurm verb answers a mistake with exit 2 and one line naming it (a fix may
follow on the next line), never a traceback: missing or wrong paths, a directory pt-slurm
did not submit, empty and malformed files, mistyped flags, wrong types, a failed sbatch."""

from __future__ import annotations

import json

import pytest
import yaml


def refused(proc, *words: str) -> str:
    """The command exited 2, printed nothing on stdout, and said what is wrong in one line."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    line = next(x for x in proc.stderr.splitlines() if x.startswith(("error:", "Error:")))
    for word in words:
        assert word in line, (word, line)
    return line


@pytest.mark.parametrize("verb", ["status", "logs", "cancel"])
def test_a_path_that_is_no_run_directory(tmp_path, pt_slurm, verb):
    refused(pt_slurm(verb, tmp_path / "nowhere", check=False), "no such directory")
    refused(pt_slurm(verb, tmp_path, check=False), "is not a run directory of pt-slurm")
    (tmp_path / "file").write_text("x")
    refused(pt_slurm(verb, tmp_path / "file", check=False), "is a file")


@pytest.mark.parametrize(
    "text, words",
    [
        ("", ["holds no events"]),
        ('{"event":"submit"}\n{"event": oops}\n\n', ["events.jsonl:2", "not an event line"]),
    ],
)
@pytest.mark.parametrize("verb", ["status", "logs", "cancel"])
def test_an_empty_or_malformed_events_file(tmp_path, pt_slurm, verb, text, words):
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "events.jsonl").write_text(text)
    refused(pt_slurm(verb, tmp_path, check=False), *words)


@pytest.mark.parametrize("verb", ["status", "logs", "cancel"])
def test_a_malformed_pipeline_record(tmp_path, pt_slurm, verb):
    (tmp_path / "pipeline.json").write_text('{"stages": 3')
    refused(pt_slurm(verb, tmp_path, check=False), "pipeline.json", "not a pipeline record")


def _config(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, args, words",
    [
        (None, [], ["config file not found"]),
        ("", [], ["missing required key 'run_name'"]),
        ("run_name: [a\n", [], ["run.yaml:", "invalid YAML"]),
        ("- a\n- b\n", [], ["expected a mapping"]),
        ("run_name: r\n", ["slurm.nodes=two"], ["override slurm.nodes", "'two'"]),
        ("run_name: r\n", ["slurm.nodes"], ["override 'slurm.nodes' has no '='"]),
        ("run_name: r\nslurm: {exclusive: maybe}\n", [], ["slurm.exclusive", "'maybe'"]),
        ("run_name: r\n", ["--stage", "bogus"], ["unknown stage 'bogus'"]),
        (
            "run_name: r\nslurm: {progress: ../x}\n",
            [],
            ["slurm.progress", "inside the run directory"],
        ),
        ("run_name: r\nslurm: {command: 'echo {input}'}\n", [], ["uses {input}"]),
        ("run_name: r\n", ["--stage", "train", "--stage", "train"], ["a stage is named twice"]),
    ],
)
def test_submit_of_a_config_that_cannot_run(tmp_path, pt_slurm, text, args, words):
    path = tmp_path / "absent.yaml" if text is None else _config(tmp_path, text)
    refused(pt_slurm("submit", path, *args, "--dry-run", check=False), *words)


def test_a_directory_given_as_the_config(tmp_path, pt_slurm):
    refused(pt_slurm("submit", tmp_path, check=False), "is a directory, not a config file")


@pytest.mark.parametrize(
    "stages, words",
    [
        ([{"name": "a", "stage": "bake"}], ["stages.0.stage", "'bake'"]),
        ([{"name": "a", "stage": "train"}], ["a train stage needs a config file"]),
        (
            [{"name": "a", "stage": "eval", "eval": {"benchmark": "b"}, "input": "later"}],
            ["input 'later' is not a stage before it"],
        ),
        (
            [{"name": "a", "stage": "data"}, {"name": "a", "stage": "data"}],
            ["two stages share a name"],
        ),
        ([{"name": "../up", "stage": "data"}], ["stages.0.name"]),
        ([], ["stages"]),
    ],
)
def test_a_pipeline_that_cannot_run(tmp_path, pt_slurm, stages, words):
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "output_dir": str(tmp_path), "stages": stages}))
    refused(pt_slurm("submit", path, "--dry-run", check=False), *words)


def test_a_pipeline_file_with_stage_flags(tmp_path, pt_slurm):
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "stages": [{"name": "a", "stage": "data"}]}))
    refused(pt_slurm("submit", path, "--stage", "eval", check=False), "--stage does not apply")


@pytest.mark.parametrize(
    "args, words",
    [
        (["status", ".", "--follw"], ["No such option: --follw"]),
        (["submit", "x.yaml", "--dry-rn"], ["No such option: --dry-rn"]),
        (["logs", ".", "--job"], ["--job", "requires an argument"]),
        (["cancel"], ["Missing argument"]),
        (["submitt", "x.yaml"], ["No such command 'submitt'"]),
    ],
)
def test_mistyped_flags_and_verbs(pt_slurm, args, words):
    refused(pt_slurm(*args, check=False), *words)


def test_logs_of_a_stage_of_a_single_run(tmp_path, pt_slurm):
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "events.jsonl").write_text('{"event":"submit"}\n')
    refused(pt_slurm("logs", tmp_path, "--stage", "x", check=False), "is a single run")


@pytest.mark.slurm
def test_status_cancel_and_logs_after_a_failed_sbatch(slurm_cluster, tmp_path, pt_slurm):
    """sbatch refuses the job (no such partition): submit says so; status says the run
    failed and why; cancel has nothing to cancel; logs has no job to show."""
    path = _config(
        tmp_path,
        f"run_name: r\noutput_dir: {tmp_path}\nslurm: {{partition: nosuch, command: 'true'}}\n",
    )
    line = refused(pt_slurm("submit", path, check=False), "sbatch")
    assert "invalid partition" in line.lower()
    run_dir = tmp_path / "r"

    status = pt_slurm("status", run_dir)
    info = json.loads(status.stdout)
    assert info["status"] == "failed" and info["job_id"] is None
    assert info["reason"].startswith("sbatch failed:")
    cancel = pt_slurm("cancel", run_dir)
    assert json.loads(cancel.stdout)["cancelled"] is False
    assert "nothing to cancel: failed (sbatch failed:" in cancel.stderr
    refused(pt_slurm("logs", run_dir, check=False), "has no job to show logs of")
