"""A three-stage pipeline on the local SLURM, on the quickstart's configs and a tiny
version of its data: pt-data build -> pt-train run -> pt-eval run, chained with afterok,
each stage taking the one before it's manifest. The train stage is signalled mid-run: it
alone requeues (under its own job id) and resumes; the eval stage waits for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pt_slurm.state import read_state

pytest.importorskip("pt_train.trainer", reason="needs pt-train")
pytest.importorskip("pt_rollout.generate", reason="the eval stage generates with pt-rollout")

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart"
BIN = Path(sys.executable).parent
STEPS = 30


@pytest.fixture(scope="module")
def pipeline(slurm_cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("pipeline")
    # The quickstart's first step, smaller: 64 training and 8 test problems, its tokenizer.
    for argv in (
        ["pt-data", "synth", "arithmetic", "--n", "64", "--n-test", "8", "--out", "synth"],
        ["pt-data", "tokenizer", "--texts", "synth/train.jsonl", "--out", "tokenizer"],
    ):
        subprocess.run([BIN / argv[0], *argv[1:]], cwd=work, check=True, capture_output=True)
    spec = {
        "name": "qs",
        "output_dir": "runs",
        "slurm": {"env": {"OMP_NUM_THREADS": 1, "DS_ACCELERATOR": "cpu", "HF_HUB_OFFLINE": 1}},
        "stages": [
            {"name": "data", "stage": "data", "config": str(QUICKSTART / "data.yaml")},
            {
                "name": "train",
                "stage": "train",
                "config": str(QUICKSTART / "sft.yaml"),
                "overrides": [
                    "training.num_epochs=null",
                    f"training.max_steps={STEPS}",
                    "training.save_steps=5",
                    "training.logging_steps=1",
                    "training.global_batch_size=4",
                    "training.micro_batch_size=4",
                    "model.init.num_layers=2",
                ],
                "slurm": {"signal_seconds": 60},
            },
            {
                "name": "eval",
                "stage": "eval",
                "eval": {
                    "benchmark": "synth/test.jsonl",
                    "n": 1,
                    "max_tokens": 12,
                    "temperature": 0,
                    "engine": "hf",
                },
            },
        ],
    }
    (work / "pipeline.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = subprocess.run(
        [BIN / "pt-slurm", "submit", "pipeline.yaml"], cwd=work, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(proc.stdout)
    root = Path(manifest["path"])
    jobs = {s["name"]: s["job_id"] for s in manifest["stages"]}

    metrics = root / "train" / "metrics.jsonl"
    slurm_cluster.wait_until(
        lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 4,
        "the train stage to train a few steps",
        timeout=300,
    )
    waiting = json.loads(
        subprocess.run([BIN / "pt-slurm", "status", root], capture_output=True, text=True).stdout
    )
    slurm_cluster.signal_batch(jobs["train"], "USR1")
    for name in ("data", "train", "eval"):
        slurm_cluster.wait_final(jobs[name], root / name, timeout=400)
    return {"root": root, "jobs": jobs, "manifest": manifest, "waiting": waiting, "work": work}


def _result(root: Path, name: str) -> dict:
    return json.loads((root / name / "slurm" / "manifest.json").read_text())


def test_the_stages_complete_in_order_each_taking_the_result_before_it(pipeline):
    root = pipeline["root"]
    states = {name: read_state(root / name) for name in ("data", "train", "eval")}
    assert {name: st["status"] for name, st in states.items()} == dict.fromkeys(states, "completed")
    # each stage started only after the one before it had finished for good
    assert states["data"]["runs"][-1]["ended_at"] <= states["train"]["runs"][0]["started_at"]
    assert states["train"]["runs"][-1]["ended_at"] <= states["eval"]["runs"][0]["started_at"]

    dataset, checkpoint, grades = (_result(root, n) for n in ("data", "train", "eval"))
    assert dataset["kind"] == "dataset"
    assert Path(dataset["path"]) == pipeline["work"] / "data" / "sft"  # the quickstart's output_dir
    # sft.yaml names no data: the train stage trained on what the data stage built
    assert "data" not in yaml.safe_load((QUICKSTART / "sft.yaml").read_text())
    assert checkpoint["kind"] == "checkpoint" and checkpoint["step"] == STEPS
    assert Path(checkpoint["path"]) == root / "train" / "inference" / f"step-{STEPS}"
    assert grades["kind"] == "grades" and grades["problems"] == 8 and grades["samples"] == 8
    assert grades["model"] == checkpoint["path"]  # the eval stage took the train stage's model


def test_a_signal_in_the_train_stage_requeues_only_that_stage(pipeline, slurm_cluster):
    root, jobs = pipeline["root"], pipeline["jobs"]
    train = read_state(root / "train")
    assert [r["outcome"] for r in train["runs"]] == ["requeue", "done"]
    assert train["runs"][0]["signals"] == ["USR1"] and train["requeues"] == 1
    assert slurm_cluster.job(jobs["train"])["Restarts"] == "1"
    for name in ("data", "eval"):
        assert [r["outcome"] for r in read_state(root / name)["runs"]] == ["done"]
        assert slurm_cluster.job(jobs[name])["Restarts"] == "0"
    assert len(set(jobs.values())) == 3
    # the train stage resumed: every step logged once, in order, through the requeue
    metrics = [json.loads(x) for x in (root / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))


def test_status_shows_the_chain(pipeline, cli):
    # while the train stage ran, the eval stage waited on it
    waiting = {s["name"]: s for s in pipeline["waiting"]["stages"]}
    assert (waiting["eval"]["slurm_state"], waiting["eval"]["slurm_reason"]) == (
        "PENDING",
        "Dependency",
    )
    proc = cli("pt-slurm", "status", pipeline["root"])
    info = json.loads(proc.stdout)
    assert info["status"] == "completed" and info["job_id"] == pipeline["jobs"]["eval"]
    assert [(s["name"], s["stage"], s["status"]) for s in info["stages"]] == [
        ("data", "data", "completed"),
        ("train", "train", "completed"),
        ("eval", "eval", "completed"),
    ]
    text = " ".join(proc.stderr.split())
    for name in ("data", "train", "eval"):
        assert f"{name}: job {pipeline['jobs'][name]}: completed (SLURM: COMPLETED)" in text
    assert "train: job" in text and "1 requeue(s) of at most 50" in text
