"""`pt-slurm submit` of a real (tiny, CPU) pt-train run on the local SLURM, launched by
torchrun: it completes and leaves a full run dir; signalled mid-run it checkpoints,
requeues under the same job id, resumes and ends with the weights of an unsignalled run;
with one of its two ranks hung, the watchdog dumps both ranks' stacks and fails the job,
which is retried, resumes and ends with the weights of an unhung run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pt_slurm.state import read_state

pytest.importorskip("pt_train.trainer", reason="needs pt-train")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 40
PT_SLURM = os.path.join(os.path.dirname(sys.executable), "pt-slurm")


def _rows(n=40, vocab=300):
    """Deterministic tokenized rows (a linear congruential sequence, no RNG state)."""
    rows, x = [], 12345
    for i in range(n):
        x = (1103515245 * x + 12345) % 2**31
        length = 10 + x % 38
        ids = [5 + (x * (j + 7) + i) % (vocab - 5) for j in range(length)]
        rows.append({"input_ids": ids, "labels": ids})
    return rows


def _write_config(root: Path, tokenizer_dir: Path) -> Path:
    """The rows and the config (torchrun, one rank per node) the runs of this module share."""
    with open(root / "rows.jsonl", "w") as fh:
        for row in _rows():
            fh.write(json.dumps(row) + "\n")
    config = {
        "run_name": "reference",
        "output_dir": str(root / "runs"),
        "model": {
            "init": {
                "tokenizer": str(tokenizer_dir),
                "hidden_size": 128,
                "num_layers": 2,
                "num_heads": 2,
            }
        },
        "data": {"path": str(root / "rows.jsonl")},
        "training": {
            "learning_rate": 2e-3,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "max_steps": STEPS,
            "save_steps": 10,
        },
        "slurm": {
            "launcher": "torchrun",
            "signal_seconds": 60,
            "env": {"OMP_NUM_THREADS": 1, "DS_ACCELERATOR": "cpu"},
        },
    }
    path = root / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory, tiny_tokenizer_dir):
    """An unsignalled run and one signalled mid-run, submitted together."""
    path = _write_config(tmp_path_factory.mktemp("pt-slurm-train"), tiny_tokenizer_dir)
    jobs = {}
    for name in ("reference", "signalled"):
        proc = subprocess.run(
            [PT_SLURM, "submit", path, f"run_name={name}", f"slurm.job_name=pt-{name}"],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        jobs[name] = json.loads(proc.stdout)

    signalled = Path(jobs["signalled"]["path"])
    slurm_cluster.wait_until(
        lambda: len(_metrics(signalled)) >= 5, "the signalled run to train a few steps", 360
    )
    slurm_cluster.signal_batch(jobs["signalled"]["job_id"], "USR1")
    for manifest in jobs.values():
        slurm_cluster.wait_until(
            lambda m=manifest: _final(slurm_cluster, m), f"job {manifest['job_id']} to end", 360
        )
    return jobs


def _final(cluster, manifest) -> bool:
    st = read_state(manifest["path"])
    job = cluster.job(manifest["job_id"])
    return st["status"] in ("completed", "failed", "stopped") and job.get("JobState") in (
        "COMPLETED",
        "FAILED",
        "CANCELLED",
    )


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _state(run_dir: Path) -> dict:
    return read_state(run_dir)


def _weights(run_dir: Path, steps: int = STEPS) -> dict:
    return safetensors_numpy.load_file(
        run_dir / "inference" / f"step-{steps}" / "model.safetensors"
    )


def test_submitted_run_completes_with_config_script_logs_and_inference_checkpoint(
    runs, slurm_cluster
):
    run_dir, job_id = Path(runs["reference"]["path"]), runs["reference"]["job_id"]
    st = _state(run_dir)
    assert st["status"] == "completed" and st["requeues"] == 0 and st["failures"] == 0
    assert slurm_cluster.job(job_id)["JobState"] == "COMPLETED"
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["run_name"] == "reference"
    assert (run_dir / "slurm" / "job.sh").read_text().startswith("#!/bin/bash")
    out = (run_dir / "slurm" / f"slurm-{job_id}.out").read_text()
    assert (run_dir / "slurm" / f"slurm-{job_id}.err").exists()
    # pt-train's manifest, printed by rank 0 under torchrun, is in the job's stdout log
    # (after srun's node label and torchrun's rank prefix), and the job keeps it.
    line = next(x for x in out.splitlines() if x.startswith('0: [default0]:{"kind"'))
    manifest = json.loads(line.removeprefix("0: [default0]:"))
    assert manifest == json.loads((run_dir / "slurm" / "manifest.json").read_text())
    # and torchrun kept each rank's own log: one rank, one run
    (rank_log,) = (run_dir / "slurm" / "ranks").rglob("stdout.log")
    assert rank_log.is_relative_to(run_dir / "slurm" / "ranks" / f"{job_id}-0" / "node-0")
    assert json.loads(rank_log.read_text().splitlines()[-1]) == manifest
    assert manifest["kind"] == "checkpoint" and manifest["step"] == STEPS
    inference = run_dir / "inference" / f"step-{STEPS}"
    assert Path(manifest["path"]) == inference.resolve()
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (inference / name).exists(), name
    assert [m["step"] for m in _metrics(run_dir)] == list(range(1, STEPS + 1))
    status = subprocess.run([PT_SLURM, "status", run_dir], capture_output=True, text=True)
    info = json.loads(status.stdout)
    assert info["status"] == "completed" and info["last_metrics"]["step"] == STEPS


def test_signalled_run_requeues_once_resumes_and_ends_with_the_reference_weights(
    runs, slurm_cluster
):
    run_dir, job_id = Path(runs["signalled"]["path"]), runs["signalled"]["job_id"]
    st = _state(run_dir)
    assert st["status"] == "completed" and st["requeues"] == 1 and st["failures"] == 0
    assert st["job_ids"] == [job_id]
    assert [r["outcome"] for r in st["runs"]] == ["requeue", "done"]
    assert st["runs"][0]["signals"] == ["USR1"]
    # One job throughout: the same id ran twice, and SLURM knows no other job of the run.
    job = slurm_cluster.job(job_id)
    assert job["JobState"] == "COMPLETED" and job["Restarts"] == "1"
    assert slurm_cluster.job_ids_named("pt-signalled") == [job_id]
    assert {r["JobId"] for r in slurm_cluster.completions("pt-signalled")} == {job_id}

    # each line of the step carries srun's node label and torchrun's rank prefix
    err = "\n".join(
        x.removeprefix("0: [default0]:")
        for x in (run_dir / "slurm" / f"slurm-{job_id}.err").read_text().splitlines()
    )
    stopped = re.search(r"stopped by signal \S+ at step (\d+)", " ".join(err.split()))
    assert stopped, "pt-train did not report stopping on the signal"
    assert 0 < int(stopped.group(1)) < STEPS, "the signal should land mid-run"
    assert "resuming" in err

    ref, got = _weights(Path(runs["reference"]["path"])), _weights(run_dir)
    assert ref.keys() == got.keys()
    assert all((ref[k] == got[k]).all() for k in ref), "weights differ from the unsignalled run"
    assert [m["loss"] for m in _metrics(run_dir)] == [
        m["loss"] for m in _metrics(Path(runs["reference"]["path"]))
    ]


# ---------------------------------------------------------------- a hung rank

HANG_STEPS = 12  # each hang run's steps, a checkpoint every 5
HANG_AT = 7  # rank 1 sleeps before the 8th step; step-5 is the last checkpoint then


@pytest.fixture(scope="module")
def hang_runs(slurm_cluster, tmp_path_factory, tiny_tokenizer_dir):
    """Two 2-rank runs of 12 steps submitted together: one as it is, and one whose rank 1
    sleeps for ever before step 8 on its first attempt (the PT_TRAIN_TEST_STALL test hook,
    which stalls only while the run dir holds no stack dump), with the watchdog on (9 s)
    and checkpoints written in the background."""
    path = _write_config(tmp_path_factory.mktemp("pt-slurm-hang"), tiny_tokenizer_dir)
    stall = f"at=step,rank=1,step={HANG_AT},seconds=inf"
    jobs = {}
    for name, extra in (
        ("unhung", []),
        (
            "hung",
            [
                "training.watchdog_minutes=0.15",
                "training.async_save=true",
                f"slurm.env.PT_TRAIN_TEST_STALL={stall}",
            ],
        ),
    ):
        proc = subprocess.run(
            [
                PT_SLURM,
                "submit",
                path,
                f"run_name={name}",
                f"slurm.job_name=pt-{name}",
                "slurm.procs_per_node=2",
                f"training.max_steps={HANG_STEPS}",
                "training.save_steps=5",
                *extra,
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        jobs[name] = json.loads(proc.stdout)
    for manifest in jobs.values():
        slurm_cluster.wait_until(
            lambda m=manifest: _final(slurm_cluster, m), f"job {manifest['job_id']} to end", 840
        )
    return jobs


@pytest.mark.timeout(1800)
def test_a_hung_rank_ends_in_stack_dumps_and_a_retry_that_ends_with_the_unhung_weights(
    hang_runs, slurm_cluster
):
    run_dir, job_id = Path(hang_runs["hung"]["path"]), hang_runs["hung"]["job_id"]
    st = _state(run_dir)
    assert st["status"] == "completed", st
    # The first attempt failed (the watchdog's exit: neither done, bad input nor a
    # requeue asked for) and was retried under the same job id; the retry finished.
    assert [r["outcome"] for r in st["runs"]] == ["requeue", "done"], st["runs"]
    first = st["runs"][0]
    assert first["exit_code"] not in (0, 2, 85) and not first["signals"], first
    assert first["reason"].endswith("failure 1 of 3, retrying"), first["reason"]
    # torchrun exited 1; the ranks' own 86 reached the job through the exit-intent file
    assert first["reason"].startswith("the hang watchdog ended the step: exit 1 (a rank exited 86)")
    assert st["failures"] == 0 and st["job_ids"] == [job_id]
    assert slurm_cluster.job(job_id)["Restarts"] == "1"

    # Both ranks dumped their stacks: rank 1 asleep in the hook, rank 0 in the
    # all-reduce that waited for it.
    dumps = {p.name.split("-")[1]: p.read_text() for p in (run_dir / "hang").glob("rank-*.txt")}
    assert sorted(dumps) == ["0", "1"], sorted(dumps)
    assert all(f"after step {HANG_AT}" in text for text in dumps.values())
    assert re.search(r"watchdog\.py\", line \d+ in __call__", dumps["1"])
    assert re.search(r"distributed\.py\", line \d+ in all_reduce", dumps["0"])

    err = " ".join(
        x.split("]:", 1)[-1]
        for x in (run_dir / "slurm" / f"slurm-{job_id}.err").read_text().splitlines()
    )
    assert "watchdog: no optimizer step completed in 0.15 min" in " ".join(err.split())
    assert "from step-5 (step 5)" in " ".join(err.split())  # the retry resumed there

    reference = Path(hang_runs["unhung"]["path"])
    assert _state(reference)["status"] == "completed"
    assert [m["loss"] for m in _metrics(run_dir)] == [m["loss"] for m in _metrics(reference)]
    ref, got = _weights(reference, HANG_STEPS), _weights(run_dir, HANG_STEPS)
    assert ref.keys() == got.keys()
    assert all((ref[k] == got[k]).all() for k in ref), "weights differ from the unhung run"
