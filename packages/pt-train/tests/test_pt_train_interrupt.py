"""Ctrl-C in `pt-train run`: the first SIGINT saves a checkpoint at the end of the step and
exits 130 with one line naming where the run resumes; a second one stops at once, without
saving, and the run resumes from its last complete checkpoint."""

from __future__ import annotations

import json
import signal
import time

import pytest
import yaml

from pt_core.errors import Interrupted

pytestmark = pytest.mark.slow

STEPS = 12


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_run_config):
    root = tmp_path_factory.mktemp("pt-train-interrupt")
    with open(root / "rows.jsonl", "w") as fh:
        for i in range(32):
            ids = [5 + (i * 7 + j) % 250 for j in range(12 + i % 9)]
            fh.write(json.dumps({"input_ids": ids, "labels": [-100] * 3 + ids[3:]}) + "\n")
    config = tiny_run_config(
        root / "runs",
        root / "rows.jsonl",
        {"name": "sft"},
        learning_rate=1e-3,
        global_batch_size=4,
        micro_batch_size=2,
        max_steps=STEPS,
        save_steps=2,
    )
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    return root


def losses(run_dir) -> list[float]:
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def latest(run_dir) -> str:
    return (run_dir / "checkpoints" / "latest").read_text().strip()


def wait_for(condition, run, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert run.proc.poll() is None, run.stderr()
        assert time.monotonic() < deadline, run.stderr()
        time.sleep(0.05)


def test_ctrl_c_saves_at_the_step_boundary_exits_130_and_the_rerun_resumes_exactly(
    workdir, pt_train_run
):
    """The stop is the SIGTERM stop (the step finishes, a full checkpoint is saved) with
    the shell's code for an interrupt and a line saying where the run goes on; the rerun
    ends with the losses of a run nobody interrupted."""
    code, _, err = pt_train_run(workdir / "train.yaml", "reference").finish()
    assert code == 0, err

    run = pt_train_run(workdir / "train.yaml", "ctrl-c")
    metrics = run.run_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, run)
    run.proc.send_signal(signal.SIGINT)
    code, out, err = run.finish()

    assert code == Interrupted.exit_code == 130
    assert out == ""  # no manifest: the run is not finished
    assert "Traceback" not in err
    stopped = latest(run.run_dir)
    step = int(stopped.split("-")[1])
    assert 3 <= step < STEPS
    assert (
        f"error: interrupted at step {step}: the same command resumes the run from "
        f"{run.run_dir / 'checkpoints' / stopped}" in err
    )
    assert "Ctrl-C again to stop at once" in err
    assert not list((run.run_dir / "checkpoints").glob(".tmp-*"))

    code, out, err = pt_train_run(workdir / "train.yaml", "ctrl-c").finish()
    assert code == 0, err
    assert json.loads(out)["step"] == STEPS
    assert losses(run.run_dir) == losses(workdir / "runs" / "reference")


def test_a_second_ctrl_c_stops_at_once_and_the_last_complete_checkpoint_stays_the_resume_point(
    workdir, pt_train_run
):
    """Step 5 (0-based) never ends (a test stall): the first SIGINT asks for a checkpoint at
    its end, which never comes; the second stops the run then and there. step-4 (save_steps
    2) is where the same command goes on."""
    run = pt_train_run(workdir / "train.yaml", "twice", stall="at=step,step=5,seconds=inf")
    wait_for(lambda: "stalls inf s at step 5" in run.stderr(), run)
    run.proc.send_signal(signal.SIGINT)
    wait_for(lambda: "Ctrl-C again" in run.stderr(), run)
    run.proc.send_signal(signal.SIGINT)
    code, out, err = run.finish(timeout=60)

    assert code == 130
    assert "Traceback" not in err
    assert (
        "error: interrupted again, without saving: the same command resumes the run from "
        f"{run.run_dir / 'checkpoints' / 'step-4'}" in err
    )
    assert latest(run.run_dir) == "step-4"
