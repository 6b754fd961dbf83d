"""The decision a job makes when its step ends, and the bookkeeping around it."""

from __future__ import annotations

import json

import pytest
import yaml

from pt_core.contracts import REQUEUE_EXIT_CODE
from pt_core.errors import ConfigError
from pt_slurm import state
from pt_slurm.submit import freeze_config


@pytest.mark.parametrize(
    "status, failures, exit_code, signals, expected",
    [
        # finished: done, whatever came before
        ("running", 2, 0, [], ("done", "completed")),
        ("running", 0, 0, ["USR1"], ("done", "completed")),
        # the stage saved and asked to continue: a requeue, not a failure
        ("running", 0, REQUEUE_EXIT_CODE, [], ("requeue", "requeued")),
        ("running", 2, REQUEUE_EXIT_CODE, ["USR1"], ("requeue", "requeued")),
        # torchrun reports a rank's 85 as 1: after the early signal that is still a requeue
        ("running", 0, 1, ["USR1"], ("requeue", "requeued")),
        # scancel / wall time (SIGTERM) or pt-slurm cancel: stop even if the stage said 85
        ("running", 0, REQUEUE_EXIT_CODE, ["TERM"], ("stop", "stopped")),
        ("running", 0, 1, ["USR1", "TERM"], ("stop", "stopped")),
        ("cancelled", 0, REQUEUE_EXIT_CODE, ["TERM"], ("stop", "cancelled")),
        # real failures: retried while fewer than max_failures (3) have happened
        ("running", 0, 1, [], ("requeue", "retrying")),
        ("running", 1, 137, [], ("requeue", "retrying")),
        ("running", 2, 1, [], ("stop", "failed")),
    ],
)
def test_decide(status, failures, exit_code, signals, expected):
    st = {"status": status, "failures": failures, "max_failures": 3}
    action, new_status, why = state.decide(st, exit_code, signals)
    assert (action, new_status) == expected
    assert why  # the state file says why


def _submitted(tmp_path, max_failures=2, job_id="7"):
    state.begin_submission(tmp_path, stage="train", max_failures=max_failures, job_name="x")
    state.record_job_id(tmp_path, job_id)


def test_failures_count_up_and_a_success_resets_them(tmp_path):
    _submitted(tmp_path, max_failures=3)
    outcomes = []
    for code in (1, 1, 0):
        state.record_start(tmp_path, job_id="7", restart=len(outcomes))
        outcomes.append(state.record_end(tmp_path, exit_code=code))
        outcomes.append(state.read_state(tmp_path)["failures"])
    assert outcomes == ["requeue", 1, "requeue", 2, "done", 0]
    st = state.read_state(tmp_path)
    assert st["status"] == "completed" and [r["exit_code"] for r in st["runs"]] == [1, 1, 0]


def test_requeues_are_counted_apart_from_failures(tmp_path):
    _submitted(tmp_path, max_failures=1)
    state.record_start(tmp_path, job_id="7", restart=0)
    assert state.record_end(tmp_path, exit_code=REQUEUE_EXIT_CODE, signals=["USR1"]) == "requeue"
    state.record_start(tmp_path, job_id="7", restart=1)
    # with max_failures=1 the first real failure stops the job
    assert state.record_end(tmp_path, exit_code=1) == "stop"
    st = state.read_state(tmp_path)
    assert (st["requeues"], st["failures"], st["status"]) == (1, 1, "failed")


def test_a_new_submission_keeps_the_history_and_starts_failures_afresh(tmp_path):
    _submitted(tmp_path, max_failures=1)
    state.record_start(tmp_path, job_id="7", restart=0)
    state.record_end(tmp_path, exit_code=1)
    _submitted(tmp_path, max_failures=1, job_id="9")
    st = json.loads((tmp_path / "slurm" / "state.json").read_text())
    assert st["job_ids"] == ["7", "9"] and st["job_id"] == "9"
    assert st["failures"] == 0 and st["status"] == "submitted" and len(st["runs"]) == 1


def test_a_job_that_starts_before_sbatch_returns_stays_running(tmp_path):
    """sbatch can return after the job has already begun: the state file exists before
    sbatch, and the job id recorded afterwards does not undo the start."""
    state.begin_submission(tmp_path, stage="train", max_failures=3, job_name="x")
    state.record_start(tmp_path, job_id="11", restart=0)
    state.record_job_id(tmp_path, "11")
    st = state.read_state(tmp_path)
    assert st["status"] == "running" and st["job_ids"] == ["11"] and len(st["runs"]) == 1


def test_freeze_keeps_the_stage_copy_and_refuses_changed_values(tmp_path):
    given = {"run_name": "r", "training": {"learning_rate": 1e-5}, "slurm": {"nodes": 1}}
    freeze_config(tmp_path, given)
    # The stage rewrites config.yaml with its defaults filled in.
    stage_copy = {**given, "training": {"learning_rate": 1e-5, "max_grad_norm": 1.0}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(stage_copy))

    # Same values, new resources: the stage's copy stays, only slurm: changes.
    freeze_config(tmp_path, {**given, "slurm": {"nodes": 4}})
    frozen = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert frozen["training"] == {"learning_rate": 1e-5, "max_grad_norm": 1.0}
    assert frozen["slurm"] == {"nodes": 4}

    changed = {**given, "training": {"learning_rate": 3e-5}}
    with pytest.raises(ConfigError, match="training.learning_rate"):
        freeze_config(tmp_path, changed)
    freeze_config(tmp_path, changed, force=True)
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["training"] == {
        "learning_rate": 3e-5
    }
